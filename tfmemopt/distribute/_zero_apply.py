"""`ShardedOptimizer.apply` under a strategy: one update on this replica's
partition, then an all-gather of the parameters.

Per step: the gradients are made dense and summed (stage 1: one all-reduce,
each replica keeps its partition; stage 2: a reduce-scatter made of
all-reduces), the non-finite count and the norms for clipping come from the
whole sums, the inner optimizer's own `update_step` (with Keras's weight
decay, Nadam's running product and EMA around it) updates this replica's
partition of each parameter, and the updated partitions are all-gathered
into the parameters. A non-finite summed gradient skips the update on every
replica.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tfmemopt import _compat
from tfmemopt._protocols import FoldsWeightDecay
from tfmemopt.distribute import _shard_state
from tfmemopt.distribute._gradients import clip
from tfmemopt.distribute._gradients import clipping_of
from tfmemopt.distribute._gradients import count_non_finite
from tfmemopt.distribute._gradients import sum_of_squares
from tfmemopt.distribute._shard_layout import ParamView


def _dense_flat(g):
    if isinstance(g, tf.IndexedSlices):
        g = tf.convert_to_tensor(g)
    return tf.reshape(g, [-1])


def _reduce(opt, ctx, r, flats, layouts):
    """Summed gradient partitions `[c]` of this replica, and the sums."""
    if opt.stage == 1:
        summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, flats)
        return [lay.local(s, r) for s, lay in zip(summed, layouts)], summed
    groups: dict = {}
    for i, f in enumerate(flats):
        groups.setdefault(f.dtype, []).append(i)
    parts = [None] * len(flats)
    for indices in groups.values():
        mine = _reduce_scatter(
            ctx, [flats[i] for i in indices], [layouts[i] for i in indices], r
        )
        start = 0
        for i in indices:
            parts[i] = mine[start : start + layouts[i].part_size]
            start += layouts[i].part_size
    return parts, None


def _reduce_scatter(ctx, flats, layouts, r):
    """This replica's `[C]` row of the summed gradients (stage 2).

    TensorFlow has no public reduce-scatter (the raw CollectiveReduceScatterV2
    op waits forever between logical CPU devices), so the R rows (row q: the
    q-th partition of every gradient) are summed by R all-reduces of C
    elements, one after another, and each replica keeps only its own row.
    The bytes sent equal one all-reduce of the whole gradient (stage 1);
    what is held at once is one row of the sum instead of the whole sum.
    """
    mine, previous = None, []
    for q in range(layouts[0].replicas):
        with tf.control_dependencies(previous):
            row = tf.concat(
                [lay.local(f, q) for f, lay in zip(flats, layouts)], 0
            )
            summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, row)
        if q == r:
            mine = summed
        previous = [summed]
    return mine


def _sum_squares(ctx, norms, parts, summed):
    """Per-gradient sums of squares (if `norms`) and the non-finite count.

    From the whole sums at stage 1 (every replica has them: no collective),
    from the parts and one small all-reduce at stage 2.
    """
    source = parts if summed is None else summed
    sq = [sum_of_squares(s) for s in source] if norms else []
    stats = tf.stack(sq + [count_non_finite(source)])
    if summed is None:
        stats = ctx.all_reduce(tf.distribute.ReduceOp.SUM, stats)
    return stats[:-1], stats[-1]


def _gradient_pairs(inner, plan, grads, variables):
    """`(gradient, index of its parameter in plan.params)` for every
    gradient that is not None."""
    index = {_compat.var_key(inner, p): i for i, p in enumerate(plan.params)}
    pairs = []
    for g, v in zip(grads, variables):
        if g is None:
            continue
        key = _compat.var_key(inner, v)
        if key not in index:
            raise ValueError(
                f"Unknown variable {v.path!r}: this ShardedOptimizer was "
                "built for other variables."
            )
        pairs.append((g, index[key]))
    if not pairs:
        raise ValueError("No gradients provided for any variable.")
    return pairs


def _advance_nadam(inner):
    """Nadam keeps a running product outside update_step."""
    u = _compat.nadam_u_product(inner)
    dtype = u.dtype
    inner.assign(
        u,
        u
        * inner.beta_1
        * (
            1.0
            - 0.5
            * keras.ops.power(0.96, keras.ops.cast(inner.iterations + 1, dtype))
        ),
    )


def _local_update(inner, plan, pairs, parts, current, lr, r):
    """The inner optimizer's step on replica `r`'s partition (`current`,
    flat local pieces of the parameters; `parts`, their gradient pieces):
    the new local pieces."""
    views = [
        ParamView(ref, x, ref.layout.offsets[r])
        for ref, x in zip(plan.refs, current)
    ]
    folds = isinstance(inner, FoldsWeightDecay)
    if isinstance(inner, keras.optimizers.Nadam):
        _advance_nadam(inner)
    if inner.weight_decay is not None:
        for _, i in pairs:
            if folds and inner.folds_weight_decay(views[i]):
                continue  # decayed in float32 by its own update
            if _compat.uses_weight_decay(inner, plan.params[i]):
                view = views[i]
                # Read per variable, as Keras's _apply_weight_decay does:
                # reusing `lr` put a schedule's decay one rounding away
                # (3.8e-7 of the change for AdamW + ExponentialDecay, R=2).
                rate = tf.cast(inner.learning_rate, view.dtype)
                wd = tf.cast(inner.weight_decay, view.dtype)
                view.assign_sub(view.value * wd * rate)
    for g, (_, i) in zip(parts, pairs):
        inner.update_step(g, views[i], lr)
    new = [view.value for view in views]
    if inner.use_ema:
        _compat.update_ema(inner, views)
        if inner.ema_overwrite_frequency:
            overwrite = tf.equal(
                (inner.iterations + 1) % inner.ema_overwrite_frequency, 0
            )
            averages = [
                tf.convert_to_tensor(a) for a in _compat.ema_averages(inner)
            ]
            # A 16-bit weight's average is float32 (tfmemopt's optimizers).
            new = [
                tf.where(overwrite, tf.cast(a, n.dtype), n)
                for a, n in zip(averages, new)
            ]
    return new


def sharded_apply(opt, grads, variables):
    inner = opt.inner_optimizer
    plan = opt._plan
    ctx = tf.distribute.get_replica_context()
    r = _shard_state.replica_id(ctx)
    pairs = _gradient_pairs(inner, plan, grads, variables)
    flats = [_dense_flat(g) for g, _ in pairs]
    if inner.loss_scale_factor is not None:
        flats = [f / inner.loss_scale_factor for f in flats]
    layouts = [plan.refs[i].layout for _, i in pairs]
    parts, summed = _reduce(opt, ctx, r, flats, layouts)
    setting = clipping_of(inner)
    norms = setting is not None and setting[0] != "clipvalue"
    sq, bad = _sum_squares(ctx, norms, parts, summed)
    # The norms are those of the whole summed gradients (`sq`), not of the
    # partitions this replica holds.
    parts = clip(parts, setting, squares=tf.unstack(sq) if norms else None)
    finite = tf.equal(bad, 0.0)

    current = [
        plan.refs[i].layout.local(tf.reshape(tf.convert_to_tensor(p), [-1]), r)
        for i, p in enumerate(plan.params)
    ]
    lr = inner.learning_rate

    def update():
        return _local_update(inner, plan, pairs, parts, current, lr, r)

    new = tf.cond(finite, update, lambda: list(current))
    if not isinstance(new, (list, tuple)):
        new = [new]
    blocks = _shard_state.gather_by_dtype(ctx, list(new), plan.replicas)
    for p, ref, block in zip(plan.params, plan.refs, blocks):
        value = ref.layout.assemble(block)
        if getattr(p, "constraint", None) is not None:
            value = p.constraint(value)
        p.assign(value)
    inner.iterations.assign_add(tf.cast(finite, inner.iterations.dtype))
