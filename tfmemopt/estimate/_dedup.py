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

Only the forward pass's ops are merged. TensorFlow's gradient functions
recompute some forward values on purpose and guard them against this
merge with a control dependency on the incoming gradient (`swish`'s
gradient recomputes `sigmoid(features)` so that the forward pass can free
it), which the traced graph does not always show: merged there, the
recomputation would keep the forward tensor alive until the backward
pass. Measured (issue #23): merging the backward pass's ops too put the
Conformer-like stack at +13.7% (-0.8% without), EfficientNetB0 at +20.6%
(-3.0%) and DeBERTa at +25.9% (-1.0% with the forward pass's merges only).
"""

from __future__ import annotations

# Binary ops whose inputs Grappler compares in any order (`IsCommutative`).
_COMMUTATIVE = {
    "Add",
    "AddV2",
    "Mul",
    "Maximum",
    "Minimum",
    "SquaredDifference",
    "LogicalAnd",
    "LogicalOr",
    "Equal",
    "NotEqual",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
}
# Ops Grappler never merges (`CanDedup`, `IsFreeOfSideEffect`): the graph's
# arguments, loop frames, and ops that write an input in place.
_KEPT = {"Placeholder", "Enter", "Exit", "Merge", "Switch", "NextIteration"}


def _mergeable(op) -> bool:
    if op.type in _KEPT or "Inplace" in op.type or "Assign" in op.type:
        return False
    try:
        return not op.op_def.is_stateful
    except (KeyError, ValueError, AttributeError):  # a graph function
        return False


def _attributes(op) -> tuple:
    attrs = op.node_def.attr
    return tuple(
        (k, attrs[k].SerializeToString(deterministic=True))
        for k in sorted(attrs)
        if not k.startswith("_")
    )


def duplicates(ops, forward) -> dict:
    """Tensor name -> the name of the tensor that replaces it, for each
    output of a forward op (its name in `forward`) identical to an earlier
    one in `ops` (graph order, which is topological). An op's inputs are
    replaced first, so chains of identical ops merge whole, as Grappler's
    repeated passes do."""
    same = {}
    seen = {}
    for op in ops:
        if op.name not in forward or not _mergeable(op):
            continue
        inputs = [same.get(t.name, t.name) for t in op.inputs]
        if op.type in _COMMUTATIVE:
            inputs.sort()
        control = sorted(c.name for c in op.control_inputs)
        key = (op.type, op.device, tuple(inputs), tuple(control))
        first = seen.setdefault(key + _attributes(op), op)
        if first is op:
            continue
        for t, kept in zip(op.outputs, first.outputs):
            same[t.name] = kept.name
    return same
