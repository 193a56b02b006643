"""The graph of one training step, and the memory it needs over time.

`trace_step` traces forward + loss + `tape.gradient` of a built Keras model
into a `tf.function` graph at a fixed batch size (nothing is executed, no
activation memory is allocated), then:

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
import math
import re

import keras
import tensorflow as tf

from tfmemopt._compat import sublayers
from tfmemopt.estimate._input_specs import _as_call_arg
from tfmemopt.estimate._input_specs import _loss_and_target_specs
from tfmemopt.estimate._input_specs import input_specs
from tfmemopt.estimate._kept import _ALIAS
from tfmemopt.estimate._kept import _FREE
from tfmemopt.estimate._kept import _kept_for_backward
from tfmemopt.estimate._kept import _units_at
from tfmemopt.estimate._kernels import _einsum_copies
from tfmemopt.estimate._while_loops import while_loop_sizes
from tfmemopt.longseq._takeover import head_of
from tfmemopt.longseq._takeover import training_forward

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
_SUFFIX = re.compile(r"_\d+$")


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
    # Bytes of each input (and target) tensor, every one counted.
    input_sizes: list = dataclasses.field(default_factory=list)
    # The simulated step's allocations in order (`_simulate`'s `events`).
    events: list = dataclasses.field(default_factory=list)
    # Peak when each gradient is consumed as it is made (`update`), or None.
    updating_peak: int | None = None
    # Bytes of each sum of 3 or more gradients (AddN) that has an input
    # alive at the peak.
    sums_at_peak: list = dataclasses.field(default_factory=list)


def _nbytes(t, scale=None) -> int | None:
    if t.dtype in (tf.resource, tf.variant):
        return None
    shape = t.shape
    if shape.rank is None or any(d is None for d in shape.as_list()):
        return None
    n = math.prod(shape.as_list()) * t.dtype.size
    if scale is not None:
        n = int(n * scale(t))
    return n


def _all_layer_names(model) -> set:
    return {layer.name for layer in sublayers(model, include_self=True)}


def _layer_of(component: str, names: set) -> str:
    """Scope names are uniquified (`dense_1_2`); map back to a layer name.

    In a fresh `tf.function` graph each Keras layer scope carries one extra
    `_N` suffix (layer `dense` -> scope `dense_1`, `dense_1` -> `dense_1_2`),
    so one suffix is stripped first.
    """
    once = _SUFFIX.sub("", component)
    if once != component and once in names:
        return once
    name = component
    while name not in names and _SUFFIX.search(name):
        name = _SUFFIX.sub("", name)
    return name if name in names else component


def trace_step(
    model,
    batch_size: int,
    activation_itemsize: int | None = None,
    input_shape=None,
    sequence_length=None,
    min_counted_bytes: int = 0,
    update=None,
    owner=None,
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
    """
    concrete, n_fwd, loss = _traced_step(
        model, batch_size, input_shape, sequence_length, owner
    )
    ops, n_fwd = _ops_that_run_in(concrete, n_fwd, loss)
    fwd_names = {op.name for op in ops[:n_fwd]}
    path_of = _path_function(model)
    model_scope = _model_scope(model, ops[:n_fwd], path_of)
    size_of, aliases = _size_function(
        concrete, model, model_scope, activation_itemsize, min_counted_bytes
    )
    saved_by_layer, unknown = _kept_for_backward(
        ops[n_fwd:], fwd_names, path_of, size_of
    )
    segments = {
        depth: _units_at(
            depth, ops[:n_fwd], model_scope, path_of, saved_by_layer, size_of
        )
        for depth in (1, 2)
    }
    outputs = list(concrete.graph.outputs)

    def scratch(op):
        return _scratch(op, size_of, min_counted_bytes)

    events, alive = [], set()
    peak = _simulate(
        ops,
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
            model, concrete, ops, size_of, aliases, scratch, update, events
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
        input_sizes=input_sizes,
        events=events,
        updating_peak=updating_peak,
        sums_at_peak=_sums_with_input_in(ops, alive, size_of),
    )


def _ops_that_run_in(concrete, n_fwd: int, loss: str):
    """The step's ops that run (in graph order), and how many are forward.

    The loss runs too: the train step reports it."""
    all_ops = concrete.graph.get_operations()
    roots = [concrete.graph.get_operation_by_name(loss)]
    run = _ops_that_run(all_ops, concrete.graph.outputs, roots)
    ops = [op for op in all_ops if op.name in run]
    return ops, sum(1 for op in all_ops[:n_fwd] if op.name in run)


def _path_function(model):
    """op name -> the path of layer names whose scopes it ran in."""
    names = _all_layer_names(model)

    def path_of(op_name):
        parts = op_name.split("/")[:-1]
        return tuple(_layer_of(p, names) for p in parts)

    return path_of


def _model_scope(model, forward_ops, path_of):
    """The (uniquified) name scope the model's own call ran in, or None."""
    for op in forward_ops:
        parts = path_of(op.name)
        if parts and parts[0] == model.name:
            return op.name.split("/")[0]
    return None


def _size_function(
    concrete, model, model_scope, activation_itemsize, min_counted_bytes
):
    """`(size_of, aliases)`: tensor -> the bytes it is counted at.

    Under another dtype policy (`activation_itemsize`) the model's floating
    activations and their gradients are rescaled; the function's outputs
    (weight gradients) are not. A loop's TensorList is sized from the loop
    (`while_loop_sizes`); `aliases` maps a loop's pass-through list to its
    source. Tensors below `min_counted_bytes` count 0.
    """
    out_names = {t.name for t in concrete.graph.outputs}
    compute = tf.as_dtype(keras.backend.standardize_dtype(model.compute_dtype))
    scopes = (model_scope + "/", "gradient_tape/" + str(model_scope) + "/")

    def scale(t, dtype=None):
        if (
            activation_itemsize is None
            or (dtype or t.dtype) != compute
            or t.name in out_names
            or not t.op.name.startswith(scopes)
        ):
            return 1.0
        return activation_itemsize / (dtype or t.dtype).size

    graph = concrete.graph
    lists, aliases = while_loop_sizes(
        graph.get_operations(), graph.as_graph_def()
    )

    def size_of(t):
        while t.name in aliases:  # a loop's pass-through list
            t = graph.get_tensor_by_name(aliases[t.name])
        if t.name in lists:
            # Its elements are allocated one by one: each below the floor
            # is not counted.
            n, dtype, shared, each = lists[t.name]
            if shared or int(each * scale(t, dtype)) < min_counted_bytes:
                return 0
            return int(n * scale(t, dtype))
        n = _nbytes(t, scale)
        return 0 if n is not None and n < min_counted_bytes else n

    return size_of, aliases


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


def _sparse_rows(concrete) -> dict:
    """Variable index -> bytes of its sparse gradient's values and indices."""
    return {
        i: (_nbytes(g.values) or 0) + (_nbytes(g.indices) or 0)
        for i, g in enumerate(concrete.structured_outputs)
        if isinstance(g, tf.IndexedSlices)
    }


def _traced_step(
    model, batch_size: int, input_shape=None, sequence_length=None, owner=None
):
    """`(concrete function, forward op count)` of one gradient step."""
    in_specs = input_specs(model, batch_size, input_shape, sequence_length)
    # A tfmemopt.Model.wrap is compiled, the model it wraps maybe not.
    loss_fn, y_specs = _loss_and_target_specs(
        model, batch_size, in_specs, getattr(owner, "loss", None)
    )
    mark = {}

    def step(x, y):
        with tf.GradientTape() as tape, training_forward(owner):
            pred = model(_as_call_arg(x), training=True)
            preds = pred if isinstance(pred, (list, tuple)) else [pred]
            loss = 0.0
            for p, t in zip(preds, y):
                head = head_of(p) if owner is not None else None
                if head is None:
                    loss = loss + loss_fn(t, p)
                else:  # the chunked loss, from the head's input
                    loss = loss + tf.reduce_mean(head.token_losses(loss_fn, t))
        mark["forward"] = len(tf.compat.v1.get_default_graph().get_operations())
        mark["loss"] = loss.op.name
        return tape.gradient(loss, model.trainable_variables)

    concrete = tf.function(step).get_concrete_function(in_specs, y_specs)
    return concrete, mark["forward"], mark["loss"]


def _source(t):
    """The tensor that Identity ops pass on as `t`."""
    while t.op.type == "Identity" and t.op.inputs:
        t = t.op.inputs[0]
    return t


def _ops_that_run(ops, outputs, roots=()) -> set:
    """Names of the ops the step runs: what the gradients and `roots` (the
    loss) depend on, and the stateful ops (variable updates such as
    BatchNormalization's moving statistics) with what they read.

    A gradient function builds the gradient of every input of its op, also
    of inputs that need none: the gradient of `x * scale` for a frozen
    BatchNormalization's `scale`, or of the model's input (an LSTM's
    unstacked input sequence). Those ops are in the
    traced graph, but TensorFlow prunes them before the step runs, so they
    keep no forward tensor alive (a MobileNetV2 with frozen
    BatchNormalization was estimated as if its normalisation inputs were
    kept: +55%).
    """

    def stateful(op):
        try:
            return op.op_def.is_stateful
        except (KeyError, ValueError, AttributeError):  # a graph function
            return True

    stack = [t.op for t in outputs] + [op for op in ops if stateful(op)]
    stack += list(roots)
    run = set()
    while stack:
        op = stack.pop()
        if op.name in run:
            continue
        run.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return run


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
):
    """Peak live bytes when `ops` run in order, freeing after last use.

    `aliases` maps a tensor to the tensor whose buffer it shares (a while
    loop's pass-through TensorLists), besides the ops in `_ALIAS`.
    `scratch(op)`: bytes the op's kernel holds on top while it runs.
    TensorFlow's executor runs ready ops on several inter-op threads: two
    ops that read the same tensor and do not read each other (the two
    gradients of a matmul or an einsum, both waiting for the same incoming
    gradient) run at once, so the scratch of the one before counts too.
    """
    last = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            last[t.name] = i
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
                if src is not None:
                    buffer_of[t.name] = src
                    holders[src].add(t.name)
                    continue
            if op.type in _FREE:
                continue
            n = size_of(t) or 0
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
        for t in list(op.inputs) + done:
            if last.get(t.name) != i or t.name in keep:
                continue
            src = buffer_of.get(t.name)
            if src is None or src not in holders:
                continue
            holders[src].discard(t.name)
            if not holders[src]:
                n = size.pop(src)
                live -= n
                del holders[src]
                if events is not None and n:
                    events.append((_event_key(src, lists), None))
    return peak
