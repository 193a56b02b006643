"""Gradient fixes that need the replicas to agree, called before `apply`.

Two Keras 3 behaviours make multi-replica training differ from one device:

- `LossScaleOptimizer` decides "finite or not" from replica 0's local
  gradients (before the all-reduce). An inf on replica 1 is then applied
  (weights become inf/nan) and the scale is not lowered. `sync_non_finite`
  all-reduces a count of non-finite values (one scalar) and, when any replica
  has one, makes every replica's gradients non-finite, so the optimizer
  skips the step everywhere and halves the scale, as on one device.
- `clipnorm`, `clipvalue` and `global_clipnorm` act on each replica's local
  gradients before the all-reduce. `clip_after_all_reduce` all-reduces the
  gradients itself, clips the sum as one device would, and hands the
  optimizer `clipped_sum / replicas`; the optimizer's own all-reduce then
  rebuilds `clipped_sum`, and its own clipping no longer changes anything
  (the norm is below the threshold by a factor `replicas`). Cost: one more
  all-reduce of the gradients per update, only when clipping is set.

`prepare_gradients` runs both as needed; with one replica it returns the
gradients unchanged. Call it in the replica context, after accumulation.

`count_non_finite`, `clipping_of` and `clip` are the one non-finite count and
the one clipping of tfmemopt: `ShardedOptimizer` uses them too, on each
replica's partition of the summed gradient.
"""

from __future__ import annotations

import keras
import tensorflow as tf


def _replica_context():
    if tf.distribute.in_cross_replica_context():
        raise ValueError(
            "tfmemopt.distribute gradient helpers must be called in a replica "
            "context (inside `train_step`, i.e. inside `strategy.run`), not "
            "in the cross-replica context."
        )
    return tf.distribute.get_replica_context()


def _inner(optimizer):
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def loss_scale(optimizer):
    """The loss scale of `optimizer` as a float32 scalar (its dynamic scale
    once built, its initial one before), or None when it is not a
    `LossScaleOptimizer`: the one helper for clipping a scaled gradient."""
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return None
    if optimizer.built:
        return tf.cast(optimizer.dynamic_scale, tf.float32)
    return tf.constant(float(optimizer.initial_scale), tf.float32)


def _values(g):
    return g.values if isinstance(g, tf.IndexedSlices) else g


def exchange_dtype(variable) -> tf.DType:
    """The dtype in which `variable`'s gradient goes to the optimizer.

    The variable's own, except a bfloat16 weight under several replicas:
    float32 there. The optimizer all-reduces what it is given, and
    TensorFlow's collectives take no bfloat16 (`CollectiveGatherV2`, which
    sums an embedding's `IndexedSlices`, raises "DataType bfloat16 not in
    list of allowed values"); summed in float32 the replicas' parts also
    lose nothing to the sum (exact where a bfloat16 sum would round each
    addition). The update then reads a float32 gradient, as it does on one
    device after its own cast. A weight part under `shard_parameters`
    (summed already, not all-reduced by the optimizer) is handed over in
    float32 too.
    """
    dtype = tf.as_dtype(variable.dtype)
    if dtype != tf.bfloat16:
        return dtype
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync <= 1:
        return dtype
    return tf.float32


def _scale(g, factor):
    if isinstance(g, tf.IndexedSlices):
        values = g.values * tf.cast(factor, g.values.dtype)
        return tf.IndexedSlices(values, g.indices, g.dense_shape)
    return g * tf.cast(factor, g.dtype)


def count_non_finite(grads) -> tf.Tensor:
    """Number of non-finite entries in `grads` (a float32 scalar).

    `None` entries count nothing; of a `tf.IndexedSlices`, its values.
    """
    counts = [
        tf.reduce_sum(
            tf.cast(tf.logical_not(tf.math.is_finite(_values(g))), tf.float32)
        )
        for g in grads
        if g is not None
    ]
    if not counts:
        return tf.constant(0.0)
    return tf.add_n(counts)


def sync_non_finite(grads):
    """Makes every replica's gradients non-finite when any replica's are.

    Cost: one scalar all-reduce. With one replica, returns `grads` as is.

    Args:
        grads: List of gradient tensors (`None` allowed), local to a replica.

    Returns:
        The gradients, multiplied by NaN on every replica when any replica
        has a non-finite entry, else unchanged.
    """
    ctx = _replica_context()
    if ctx.num_replicas_in_sync <= 1:
        return grads
    bad = ctx.all_reduce(tf.distribute.ReduceOp.SUM, count_non_finite(grads))
    poison = tf.where(bad > 0, float("nan"), 1.0)
    return [None if g is None else _scale(g, poison) for g in grads]


def clipping_of(optimizer):
    """`(kind, value)` of the optimizer's clipping, or `None` when unset.

    Checked in the order of Keras's `Optimizer._clip_gradients` (`clipnorm`,
    then `global_clipnorm`, then `clipvalue`): Keras's constructor takes
    only one of them, but one set later as an attribute is looked at in
    that order, and only the first set one applies.
    """
    inner = _inner(optimizer)
    for kind in ("clipnorm", "global_clipnorm", "clipvalue"):
        value = getattr(inner, kind, None)
        if value is not None and value > 0:
            return kind, float(value)
    return None


def sum_of_squares(g) -> tf.Tensor:
    """`sum(g**2)` in float32: a norm's square, or a part of one."""
    return tf.reduce_sum(tf.square(tf.cast(g, tf.float32)))


def clip(grads, setting, squares=None, scale=None):
    """Clips dense gradients as Keras's optimizer does for `setting`.

    The formulas are Keras's (`Optimizer._clip_by_norm`,
    `clip_by_global_norm`): `g * c / max(norm, c)` per gradient, and
    `g * (c * min(1 / norm, 1 / c) + (norm - norm))` for the global norm,
    whose `norm - norm` turns an infinite or NaN norm into NaN, so that a
    non-finite gradient stays non-finite after clipping.

    Args:
        grads: List of dense gradient tensors (`None` allowed).
        setting: `(kind, value)` from `clipping_of`, or `None`: `grads`
            come back unchanged.
        squares: List of float32 scalars, defaults to `None`: the sum of
            squares of each whole gradient (`None` where the gradient is),
            for `grads` that hold only a part of each (a replica's
            partition); computed from `grads` when not given.
        scale: Float32 scalar, defaults to `None`: the loss scale `grads`
            carry; thresholds apply to the unscaled values.

    Returns:
        The list of clipped gradients (`None` where `grads` has it).
    """
    grads = list(grads)
    if setting is None:
        return grads
    kind, value = setting
    limit = tf.constant(value, tf.float32)
    if scale is not None:
        limit = limit * tf.cast(scale, tf.float32)
    if kind == "clipvalue":
        return [None if g is None else _clip_value(g, limit) for g in grads]
    if squares is None:
        squares = [None if g is None else sum_of_squares(g) for g in grads]
    if kind == "clipnorm":
        return [
            None if g is None else _clip_norm(g, tf.sqrt(s), limit)
            for g, s in zip(grads, squares)
        ]
    norm = tf.sqrt(tf.add_n([s for s in squares if s is not None]))
    factor = limit * tf.minimum(1.0 / norm, 1.0 / limit) + (norm - norm)
    return [None if g is None else g * tf.cast(factor, g.dtype) for g in grads]


def _clip_value(g, limit):
    limit = tf.cast(limit, g.dtype)
    return tf.clip_by_value(g, -limit, limit)


def _clip_norm(g, norm, limit):
    # Keras's order of operations: (g * c) / max(norm, c).
    return (g * tf.cast(limit, g.dtype)) / tf.cast(
        tf.maximum(norm, limit), g.dtype
    )


def clip_after_all_reduce(grads, optimizer):
    """Clips the all-reduced gradients as one device would.

    Cost: one all-reduce of all gradients (on top of the optimizer's).

    Args:
        grads: List of local gradient tensors (`None` allowed).
        optimizer: The model's `keras.optimizers.Optimizer` (a
            `LossScaleOptimizer` is looked through).

    Returns:
        `clipped(sum over replicas) / replicas` per gradient, or `grads`
        unchanged with one replica or no clipping set.
    """
    ctx = _replica_context()
    setting = clipping_of(optimizer)
    replicas = ctx.num_replicas_in_sync
    if replicas <= 1 or setting is None:
        return grads
    # Sparse gradients are made dense here: clipping needs the whole sum.
    present = [tf.convert_to_tensor(g) for g in grads if g is not None]
    summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, present)
    it = iter(summed)
    summed = [None if g is None else next(it) for g in grads]
    clipped = clip(summed, setting, scale=loss_scale(optimizer))
    return [
        None if g is None else g / tf.cast(replicas, g.dtype) for g in clipped
    ]


def prepare_gradients(grads, optimizer):
    """Makes the update equal one device's under any strategy.

    With clipping set, clips after an all-reduce (which also spreads any
    non-finite value to every replica). Otherwise, under a
    `LossScaleOptimizer`, synchronises the non-finite check. With one
    replica, returns `grads` unchanged.

    Args:
        grads: List of local gradient tensors (`None` allowed).
        optimizer: The model's optimizer.

    Returns:
        A list of gradients to pass to `optimizer.apply_gradients`.
    """
    ctx = _replica_context()
    if ctx.num_replicas_in_sync <= 1:
        return list(grads)
    if clipping_of(optimizer) is not None:
        return clip_after_all_reduce(grads, optimizer)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return sync_non_finite(grads)
    return list(grads)
