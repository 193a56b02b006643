"""Grappler's merging of identical computations, for the simulation.

Grappler's common-subgraph elimination (`CommonSubgraphElimination` in
`common_subgraph_elimination.cc`, on by default) keeps one op of each set
of identical ones: the same type, device and attributes, the same data
and control inputs (those of a commutative op in any order), free of side
effects. Their readers then read one buffer where the traced graph has
several. A WaveNet-like block applies two dilated `Conv1D`s (the filter
and the gate) to one input, and each traces its own causal `Pad` and
`SpaceToBatchND` of it: the allocator trace of the step (issue #23, third
held-out set, batch 16) held 5 `SpaceToBatchND` outputs at its peak where
the graph has 10, one per block. keras-hub's DeBERTa computes the same
relative-position terms in each layer.

Only the forward pass's ops are merged. In the backward pass the merge
meets what this simulation does not model: `swish`'s gradient computes
`beta * features` again (besides the recomputation it guards with a
control dependency on the incoming gradient), which Grappler would merge
with the forward product; but Keras's `silu` has `beta = 1`, and
presumably Grappler's constant folding makes each product the features
themselves (no buffer of its own). Merged here, the forward product was
kept until the backward pass: a first version that merged backward ops
too read the Conformer-like stack at +13.7% (-0.8% without),
EfficientNetB0 at batch 32 at +20.6% (-3.0%) and DeBERTa at +25.9%
(-1.0% with the forward pass's merges only; issue #23).
"""

from __future__ import annotations

import tensorflow as tf

from tfmemopt.estimate._step_trace import _stateful

# Ops Grappler never merges (`CanDedup`: `IsPlaceholder`, `IsEnter`,
# `IsExit`); `IsFreeOfSideEffect` refuses stateful ops (but `Assert` and
# `Print`) and ops that write an input in place. Grappler also refuses
# every op upstream of an in-place op (`InplaceAdd`, `InplaceSub`,
# `InplaceUpdate`); Keras's TensorFlow backend makes none, so that is not
# modelled.
_KEPT = {
    "Placeholder",
    "PlaceholderV2",
    "PlaceholderWithDefault",
    "Enter",
    "Exit",
}


def _mergeable(op) -> bool:
    if op.type in _KEPT or op.type.startswith("Inplace"):
        return False
    if op.type in ("Assert", "Print", "PrintV2"):
        return True
    return not _stateful(op)


def _commutative(op) -> bool:
    """Grappler's `IsCommutative`: `Add`, or the op is registered so."""
    if op.type == "Add":
        return True
    try:
        return op.op_def.is_commutative
    except (KeyError, ValueError, AttributeError):
        return False


def _attributes(op) -> tuple:
    attrs = op.node_def.attr
    return tuple(
        (k, attrs[k].SerializeToString(deterministic=True))
        for k in sorted(attrs)
    )


def duplicates(ops, forward) -> dict:
    """Tensor name -> the name of the tensor that replaces it, for each
    output of a forward op (its name in `forward`) identical to an earlier
    one in `ops` (graph order, which is topological). An op's data and
    control inputs are replaced first, so chains of identical ops merge
    whole, as Grappler's repeated passes do. The merged-away ops do not
    run (`merged_ops`)."""
    same, op_of = {}, {}
    seen = {}
    for op in ops:
        if op.name not in forward or not _mergeable(op):
            continue
        inputs = [same.get(t.name, t.name) for t in op.inputs]
        if _commutative(op):
            inputs.sort()
        control = sorted(op_of.get(c.name, c.name) for c in op.control_inputs)
        key = (op.type, op.device, tuple(inputs), tuple(control))
        first = seen.setdefault(key + _attributes(op), op)
        if first is op:
            continue
        op_of[op.name] = first.name
        for t, kept in zip(op.outputs, first.outputs):
            same[t.name] = kept.name
    return same


def merged_ops(same) -> set:
    """Names of the ops `duplicates` merged away: Grappler deletes them."""
    return {name.rsplit(":", 1)[0] for name in same}


def times_one(ops) -> dict:
    """Products by a constant one: output name -> the other factor's name.

    Grappler's constant folding (`SimplifyArithmeticOperations`) replaces
    `x * 1` by `x` when the product has `x`'s shape: no buffer of its own.
    `swish`'s gradient computes `beta * features` with Keras's `beta = 1`
    from forward tensors only; the executor would run it as soon as the
    forward pass makes the features and hold its buffer until the backward
    pass reads it (EfficientNetB0 at batch 32: +20.6% in the executor's
    order, -3.0% with the product folded; issue #23).
    """
    out = {}
    for op in ops:
        if op.type != "Mul" or len(op.inputs) != 2:
            continue
        for one, x in (tuple(op.inputs), tuple(op.inputs)[::-1]):
            if one.op.type != "Const" or op.outputs[0].shape != x.shape:
                continue
            value = tf.get_static_value(one)
            if value is not None and (value == 1).all():
                out[op.outputs[0].name] = x.name
                break
    return out
