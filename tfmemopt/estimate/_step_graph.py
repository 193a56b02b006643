"""The graph of one training step, and the memory it needs over time.

`trace_step` traces forward + loss + `tape.gradient` of a built Keras model
into a `tf.function` graph at a fixed batch size (nothing is executed, no
activation memory is allocated; `_step_trace` traces and reads it), then:

- finds the activations kept for the backward pass: forward tensors that a
  gradient op reads (TensorFlow's own gradient functions decide this, so
  every op is covered: Dense, Conv, normalisation, Dropout masks, attention
  scores, embedding gathers, ...);
- attributes them to the layer whose name scope produced them;
- simulates the step in graph order with reference counts (a tensor is freed
  after its last reader; aliases such as Reshape share their input's
  buffer) to get the peak of live bytes.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfmemopt.estimate._dedup import duplicates
from tfmemopt.estimate._dedup import merged_ops
from tfmemopt.estimate._kept import _ALIAS
from tfmemopt.estimate._kept import _FREE
from tfmemopt.estimate._kept import _kept_for_backward
from tfmemopt.estimate._kept import _units_at
from tfmemopt.estimate._kernels import _einsum_copies
from tfmemopt.estimate._step_trace import _model_scope
from tfmemopt.estimate._step_trace import _nbytes
from tfmemopt.estimate._step_trace import _ops_that_run_in
from tfmemopt.estimate._step_trace import _path_function
from tfmemopt.estimate._step_trace import _size_function
from tfmemopt.estimate._step_trace import _source
from tfmemopt.estimate._step_trace import _sparse_rows
from tfmemopt.estimate._step_trace import _traced_step

# Element-wise kernels that write their output into an input's buffer when
# nothing else holds that input (`forward_input_or_allocate_output`):
# measured on CPU, the gradient of GlobalAveragePooling1D (Tile, then
# RealDiv) held one 128 MiB buffer, not two. The softmax cross-entropy
# kernels (`xent_op.cc`, `sparse_xent_op.cc`) write their second output,
# the gradient, into the logits' buffer the same way: in the allocator
# trace of a GPT-2 step (batch 32 x 128 tokens, 4000 words) the 62.5 MiB
# logits' chunk was the only one of that size at the peak.
_IN_PLACE = {
    "Abs",
    "Add",
    "AddN",
    "AddV2",
    "BiasAdd",
    "Div",
    "DivNoNan",
    "Elu",
    "EluGrad",
    "Erf",
    "Exp",
    "LeakyRelu",
    "LeakyReluGrad",
    "Log",
    "Maximum",
    "Minimum",
    "Mul",
    "Neg",
    "RealDiv",
    "Reciprocal",
    "Relu",
    "Relu6",
    "Relu6Grad",
    "ReluGrad",
    "Rsqrt",
    "RsqrtGrad",
    "Selu",
    "SeluGrad",
    "Sigmoid",
    "SigmoidGrad",
    "SoftmaxCrossEntropyWithLogits",
    "Softplus",
    "SparseSoftmaxCrossEntropyWithLogits",
    "Sqrt",
    "Square",
    "SquaredDifference",
    "Sub",
    "Tanh",
    "TanhGrad",
}


@dataclasses.dataclass
class StepGraph:
    """What one traced training step holds (bytes)."""

    peak: int
    inputs: int
    saved: int
    gradients: int
    # (layer path, bytes kept for backward) in forward order.
    saved_by_layer: list
    # depth -> (units in forward order, saved bytes per unit, bytes of
    # each unit's output read by later units): the candidate segments.
    segments: dict
    # Layers with kept tensors of unknown size (while loops, dynamic shapes).
    unknown: list
    # Trainable-variable index -> bytes of its sparse gradient's rows
    # (values and indices) when the gradient is a `tf.IndexedSlices`.
    sparse_rows: dict = dataclasses.field(default_factory=dict)
    # The same, bytes of the rows' values alone.
    sparse_values: dict = dataclasses.field(default_factory=dict)
    # Bytes of each input (and target) tensor, every one counted.
    input_sizes: list = dataclasses.field(default_factory=list)
    # The simulated step's allocations in order (`_simulate`'s `events`).
    events: list = dataclasses.field(default_factory=list)
    # Peak when each gradient is consumed as it is made (`update`), or None.
    updating_peak: int | None = None
    # Bytes of each sum of 3 or more gradients (AddN) that has an input
    # alive at the peak.
    sums_at_peak: list = dataclasses.field(default_factory=list)
    # The step's peak as Grappler's static memory estimate sees it (every
    # tensor counted, none written into an input's buffer): what its
    # memory optimizer compares with the device's memory (0: not simulated,
    # `min_counted_bytes` is 0).
    grappler_peak: int = 0


def trace_step(
    model,
    batch_size: int,
    activation_itemsize: int | None = None,
    input_shape=None,
    sequence_length=None,
    min_counted_bytes: int = 0,
    update=None,
    owner=None,
    loss=None,
) -> StepGraph:
    """Traces one training step of `model` at `batch_size` and measures it.

    Args:
        model: a built Keras model.
        batch_size: Int, the batch the step sees (per replica, per micro-
            batch).
        activation_itemsize: optional Int: bytes per element of the
            model's floating activations (and their gradients) under another
            dtype policy; weight gradients and the loss keep their dtype.
        input_shape, sequence_length, min_counted_bytes: as for
            `estimate_memory` (tensors below `min_counted_bytes` count 0).
        update: optional callable: the model's trainable variables -> a
            list, per variable, of the sizes of the temporaries that consume
            its gradient as soon as it is made (`[]`: consumed in place);
            the step is then also simulated so (`updating_peak`; `events`
            are from that run).
        owner: optional model whose long-sequence options
            (`enable_long_sequences`) apply: its chunked loss is traced
            from the head's input (`head_of`), as `tfmemopt.Model`'s step
            computes it.
        loss: optional loss the step computes (a Keras loss or its name);
            by default the owner's or the model's compiled loss, else mean
            squared error.
    """
    concrete, n_fwd, loss = _traced_step(
        model, batch_size, input_shape, sequence_length, owner, loss
    )
    ops, n_fwd = _ops_that_run_in(concrete, n_fwd, loss)
    # Grappler merges identical ops: one buffer for each set, and the
    # merged-away ops do not run (their readers read the one kept).
    fwd_names = {op.name for op in ops[:n_fwd]}
    same = duplicates(ops, fwd_names)
    merged = merged_ops(same)
    run = [op for op in ops if op.name not in merged]
    path_of = _path_function(model)
    model_scope = _model_scope(model, ops[:n_fwd], path_of)
    size_of, aliases = _size_function(
        concrete, model, model_scope, activation_itemsize, min_counted_bytes
    )
    aliases = {**aliases, **same}
    saved_by_layer, unknown = _kept_for_backward(
        ops[n_fwd:], fwd_names, path_of, size_of, same
    )
    segments = {
        depth: _units_at(
            depth, ops[:n_fwd], model_scope, path_of, saved_by_layer, size_of
        )
        for depth in (1, 2, 3)
    }
    outputs = list(concrete.graph.outputs)

    def scratch(op):
        return _scratch(op, size_of, min_counted_bytes)

    events, alive = [], set()
    peak = _simulate(
        run,
        outputs,
        size_of,
        aliases,
        scratch,
        events=None if update is not None else events,
        at_peak=alive,
    )
    updating_peak = None
    if update is not None:
        updating_peak = _simulate_updating(
            model, concrete, run, size_of, aliases, scratch, update, events
        )

    # Grappler's own estimate (`GraphMemory::InferStatically`) counts every
    # tensor and forwards no input buffer: its peak decides whether its
    # memory optimizer rewrites the gradient sums. Only the CPU statistics'
    # view (`min_counted_bytes`) models that rewrite: 0 elsewhere.
    grappler_peak = 0
    if min_counted_bytes:
        whole_size, whole_aliases = _size_function(
            concrete, model, model_scope, activation_itemsize, 0
        )
        grappler_peak = _simulate(
            run, outputs, whole_size, {**whole_aliases, **same}, in_place=False
        )

    def counted(n):
        return 0 if n < min_counted_bytes else n

    input_sizes = [_nbytes(t) or 0 for t in concrete.graph.inputs]
    return StepGraph(
        peak=peak,
        inputs=sum(counted(n) for n in input_sizes),
        saved=sum(n for _, n in saved_by_layer),
        gradients=sum(counted(_nbytes(t) or 0) for t in outputs),
        saved_by_layer=saved_by_layer,
        segments=segments,
        unknown=unknown,
        sparse_rows=_sparse_rows(concrete),
        sparse_values=_sparse_rows(concrete, values_only=True),
        input_sizes=input_sizes,
        events=events,
        updating_peak=updating_peak,
        sums_at_peak=_sums_with_input_in(ops, alive, size_of),
        grappler_peak=grappler_peak,
    )


def _simulate_updating(
    model, concrete, ops, size_of, aliases, scratch, update, events
):
    """The step's peak when each gradient is consumed as soon as it is made.

    The function's outputs are Identity ops at its end: the update reads the
    gradient they pass on. `update` gives, per trainable variable, the sizes
    of the temporaries that consume its gradient; `events` are filled from
    this run."""
    consumed = {}
    temps_of = update(model.trainable_variables)
    for g, temps in zip(concrete.structured_outputs, temps_of):
        g = getattr(g, "values", g)  # a sparse gradient's rows
        if g is not None:
            consumed[_source(g).name] = temps
    outputs = list(concrete.graph.outputs)
    ends = {t.op.name for t in outputs if _source(t).name != t.name}
    return _simulate(
        [op for op in ops if op.name not in ends],
        [_source(t) for t in outputs],
        size_of,
        aliases,
        scratch,
        events=events,
        consumed=consumed,
    )


def _sums_with_input_in(ops, alive, size_of) -> list:
    """Bytes of each sum of 3 or more gradients with an input in `alive`."""
    return [
        size_of(op.outputs[0]) or 0
        for op in ops
        if op.type == "AddN"
        and len(op.inputs) > 2
        and any(t.name in alive for t in op.inputs)
    ]


def _scratch(op, size_of, floor=0) -> int:
    """Bytes an op allocates inside its kernel, freed when it returns."""
    if op.type != "Einsum" or len(op.inputs) != 2:
        return 0
    try:
        equation = op.get_attr("equation")
    except ValueError:
        return 0
    if isinstance(equation, bytes):
        equation = equation.decode()
    copies = _einsum_copies(equation)
    if copies is None:
        return 0
    copied, out_copied = copies
    sizes = [size_of(t) or 0 for t, c in zip(op.inputs, copied) if c] + (
        [size_of(op.outputs[0]) or 0] if out_copied else []
    )
    return sum(n for n in sizes if n >= floor)


def _reusable_input(op, i, n, last, keep, buffer_of, holders, size):
    """The buffer an element-wise op `i` writes its output into, or None:
    an input of the same size that only this op reads and nothing else
    holds (not a graph input, a variable or a kept output), the first such
    in input order (`forward_input_or_allocate_output` tries each
    candidate: the gradient of a softmax cross-entropy, `Mul` of the
    broadcast loss gradient and the kernel's 62.5 MiB gradient, took the
    latter's buffer; the first, smaller input was taken and the output
    counted anew). An input with several readers is not taken: the
    executor runs ready ops on several threads, so another reader may
    still hold it when this op runs."""
    if op.type not in _IN_PLACE or not n:
        return None
    for u in op.inputs:
        if last.get(u.name) != i or u.name in keep:
            continue
        if len(u.consumers()) != 1:
            continue
        if u.op.type in ("Placeholder", "ReadVariableOp", "Const"):
            continue
        src = buffer_of.get(u.name)
        if src is not None and holders.get(src) == {u.name}:
            if size.get(src) == n:
                return src
    return None


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
    """
    last = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            last[t.name] = i
            name = t.name
            while name in aliases:  # its buffer is read here too
                name = aliases[name]
                last[name] = i
    consumed = consumed or {}
    keep = {t.name for t in outputs if t.name not in consumed}
    buffer_of, size, holders = {}, {}, {}
    lists = set()
    live = peak = 0
    sibling = None  # (inputs, outputs, scratch) of the last op with scratch
    for i, op in enumerate(ops):
        for t in op.outputs:
            if t.name not in last and t.name not in keep:
                if t.name not in consumed:
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
                    op, i, n, last, keep, buffer_of, holders, size
                )
            if reused is not None:
                buffer_of[t.name] = reused
                holders[reused].add(t.name)
                continue
            buffer_of[t.name] = t.name
            size[t.name] = n
            holders[t.name] = {t.name}
            live += n
            if events is not None and n:
                if t.dtype == tf.variant:  # a loop's list: its elements
                    lists.add(t.name)  # are allocated one by one
                events.append((_event_key(t.name, lists), n))
        extra = scratch(op) if scratch else 0
        if extra:
            reads = {t.name for t in op.inputs if t.op.type not in _FREE}
            if sibling and reads & sibling[0] and not reads & sibling[1]:
                extra += sibling[2]
            sibling = (reads, {t.name for t in op.outputs}, scratch(op))
            if events is not None:
                events += [(("scratch", i), extra), (("scratch", i), None)]
        if at_peak is not None and live + extra > peak:
            at_peak.clear()
            at_peak.update(holders)
        peak = max(peak, live + extra)
        done = [t for t in op.outputs if t.name in consumed]
        for t in done:
            temps = [n for n in consumed[t.name] if n]
            peak = max(peak, live + sum(temps))
            if events is not None:
                keys = [("update", t.name, j) for j in range(len(temps))]
                events += list(zip(keys, temps)) + [(k, None) for k in keys]
            if t.name not in last:
                last[t.name] = i  # freed below, with the op's inputs
        for name in _read_names(list(op.inputs) + done, aliases):
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
    return peak
