"""Simulating a traced step's memory: the ops run one after another in the
given order, each output allocated when its op runs (or written into an
input's buffer, `_in_place`, or sharing one, `aliases`) and freed after
its last reader. `_step_graph` traces the step and calls `_simulate` in its
views (the step, the update consuming each gradient, Grappler's);
`_gathered_liveness` in the orders a sharded step may run in."""

from __future__ import annotations

import tensorflow as tf

from tfmemopt.estimate._in_place import _reusable_input
from tfmemopt.estimate._last_reads import _last_reads
from tfmemopt.estimate._last_reads import _read_names
from tfmemopt.estimate._saved_activations import _ALIAS
from tfmemopt.estimate._saved_activations import _FREE
from tfmemopt.estimate._update_timing import _RUNS_IN_ITS_GAPS
from tfmemopt.estimate._update_timing import _runs_beside
from tfmemopt.estimate._update_timing import _starts
from tfmemopt.estimate._update_timing import _update_ends


def _at(peak, live, at_peak, holders) -> int:
    """The peak with `live` bytes allocated; `at_peak` (if given) takes
    the buffers held (`holders`) when `live` is a new peak."""
    if at_peak is not None and live > peak:
        at_peak.clear()
        at_peak.update(holders)
    return max(peak, live)


def _event_key(name, lists):
    """An event's key: `("list", name)` for a loop's TensorList."""
    return ("list", name) if name in lists else name


def _simulate(
    ops,
    outputs,
    size_of,
    aliases,
    scratch=None,
    events=None,
    consumed=None,
    at_peak=None,
    in_place=True,
    accumulated=(),
    spans=None,
    held=None,
    lingering=None,
    reads_gradient=None,
    rows_square=(),
):
    """Peak live bytes when `ops` run in order, freeing after last use.

    `aliases` maps a tensor to the tensor whose buffer it shares (a while
    loop's pass-through TensorLists), besides the ops in `_ALIAS`.
    `scratch(op)`: bytes the op's kernel holds on top while it runs.
    TensorFlow's executor runs ready ops on several inter-op threads: two
    ops that read the same tensor and do not read each other (the two
    gradients of a matmul or an einsum, both waiting for the same incoming
    gradient) run at once, so the scratch of the one before counts too.
    `in_place=False`: no output takes an input's buffer (Grappler's view).
    `accumulated`: names of sums (AddN) that Grappler rewrote into an
    accumulation (`_kernels.rewritten_sum_zeros`): the sum's buffer is
    made with its first input, and every input is added into it, and
    released, as soon as both are there.
    `spans`: op name -> (start, end) on the executor's threads
    (`_op_orders.executor_order`): an op's inputs are released when it
    ends, after the ops that start meanwhile.
    `held`: a weight's read -> `(variable, bytes)` when the weight is
    copied while the step reads it (`_update.decayed_early`): the reads
    of one variable share one buffer of its bytes, the old weight, freed
    after the last of them.
    `lingering`: a consumed gradient's name -> how long (`spans`' units)
    its update's temporaries stay allocated beside the ops that start
    meanwhile: until then, or until the next update has made its first
    temporary, unless that one is much smaller (`_RUNS_IN_ITS_GAPS`) and
    runs in its gaps (`_consumers.Consumer.runs`).
    `reads_gradient`: a consumed gradient's name -> how many of its
    update's temporaries are made while the update still reads it; its
    buffer is freed before the rest are made where nothing else reads it
    (`_consumers.Consumer.reads_gradient`).
    `rows_square`: the consumed gradients that are a sparse gradient's
    rows, whose update's first temporary is a new tensor of their size
    (Adam's `square(g)`): it is made once the op that made the rows has
    ended, and that op's inputs read by no later op are free by then (the
    executor clears an op's inputs before its successors run). Allocator
    traces on CPU, Adam: the held-out memory network at batch 192, two
    embeddings' rows (`Tile`, [115200, 64]) each beside its `adam/Square`
    at the step's peak; the hierarchical attention network, the rows'
    `adam/Square` made after the concatenation's pieces were freed.
    """
    return _Simulation(
        ops,
        outputs,
        size_of,
        aliases,
        scratch=scratch,
        events=events,
        consumed=consumed,
        at_peak=at_peak,
        in_place=in_place,
        accumulated=accumulated,
        spans=spans,
        held=held,
        lingering=lingering,
        reads_gradient=reads_gradient,
        rows_square=rows_square,
    ).run()


class _Simulation:
    """One run of `_simulate`: the buffers alive as the ops run, and the
    peak. Each method is one part of an op's turn: its outputs
    (`_output`), its kernel's scratch (`_scratch`), the updates of the
    gradients it makes (`_update`), the buffers it releases
    (`_release`)."""

    def __init__(
        self,
        ops,
        outputs,
        size_of,
        aliases,
        *,
        scratch,
        events,
        consumed,
        at_peak,
        in_place,
        accumulated,
        spans,
        held,
        lingering,
        reads_gradient,
        rows_square,
    ):
        # `_released_at` tells no spans (None) from empty ones.
        reads = _last_reads(ops, aliases, accumulated, spans)
        self.read, self.last, self.due, self.sums = reads
        self.ops, self.size_of, self.aliases = ops, size_of, aliases
        self.scratch, self.events, self.at_peak = scratch, events, at_peak
        self.in_place, self.rows_square = in_place, rows_square
        self.consumed = consumed or {}
        self.lingering = lingering or {}
        self.spans = spans or {}
        self.reads_gradient = reads_gradient or {}
        self.keep = {t.name for t in outputs if t.name not in self.consumed}
        self.buffer_of, self.size, self.holders = {}, {}, {}
        self.held, self.old_weight = held or {}, {}
        self.lists = set()
        self.live = self.peak = 0
        # (inputs, outputs, scratch) of the last op with scratch.
        self.sibling = None
        # (keys, bytes, index of the last op it runs beside, when it ends):
        # the lingering temporaries of the update that runs.
        self.running = None
        self.starts = _starts(ops, self.spans)

    def run(self) -> int:
        for i, op in enumerate(self.ops):
            for t in op.outputs:
                self._output(i, op, t)
            self._mark(self._scratch(i, op))
            done = [t for t in op.outputs if t.name in self.consumed]
            if any(t.name in self.rows_square for t in done):
                # The op has ended before the update of its rows starts.
                for name in _read_names(op.inputs, self.aliases):
                    freed = self._free_read(name, self.read.get(name) == i)
                    if freed:
                        self.live -= freed[1]
                        if self.events is not None and freed[1]:
                            self.events.append(freed[0])
            for t in done:
                self._update(i, op, t)
            if self.running and self.running[2] <= i:
                # No op that starts later meets it.
                self._end_running()
            self._release(i, done)
        if self.running:  # the last update ends with the step
            self._ended(self.running)
        return self.peak

    def _mark(self, extra=0):
        """Counts a peak with `extra` bytes on top of the live ones."""
        self.peak = _at(
            self.peak, self.live + extra, self.at_peak, self.holders
        )

    def _ended(self, update) -> int:
        """A lingering update's end: its temporaries freed in `events`;
        returns their bytes."""
        if self.events is not None:
            self.events.extend((k, None) for k in update[0])
        return update[1]

    def _end_running(self):
        self.live -= self._ended(self.running)
        self.running = None

    def _allocate(self, name, n, key=None):
        """A new buffer of `n` bytes for tensor `name`."""
        self.buffer_of[name] = name
        self.size[name] = n
        self.holders[name] = {name}
        if self.events is not None and n:
            self.events.append((key or name, n))
        self.live += n

    def _share(self, name, src):
        """Tensor `name` holds the buffer of `src`."""
        self.buffer_of[name] = src
        self.holders[src].add(name)

    def _free_read(self, name, last_read):
        """Frees the buffer `name` holds alone, read last now: returns
        `(its free event, its bytes)`, or None."""
        src = self.buffer_of.get(name)
        if (
            name in self.keep
            or not last_read
            or self.holders.get(src) != {name}
        ):
            return None
        del self.holders[src]
        n = self.size.pop(src)
        return (_event_key(src, self.lists), None), n

    def _output(self, i, op, t):
        """Output `t` of op `i`: a new buffer, a shared one, or none."""
        total = self.sums.get(t.name)
        if total is not None and total.name not in self.buffer_of:
            # A rewritten sum's buffer comes with its first input.
            self._allocate(total.name, self.size_of(total) or 0)
        if t.name in self.buffer_of:  # a rewritten sum, made before
            return
        if t.name not in self.last and t.name not in self.keep:
            if t.name not in self.consumed:
                return
        if t.name in self.held:  # a copied weight's read holds the old one
            variable, n = self.held[t.name]
            src = self.old_weight.get(variable)
            if src in self.holders:
                self._share(t.name, src)
                return
            self.old_weight[variable] = t.name
            self._allocate(t.name, n)
            return
        shared = self.aliases.get(t.name)
        if shared is None and op.type in _ALIAS and op.inputs:
            shared = op.inputs[0].name
        if shared is not None:
            src = self.buffer_of.get(shared)
            if src is not None and src in self.holders:
                self._share(t.name, src)
                return
        if op.type in _FREE:
            return
        n = self.size_of(t) or 0
        reused = None
        if self.in_place:
            reused = _reusable_input(
                op,
                i,
                n,
                self.read,
                self.keep,
                self.buffer_of,
                self.holders,
                self.size,
            )
        if reused is not None:
            self._share(t.name, reused)
            return
        if t.dtype == tf.variant:  # a loop's list: its elements
            self.lists.add(t.name)  # are allocated one by one
        self._allocate(t.name, n, _event_key(t.name, self.lists))

    def _scratch(self, i, op) -> int:
        """Bytes op `i`'s kernel holds on top while it runs (with those of
        a sibling that runs beside it)."""
        extra = self.scratch(op) if self.scratch else 0
        if extra:
            reads = {t.name for t in op.inputs if t.op.type not in _FREE}
            sibling = self.sibling
            if sibling and reads & sibling[0] and not reads & sibling[1]:
                extra += sibling[2]
            self.sibling = (
                reads,
                {t.name for t in op.outputs},
                self.scratch(op),
            )
            if self.events is not None:
                self.events += [(("scratch", i), extra), (("scratch", i), None)]
        return extra

    def _update(self, i, op, t):
        """The update that consumes gradient `t` as op `i` makes it: its
        temporaries, alone or beside the one still running."""
        temps = [n for n in self.consumed[t.name] if n]
        keys = [("update", t.name, j) for j in range(len(temps))]
        made = list(zip(keys, temps))
        ends_at = self.spans[op.name][1] if op.name in self.spans else -1
        if self.running and self.running[3] <= ends_at:
            self._end_running()  # it ended before this update starts
        if self.running and sum(temps) * _RUNS_IN_ITS_GAPS >= self.running[1]:
            # It runs on as this update makes its first temporary.
            self._mark(sum(temps[:1]))
            if self.events is not None:
                self.events += made[:1]
            self._end_running()
            made = made[1:]
        k = self.reads_gradient.get(t.name)
        beside = _runs_beside(
            self.ops, i, self.lingering.get(t.name, 0), self.spans, self.starts
        )
        if k is not None and k < len(temps) and beside:
            # Other ops run beside the update: its chains run one after
            # the other, and the gradient's last read comes early. Alone
            # (the backward pass over), they run at once on the threads.
            freed = self._free_read(t.name, self.last.get(t.name, i) == i)
            if freed:
                # The update's last read of the gradient is done: its
                # buffer is free before the later temporaries.
                self._mark(sum(temps[:k]))
                emitted = len(temps) - len(made)  # in its gaps, above
                head = made[: max(0, k - emitted)]
                if self.events is not None:
                    self.events += head + [freed[0]] * bool(freed[1])
                self.live -= freed[1]
                made = made[len(head) :]
        self._mark(sum(temps))
        if self.events is not None:
            self.events += made
        if self.lingering.get(t.name) and temps and not self.running:
            self.live += sum(temps)
            end = _update_ends(
                i, op, self.lingering[t.name], self.spans, self.starts
            )
            # The update reads a sparse gradient's rows while it runs:
            # they are freed with its temporaries.
            rows = t.name in self.rows_square and self._free_read(t.name, True)
            if rows:
                self.running = (keys + [rows[0][0]], sum(temps) + rows[1], *end)
            else:
                self.running = (keys, sum(temps), *end)
        elif self.events is not None:
            self.events += [(key, None) for key in keys]
        if t.name not in self.last:
            self.last[t.name] = i  # freed below, with the op's inputs

    def _release(self, i, done):
        """Frees the buffers whose last reader is op `i`."""
        for name in _read_names(done + self.due.pop(i, []), self.aliases):
            if self.last.get(name) != i or name in self.keep:
                continue
            src = self.buffer_of.get(name)
            if src is None or src not in self.holders:
                continue
            self.holders[src].discard(name)
            if not self.holders[src]:
                n = self.size.pop(src)
                self.live -= n
                del self.holders[src]
                if self.events is not None and n:
                    self.events.append((_event_key(src, self.lists), None))
