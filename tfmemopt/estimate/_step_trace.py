"""One training step traced into a graph, and its ops read: the traced
function (forward + loss + `tape.gradient`, nothing executed), the ops
that run, the layer path each op ran in, and the bytes each tensor counts
(rescaled under another dtype policy; a while loop's TensorList sized from
the loop). `_step_graph` simulates the step's memory on it."""

from __future__ import annotations

import math
import re

import keras
import tensorflow as tf

from tfmemopt._compat import sublayers
from tfmemopt.estimate._input_specs import _as_call_arg
from tfmemopt.estimate._input_specs import _loss_and_target_specs
from tfmemopt.estimate._input_specs import _output_shapes
from tfmemopt.estimate._input_specs import input_specs
from tfmemopt.estimate._metric_updates import has_metrics
from tfmemopt.estimate._metric_updates import metric_updates
from tfmemopt.estimate._while_loops import while_loop_sizes
from tfmemopt.longseq import report_of
from tfmemopt.longseq import training_forward

_SUFFIX = re.compile(r"_\d+$")


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


def _traced_step(
    model,
    batch_size: int,
    input_shape=None,
    sequence_length=None,
    owner=None,
    loss=None,
    metrics_of=None,
    notes=None,
):
    """`(concrete function, forward op count)` of one gradient step; with
    `metrics_of`, the model whose compiled metrics the step updates from
    the output after the gradient (`_metric_updates`)."""
    in_specs = input_specs(model, batch_size, input_shape, sequence_length)
    # A tfmemopt.Model.wrap is compiled, the model it wraps maybe not.
    if loss is None:
        loss = getattr(owner, "loss", None) or getattr(model, "loss", None)
    report = report_of(owner) if owner is not None else None
    if loss is None and report is not None and report.chunked_loss:
        # Uncompiled under chunked_loss: the one loss it computes (the
        # default, mean squared error, was refused in a message that named
        # a loss the user never passed).
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # The output shapes once (a subclassed model's cost a forward trace):
    # for the targets and for the metrics.
    out_shapes = _output_shapes(model, in_specs)
    loss_fn, y_specs = _loss_and_target_specs(
        model, batch_size, in_specs, loss, output_shapes=out_shapes
    )
    updates = []
    chunked = report is not None and report.chunked_loss
    if metrics_of is not None and not chunked and has_metrics(metrics_of):
        updates = metric_updates(
            metrics_of,
            out_shapes,
            [tuple(s.shape[1:]) for s in y_specs],
            notes,
        )
    mark = {}

    def step(x, y):
        with tf.GradientTape() as tape, training_forward(owner) as forward:
            pred = model(_as_call_arg(x), training=True)
            preds = pred if isinstance(pred, (list, tuple)) else [pred]
            loss = 0.0
            for p, t in zip(preds, y):
                head = forward.head_of(p) if owner is not None else None
                if head is None:
                    loss = loss + loss_fn(t, p)
                else:  # the chunked loss, from the head's input
                    try:
                        losses = head.token_losses(loss_fn, t)
                    except ValueError as e:  # said whole, not as traced
                        mark["refused"] = e
                        raise
                    loss = loss + tf.reduce_mean(losses)
        mark["forward"] = len(tf.compat.v1.get_default_graph().get_operations())
        mark["loss"] = loss.op.name
        grads = tape.gradient(loss, model.trainable_variables)
        for index, metric in updates:  # after the gradient, as Keras does
            metric.update_state(y[index], preds[index])
        return grads

    try:
        concrete = tf.function(step).get_concrete_function(in_specs, y_specs)
    except ValueError:
        # tf.function prefixes the trace ("in user code: ..."); a refusal
        # of the chunked loss is the user's to read as it was raised.
        if "refused" in mark:
            raise mark["refused"] from None
        raise
    return concrete, mark["forward"], mark["loss"]


def _ops_that_run_in(concrete, n_fwd: int, loss: str):
    """The step's ops that run (in graph order), and how many are forward.

    The loss runs too: the train step reports it."""
    all_ops = concrete.graph.get_operations()
    roots = [concrete.graph.get_operation_by_name(loss)]
    run = _ops_that_run(all_ops, concrete.graph.outputs, roots)
    ops = [op for op in all_ops if op.name in run]
    return ops, sum(1 for op in all_ops[:n_fwd] if op.name in run)


def _stateful(op) -> bool:
    """Whether `op` is registered stateful; a graph function counts so."""
    try:
        return op.op_def.is_stateful
    except (KeyError, ValueError, AttributeError):  # a graph function
        return True


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

    stack = [t.op for t in outputs] + [op for op in ops if _stateful(op)]
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


def _source(t):
    """The tensor that Identity ops pass on as `t`."""
    while t.op.type == "Identity" and t.op.inputs:
        t = t.op.inputs[0]
    return t


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
    concrete,
    model,
    model_scope,
    activation_itemsize,
    min_counted_bytes,
    loops,
):
    """`(size_of, aliases)`: tensor -> the bytes it is counted at.

    Under another dtype policy (`activation_itemsize`) the model's floating
    activations and their gradients are rescaled; the function's outputs
    (weight gradients) are not. A loop's TensorList is sized from the loop
    (`while_loop_sizes`); `aliases` maps a loop's pass-through list to its
    source. Tensors below `min_counted_bytes` count 0. `loops` is the
    step's `loop_lists`, sized once by the caller for every view.
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
    lists, aliases = loops

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


def loop_lists(concrete):
    """`while_loop_sizes` of the traced step: what `_size_function` sizes
    a loop's TensorLists from (pass it to several size functions)."""
    graph = concrete.graph
    return while_loop_sizes(graph.get_operations(), graph.as_graph_def())


def _sparse_rows(concrete, values_only=False) -> dict:
    """Variable index -> bytes of its sparse gradient's values and indices
    (`values_only`: its values)."""
    return {
        i: (_nbytes(g.values) or 0)
        + (0 if values_only else _nbytes(g.indices) or 0)
        for i, g in enumerate(concrete.structured_outputs)
        if isinstance(g, tf.IndexedSlices)
    }
