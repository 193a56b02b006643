"""Simulating a traced step's memory: the ops run one after another in the
given order, each output allocated when its op runs (or written into an
input's buffer, `_in_place`, or sharing one, `aliases`) and freed after
its last reader. `_step_graph` traces the step and calls `_simulate` in its
views (the step, the update consuming each gradient, Grappler's);
`_gathered_liveness` in the orders a sharded step may run in."""

from __future__ import annotations

import bisect

import tensorflow as tf

from tfmemopt.estimate._in_place import _reusable_input
from tfmemopt.estimate._saved_activations import _ALIAS
from tfmemopt.estimate._saved_activations import _FREE
from tfmemopt.estimate._update_timing import _RUNS_IN_ITS_GAPS
from tfmemopt.estimate._update_timing import _runs_beside
from tfmemopt.estimate._update_timing import _starts
from tfmemopt.estimate._update_timing import _update_ends


def _read_names(tensors, aliases):
    """The names an op's reads release: each tensor's, and those of the
    tensors whose buffer it shares (`aliases`, followed to the end)."""
    names = []
    for t in tensors:
        name = t.name
        names.append(name)
        while name in aliases:
            name = aliases[name]
            names.append(name)
    return names


def _released_at(ops, spans):
    """Per op, the index of the op after which its inputs are released:
    the last op that starts before it ends (`spans`: op name -> (start,
    end), from `_op_orders.executor_order`). An op's inputs are read until
    it ends; ops that start meanwhile, on another thread, allocate beside
    them. Without `spans`, each op's own index."""
    if spans is None:
        return list(range(len(ops)))
    starts = _starts(ops, spans)
    out = []
    for i, op in enumerate(ops):
        end = spans[op.name][1] if op.name in spans else starts[i]
        out.append(max(i, bisect.bisect_left(starts, end) - 1))
    return out


def _last_reads(ops, aliases, accumulated, spans):
    """When each tensor's buffer is read last and released.

    Returns `(read, last, due, sums)`: tensor name -> index of the last op
    that reads it (`read`: when an element-wise op may write into it) and
    index after which it is released (`last`); index -> the tensors
    released there (`due`); tensor name -> the rewritten sum whose buffer
    is made with it (`sums`).
    """
    released = _released_at(ops, spans)
    read, last, due, made = {}, {}, {}, {}
    sums = {}
    for i, op in enumerate(ops):
        for t in op.outputs:
            made[t.name] = i
        at, free = i, released[i]
        for t in op.inputs:
            if op.name in accumulated:
                # Grappler's rewrite: the sum's variable is initialised
                # after its first input (`min_input_id`: the earliest in its
                # static schedule; a tie is the first); each input is added
                # when both are there.
                first = op.inputs[0].name
                sums.setdefault(first, op.outputs[0])
                at = free = max(made.get(t.name, i), made.get(first, i))
            due.setdefault(free, []).append(t)
            name = t.name
            while True:  # its buffer is read here too
                read[name] = max(read.get(name, -1), at)
                last[name] = max(last.get(name, -1), free)
                if name not in aliases:
                    break
                name = aliases[name]
    return read, last, due, sums


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
    read, last, due, sums = _last_reads(ops, aliases, accumulated, spans)
    consumed, lingering, spans = consumed or {}, lingering or {}, spans or {}
    reads_gradient = reads_gradient or {}
    keep = {t.name for t in outputs if t.name not in consumed}
    buffer_of, size, holders = {}, {}, {}
    held, old_weight = held or {}, {}
    lists = set()
    live = peak = 0
    sibling = None  # (inputs, outputs, scratch) of the last op with scratch
    # (keys, bytes, index of the last op it runs beside, when it ends):
    # the lingering temporaries of the update that runs.
    running = None
    starts = _starts(ops, spans)

    def ended(update) -> int:
        """A lingering update's end: its temporaries freed in `events`;
        returns their bytes."""
        if events is not None:
            events.extend((k, None) for k in update[0])
        return update[1]

    def allocate(name, n, key=None) -> int:
        """A new buffer of `n` bytes for tensor `name`; returns `n`."""
        buffer_of[name] = name
        size[name] = n
        holders[name] = {name}
        if events is not None and n:
            events.append((key or name, n))
        return n

    def _free_read(name, last_read):
        """Frees the buffer `name` holds alone, read last now: returns
        `(its free event, its bytes)`, or None."""
        src = buffer_of.get(name)
        if name in keep or not last_read or holders.get(src) != {name}:
            return None
        del holders[src]
        n = size.pop(src)
        return (_event_key(src, lists), None), n

    for i, op in enumerate(ops):
        for t in op.outputs:
            total = sums.get(t.name)
            if total is not None and total.name not in buffer_of:
                # A rewritten sum's buffer comes with its first input.
                live += allocate(total.name, size_of(total) or 0)
            if t.name in buffer_of:  # a rewritten sum, made before
                continue
            if t.name not in last and t.name not in keep:
                if t.name not in consumed:
                    continue
            if t.name in held:  # a copied weight's read holds the old one
                variable, n = held[t.name]
                src = old_weight.get(variable)
                if src in holders:
                    buffer_of[t.name] = src
                    holders[src].add(t.name)
                    continue
                old_weight[variable] = t.name
                live += allocate(t.name, n)
                continue
            shared = aliases.get(t.name)
            if shared is None and op.type in _ALIAS and op.inputs:
                shared = op.inputs[0].name
            if shared is not None:
                src = buffer_of.get(shared)
                if src is not None and src in holders:
                    buffer_of[t.name] = src
                    holders[src].add(t.name)
                    continue
            if op.type in _FREE:
                continue
            n = size_of(t) or 0
            reused = None
            if in_place:
                reused = _reusable_input(
                    op, i, n, read, keep, buffer_of, holders, size
                )
            if reused is not None:
                buffer_of[t.name] = reused
                holders[reused].add(t.name)
                continue
            if t.dtype == tf.variant:  # a loop's list: its elements
                lists.add(t.name)  # are allocated one by one
            live += allocate(t.name, n, _event_key(t.name, lists))
        extra = scratch(op) if scratch else 0
        if extra:
            reads = {t.name for t in op.inputs if t.op.type not in _FREE}
            if sibling and reads & sibling[0] and not reads & sibling[1]:
                extra += sibling[2]
            sibling = (reads, {t.name for t in op.outputs}, scratch(op))
            if events is not None:
                events += [(("scratch", i), extra), (("scratch", i), None)]
        peak = _at(peak, live + extra, at_peak, holders)
        done = [t for t in op.outputs if t.name in consumed]
        if any(t.name in rows_square for t in done):
            # The op has ended before the update of its rows starts.
            for name in _read_names(op.inputs, aliases):
                freed = _free_read(name, read.get(name) == i)
                if freed:
                    live -= freed[1]
                    if events is not None and freed[1]:
                        events.append(freed[0])
        for t in done:
            temps = [n for n in consumed[t.name] if n]
            keys = [("update", t.name, j) for j in range(len(temps))]
            made = list(zip(keys, temps))
            ends_at = spans[op.name][1] if op.name in spans else -1
            if running and running[3] <= ends_at:
                # It ended before this update starts.
                live, running = live - ended(running), None
            if running and sum(temps) * _RUNS_IN_ITS_GAPS >= running[1]:
                # It runs on as this update makes its first temporary.
                peak = _at(peak, live + sum(temps[:1]), at_peak, holders)
                if events is not None:
                    events += made[:1]
                live, running, made = live - ended(running), None, made[1:]
            k = reads_gradient.get(t.name)
            beside = _runs_beside(
                ops, i, lingering.get(t.name, 0), spans, starts
            )
            if k is not None and k < len(temps) and beside:
                # Other ops run beside the update: its chains run one after
                # the other, and the gradient's last read comes early. Alone
                # (the backward pass over), they run at once on the threads.
                freed = _free_read(t.name, last.get(t.name, i) == i)
                if freed:
                    # The update's last read of the gradient is done: its
                    # buffer is free before the later temporaries.
                    peak = _at(peak, live + sum(temps[:k]), at_peak, holders)
                    emitted = len(temps) - len(made)  # in its gaps, above
                    head = made[: max(0, k - emitted)]
                    if events is not None:
                        events += head + [freed[0]] * bool(freed[1])
                    live, made = live - freed[1], made[len(head) :]
            peak = _at(peak, live + sum(temps), at_peak, holders)
            if events is not None:
                events += made
            if lingering.get(t.name) and temps and not running:
                live += sum(temps)
                end = _update_ends(i, op, lingering[t.name], spans, starts)
                # The update reads a sparse gradient's rows while it runs:
                # they are freed with its temporaries.
                rows = t.name in rows_square and _free_read(t.name, True)
                if rows:
                    running = (keys + [rows[0][0]], sum(temps) + rows[1], *end)
                else:
                    running = (keys, sum(temps), *end)
            elif events is not None:
                events += [(k, None) for k in keys]
            if t.name not in last:
                last[t.name] = i  # freed below, with the op's inputs
        if running and running[2] <= i:  # no op that starts later meets it
            live, running = live - ended(running), None
        for name in _read_names(done + due.pop(i, []), aliases):
            if last.get(name) != i or name in keep:
                continue
            src = buffer_of.get(name)
            if src is None or src not in holders:
                continue
            holders[src].discard(name)
            if not holders[src]:
                n = size.pop(src)
                live -= n
                del holders[src]
                if events is not None and n:
                    events.append((_event_key(src, lists), None))
    if running:  # the last update ends with the step
        ended(running)
    return peak
