"""The forward tensors a traced step keeps for its backward pass, by layer
and by candidate checkpointing segment."""

from __future__ import annotations

import tensorflow as tf

from tfmemopt.estimate._kernels import HANDLES
from tfmemopt.estimate._kernels import SHAPE_ONLY

# Ops whose output shares its input's buffer.
_ALIAS = {
    # Bitcast shares its input's buffer (`Tensor::BitcastFrom`): Keras's
    # TensorFlow `argmax` bitcasts a float output to int32 to find -0.0.
    "Bitcast",
    "Identity",
    "IdentityN",
    "Reshape",
    "Squeeze",
    "ExpandDims",
    "StopGradient",
    "Snapshot",
    "EnsureShape",
    "PreventGradient",
    "ReadVariableOp",
}
# The path of a kept tensor made outside the model's own scope and outside
# every layer: the loss, the train step's own ops.
LOSS = ("(loss and other)",)
# Ops whose outputs are tiny or not device buffers.
_FREE = {
    "Const",
    "Shape",
    "ShapeN",
    "Size",
    "Rank",
    "VarHandleOp",
    "NoOp",
    "BroadcastGradientArgs",
    "ReadVariableOp",
}


def _kept_for_backward(
    backward_ops,
    fwd_names,
    path_of,
    size_of,
    same=None,
    views=None,
    outside=None,
):
    """Forward tensors read by gradient ops: the activations kept; where a
    gradient op runs in the forward pass (`_early_ops`), its output in
    place of its inputs.

    `same`: tensor name -> the tensor that replaces it (`_dedup`): a
    tensor and its replacement are kept once. `views`: tensor name -> the
    tensor whose buffer it is beyond `_ALIAS` (a product by a constant
    one, `_dedup.times_one`). `outside`: op name -> whether the op ran
    outside the model's scope and every layer's (the loss): its tensors
    get the path `LOSS`.
    Returns `(saved_by_layer, unknown)`: `[(layer path, bytes)]`, and the
    labels of loop tensors whose size the graph does not say.
    """
    saved = {}
    unknown = []
    early = _early_ops(backward_ops, fwd_names, views)
    for op in backward_ops:
        if op.name in early:
            continue
        for t in op.inputs:
            t = _buffer_of(t, views)
            if t.op.type in _FREE:
                continue
            if t.op.name not in fwd_names and t.op.name not in early:
                continue
            if t.op.type == "Placeholder":
                continue
            saved.setdefault((same or {}).get(t.name, t.name), t)
    saved_by_layer = []
    for t in saved.values():
        name = early.get(t.op.name, t.op.name)
        path = path_of(name)
        n = size_of(t)
        if n is None:
            label = "/".join(path[1:]) or t.op.name
            if label not in unknown and t.dtype == tf.variant:
                unknown.append(label)
            continue
        if outside is not None and outside(name):
            saved_by_layer.append((LOSS, n))
        else:
            saved_by_layer.append((path[1:] if path else (), n))
    return saved_by_layer, unknown


def _early_ops(backward_ops, fwd_names, views=None) -> dict:
    """Gradient ops that need nothing of the loss's gradient: the mask
    `LessEqual(x, y)` of a `Minimum`'s gradient, the `Pow(x, 2)` of a
    cube's. The executor runs them as soon as their inputs are made, in the
    forward pass, so what the backward pass keeps is their output, not
    their inputs. Name -> the forward op whose layer they belong to.

    The loss's gradient starts at the tape's seed (`gradient_seed`); an op
    that waits for it, through an input or a control input (the gradient
    of a `SquaredDifference` computes `x - y` under a control dependency
    on the incoming gradient), is not early.

    Allocator trace of a PSPNet-like net under `mixed_bfloat16`, batch 32:
    the masks of its last up-sampling's `clip_by_value` (two of 5.9 MiB)
    made in the forward pass and both 23.6 MiB tensors they read freed
    there; counted as kept, the activations were 182.4 MiB where the
    simulated step peaks at 160.5."""
    late, early = gradient_seed(backward_ops), {}
    if not late:  # no seed found: nothing is known to be early
        return early
    for op in backward_ops:
        if op.name in late:
            continue
        preds = [t.op for t in op.inputs] + list(op.control_inputs)
        if any(p.name in late for p in preds):
            late.add(op.name)
            continue
        if op.type in SHAPE_ONLY or any(
            t.dtype in HANDLES or t.name in (views or {}) for t in op.outputs
        ):
            continue  # made from a shape (or a loop's list), or a view
        source = None
        for t in op.inputs:
            t = _buffer_of(t, views)
            name = t.op.name
            if t.dtype in HANDLES:
                continue
            if name in fwd_names and t.op.type not in _FREE:
                source = source or name
            elif name in early:
                source = source or early[name]
        if source is not None:
            early[op.name] = source
    return early


def gradient_seed(backward_ops) -> set:
    """Names of the ops of the tape's seed, the loss's gradient as
    `tape.gradient` starts it (`ones` of the loss's shape, a `Const` or a
    `Fill`): the backward ops made before the first gradient function's,
    in creation order (each gradient function builds in `gradient_tape/`).
    """
    seed = set()
    for op in backward_ops:
        if op.name.startswith("gradient_tape/"):
            break
        seed.add(op.name)
    return seed


def _buffer_of(t, views=None):
    """The tensor whose buffer `t` is: a view (`Reshape`, `ExpandDims`,
    `Squeeze`, `Identity`, ...) shares its input's. A gradient that reads
    a view and one that reads its source keep one buffer: Keras's Conv1D
    and MaxPooling1D run as 2-D ops on an `ExpandDims` of their input, and
    the 1-D conv net's estimate counted each kept input twice (+56% to
    +64% against its measured peak)."""
    while True:
        if t.op.type in _ALIAS and t.op.inputs and t.op.type != "IdentityN":
            t = t.op.inputs[0]
        elif views and t.name in views:
            t = t.graph.get_tensor_by_name(views[t.name])
        else:
            return t


def _units_at(depth, fwd_ops, model_scope, path_of, saved_by_layer, size_of):
    """Layers at `depth` below the model, in order, with saved/output bytes."""
    units, saved, outputs = [], {}, {}
    if model_scope is None:
        return units, saved, outputs
    for op in fwd_ops:
        if not op.name.startswith(model_scope + "/"):
            continue
        path = path_of(op.name)
        if len(path) <= depth:
            continue
        unit = path[1 : depth + 1]
        if unit not in saved:
            units.append(unit)
            saved[unit] = 0
            outputs[unit] = 0
        for t in op.inputs:
            src = path_of(t.op.name)[1 : depth + 1]
            if len(src) == depth and src != unit and src in outputs:
                if t.op.type not in _FREE and t.op.type != "Placeholder":
                    n = size_of(t) or 0
                    outputs[src] = max(outputs[src], n)
    for path, n in saved_by_layer:
        if tuple(path[:depth]) in saved:
            saved[tuple(path[:depth])] += n
    return units, saved, outputs
