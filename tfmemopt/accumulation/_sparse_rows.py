"""Which sparse (embedding) gradients repeat the same rows in every micro-batch.

Keras 3's optimizers apply a `tf.IndexedSlices` gradient row by row, and
Adam squares each row *occurrence* before repeated rows are summed: a row
seen twice with gradient 1 moves `v` by `(1 - beta_2) * 2`, not
`(1 - beta_2) * 4` as Adam on the summed (dense) gradient would. So the
full-batch update depends on how the rows of the full batch's gradient
repeat, and accumulation must hand the optimizer the rows the full batch
would have:

- a lookup of *tokens* (indices read from the batch) has one row per
  occurrence in the full batch, the concatenation of the micro-batches'
  rows: those are concatenated;
- a lookup whose indices do not come from the batch (position embeddings
  looked up with `ops.arange`, keras-io's `TokenAndPositionEmbedding` and
  ViT `PatchEncoder`, keras-hub's ViT) has each row *once* in the full
  batch, whatever the batch size: the batch sum happens in the broadcast
  before the gather's gradient. Every micro-batch has the same rows, so
  their values are summed row by row and the optimizer sees each row once.

Whether the indices come from the batch is read off the traced graph.
"""

from __future__ import annotations

import tensorflow as tf

# Ops whose output depends on the shape of their input, not on its values.
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


def _outer(tensor):
    """The outer-graph tensor captured by a function graph's placeholder."""
    graph = tensor.graph
    for external, internal in getattr(graph, "captures", ()):
        if internal is tensor:
            return external
    return None


def reads_batch(indices, batch_tensors) -> bool | None:
    """Whether `indices` are computed from the values of `batch_tensors`.

    Args:
        indices: The `indices` tensor of a sparse gradient, as traced.
        batch_tensors: The micro-batch's input tensors.

    Returns:
        `True` or `False`; `None` when the graph cannot be read (eager
        execution), in which case the caller keeps every row.
    """
    if not hasattr(indices, "op") or tf.executing_eagerly():
        return None
    sources = {
        t.ref() for t in tf.nest.flatten(batch_tensors) if tf.is_tensor(t)
    }
    seen, stack = set(), [indices]
    while stack:
        t = stack.pop()
        try:
            ref = t.ref()
        except (AttributeError, TypeError):  # pragma: no cover
            return None
        if ref in sources:
            return True
        if ref in seen:
            continue
        seen.add(ref)
        if not hasattr(t, "graph") or t.graph is None:
            continue  # an eager constant captured by the function
        try:
            op = t.op
        except AttributeError:
            continue  # an eager constant captured by the function
        if op.type in _SHAPE_OPS:
            continue
        if op.type == "Placeholder":
            outer = _outer(t)
            if outer is not None:
                stack.append(outer)
            continue
        stack.extend(op.inputs)
    return False
