"""The forward tensors a traced step keeps for its backward pass, by layer
and by candidate checkpointing segment."""

from __future__ import annotations

import tensorflow as tf

# Ops whose output shares its input's buffer.
_ALIAS = {
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


def _kept_for_backward(backward_ops, fwd_names, path_of, size_of, same=None):
    """Forward tensors read by gradient ops: the activations kept.

    `same`: tensor name -> the tensor that replaces it (`_dedup`): a
    tensor and its replacement are kept once.
    Returns `(saved_by_layer, unknown)`: `[(layer path, bytes)]`, and the
    labels of loop tensors whose size the graph does not say.
    """
    saved = {}
    unknown = []
    for op in backward_ops:
        for t in op.inputs:
            t = _buffer_of(t)
            if t.op.name not in fwd_names or t.op.type in _FREE:
                continue
            if t.op.type == "Placeholder":
                continue
            saved.setdefault((same or {}).get(t.name, t.name), t)
    saved_by_layer = []
    for t in saved.values():
        path = path_of(t.op.name)
        n = size_of(t)
        if n is None:
            label = "/".join(path[1:]) or t.op.name
            if label not in unknown and t.dtype == tf.variant:
                unknown.append(label)
            continue
        saved_by_layer.append((path[1:] if path else (), n))
    return saved_by_layer, unknown


def _buffer_of(t):
    """The tensor whose buffer `t` is: a view (`Reshape`, `ExpandDims`,
    `Squeeze`, `Identity`, ...) shares its input's. A gradient that reads
    a view and one that reads its source keep one buffer: Keras's Conv1D
    and MaxPooling1D run as 2-D ops on an `ExpandDims` of their input, and
    the 1-D conv net's estimate counted each kept input twice (+56% to
    +64% against its measured peak)."""
    while t.op.type in _ALIAS and t.op.inputs and t.op.type != "IdentityN":
        t = t.op.inputs[0]
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
