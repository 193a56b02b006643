"""Parameter sharding (FSDP, ZeRO stage 3) for `tfmemopt.Model`.

`shard_parameters=True` makes each of the R replicas store 1/R of every
trainable weight. Each weight gets a *shard*: a `keras.Variable` of
`ceil(n / R)` elements made under the strategy, whose per-device components
hold different parts of the flattened weight (the cut of
`_shard_layout.Layout`, on block boundaries for 8-bit optimizers). The
layer's own `keras.Variable` keeps its name, shape and place in the model,
but its storage is replaced by a `ShardedValue`: reading it inside a replica
all-gathers the shard (so each layer's weight is gathered when the layer
reads it), reading it outside one assembles the components, and assigning
it a whole value cuts the value into the components. So `get_weights`,
`set_weights`, `.keras` files and `save_weights` see whole weights, in the
unwrapped model's order, with no code of their own.

The gradient of the all-gather is an all-reduce followed by this replica's
slice: each replica ends the backward pass with its part of the *summed*
gradient. The user's optimizer is built on the shards (its slots are 1/R
too) and updates each replica's part; its own all-reduce and its
per-replica clipping are switched off (the parts are already sums, and
clipping uses the whole gradient's norm, `clip_shards`).
"""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from tfmemopt import _compat
from tfmemopt._compat import set_untracked
from tfmemopt._protocols import shard_alignment
from tfmemopt.distribute._fsdp_gather_order import ordered
from tfmemopt.distribute._fsdp_state import build_whole_state
from tfmemopt.distribute._fsdp_state import components
from tfmemopt.distribute._fsdp_state import local_replica_ids
from tfmemopt.distribute._fsdp_state import write_parts
from tfmemopt.distribute._gradients import clip
from tfmemopt.distribute._gradients import clipping_of
from tfmemopt.distribute._gradients import count_non_finite
from tfmemopt.distribute._gradients import loss_scale
from tfmemopt.distribute._gradients import sum_of_squares
from tfmemopt.distribute._shard_layout import Layout
from tfmemopt.distribute._shard_state import all_gather_parts
from tfmemopt.distribute._shard_state import gather_bits


def _gather_bfloat16(ctx, part):
    """`ctx.all_gather(part, axis=0)` for a bfloat16 `part`.

    TensorFlow's gather collective takes no bfloat16, nor does the
    all-reduce of the gradient of its `all_gather` (an embedding's or a
    `MirroredStrategy` step failed with "DataType bfloat16 not in list of
    allowed values"). The bits travel as `gather_bits` sends them, and
    the gradient is summed in float32 (exact for the replicas' bfloat16
    parts, where a bfloat16 sum would round each addition), then this
    replica's slice is cast back.
    """
    size = int(part.shape[0])

    @tf.custom_gradient
    def gather(x):
        gathered = gather_bits(ctx, x)

        def grad(dy):
            summed = ctx.all_reduce(
                tf.distribute.ReduceOp.SUM, tf.cast(dy, tf.float32)
            )
            start = ctx.replica_id_in_sync_group * size
            return tf.cast(summed[start : start + size], x.dtype)

        return gathered, grad

    return gather(part)


class ShardedValue:
    """What a sharded weight's `keras.Variable` holds instead of a variable.

    Args:
        shard: The `keras.Variable` holding one part per replica.
        layout: The `Layout` of the cut.
        strategy: The strategy the shard was made under.
        name: The weight's path, for messages.
    """

    def __init__(self, shard, layout: Layout, strategy, name: str):
        self.shard = shard
        self.layout = layout
        self.strategy = strategy
        self.name = name
        self.dtype = tf.as_dtype(shard.dtype)
        self.shape = tf.TensorShape(layout.shape)
        self._unique_id = f"sharded/{name}"
        self._gather_fn = None

    # -- reads ------------------------------------------------------------
    def local_part(self):
        """This replica's part (a tensor) inside a replica, else None.

        Activation checkpointing (`checkpointing/_recompute.py`) passes the
        part into a segment and gathers it there (`whole_from_part`), in the
        forward pass and again in the recompute.
        """
        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.num_replicas_in_sync <= 1:
            return None
        return tf.convert_to_tensor(self.shard.value)

    def whole_from_part(self, part):
        """The whole weight from this replica's `part` (an all-gather)."""
        ctx = tf.distribute.get_replica_context()
        part = ordered(part)
        if not part.device:
            # The all-gather sends to the device of what it is given; a
            # read inside a traced function may carry none (Keras's
            # evaluate and predict steps under MultiWorkerMirroredStrategy).
            with tf.device(self._component(ctx).device):
                part = tf.identity(part)
        if part.dtype == tf.bfloat16:
            whole = _gather_bfloat16(ctx, part)
        else:
            whole = ctx.all_gather(part, axis=0)
        blocks = tf.reshape(
            whole, [self.layout.replicas, self.layout.part_size]
        )
        return self.layout.assemble(blocks)

    def gathered(self):
        """The whole weight: all-gathered in a replica, else assembled."""
        part = self.local_part()
        if part is not None:
            return self.whole_from_part(part)
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and not tf.distribute.in_cross_replica_context():
            # The default replica context of another (or no) strategy.
            if tf.distribute.has_strategy():
                raise ValueError(
                    f"Weight {self.name!r} is sharded across the replicas of "
                    f"{type(self.strategy).__name__}; it cannot be read "
                    "inside another strategy's replica."
                )
        parts = [tf.convert_to_tensor(p) for p in components(self.shard)]
        if len(parts) != self.layout.replicas:
            if _compat.in_symbolic_scope() and not tf.executing_eagerly():
                # Keras traces shapes only (the symbolic build of `fit`):
                # this graph never runs, and a collective here would wait
                # for the other workers.
                return tf.zeros(self.shape, self.dtype)
            return self._gathered_across_workers()
        with tf.device(parts[0].device):
            blocks = tf.stack(parts, 0)
            return self.layout.assemble(blocks)

    def _component(self, ctx):
        """This replica's component of the shard (`ctx` its context)."""
        r = int(tf.get_static_value(ctx.replica_id_in_sync_group))
        index = local_replica_ids(self.strategy).index(r)
        return components(self.shard)[index]

    def _gathered_across_workers(self):
        """The whole weight under a multi-worker strategy, where this worker
        holds only its replicas' parts: an all-gather run in every replica,
        so every worker must read the weight too (`get_weights` and saving
        do, in the same order on every worker)."""
        if self._gather_fn is None:
            replicas = self.layout.replicas

            @tf.function(autograph=False)
            def gather():
                # This replica's component, read on its device: the all-
                # gather sends to the device of what it is given.
                ctx = tf.distribute.get_replica_context()
                component = self._component(ctx)
                with tf.device(component.device):
                    part = tf.identity(component)
                return all_gather_parts(ctx, [part], replicas)[0]

            self._gather_fn = gather
        with self.strategy.scope():
            blocks = self.strategy.run(self._gather_fn)
        first = self.strategy.experimental_local_results(blocks)[0]
        return self.layout.assemble(first)

    def numpy(self):
        return self.gathered().numpy()

    def __array__(self, dtype=None, copy=None):
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)

    def read_value(self):
        return self.gathered()

    # -- writes -----------------------------------------------------------
    def assign(self, value, **kwargs):
        """Cuts a whole value into the replicas' parts (not in a replica)."""
        if tf.distribute.in_cross_replica_context() or not (
            tf.distribute.has_strategy()
        ):
            flat = np.reshape(np.asarray(value), [-1]).astype(
                self.dtype.as_numpy_dtype
            )
            write_parts(
                components(self.shard),
                self.layout,
                flat,
                local_replica_ids(self.strategy),
            )
            return value
        raise ValueError(
            f"Weight {self.name!r} is sharded across replicas "
            "(shard_parameters=True): assign it outside the replicas "
            "(model.set_weights, layer.kernel.assign in the strategy's "
            "scope), not inside a train step."
        )

    def __repr__(self):
        return (
            f"<ShardedValue {self.name} shape={self.shape.as_list()} "
            f"replicas={self.layout.replicas}>"
        )

    @property
    def handle(self):
        raise ValueError(
            f"Weight {self.name!r} is sharded across replicas "
            "(shard_parameters=True) and has no single resource handle."
        )


def _convert(value, dtype=None, name=None, as_ref=False):
    out = value.gathered()
    if dtype is not None and tf.as_dtype(dtype) != out.dtype:
        out = tf.cast(out, dtype)
    return out


tf.register_tensor_conversion_function(ShardedValue, _convert)


def clip_shards(grads, optimizer):
    """Clips each replica's part of the summed gradients as one device would.

    Norms come from the whole summed gradients (one all-reduce of the sums
    of squares), and any non-finite part makes every replica's parts
    non-finite, so a `LossScaleOptimizer` skips the step everywhere.
    """
    ctx = tf.distribute.get_replica_context()
    setting = clipping_of(optimizer)
    squares = [None if g is None else sum_of_squares(g) for g in grads]
    present = [s for s in squares if s is not None]
    stats = tf.stack(present + [count_non_finite(grads)])
    stats = ctx.all_reduce(tf.distribute.ReduceOp.SUM, stats)
    it = iter(tf.unstack(stats[:-1]))
    squares = [None if s is None else next(it) for s in squares]
    poison = tf.where(stats[-1] > 0, float("nan"), 1.0)
    grads = [None if g is None else g * tf.cast(poison, g.dtype) for g in grads]
    if setting is None or setting[0] == "clipvalue":
        return clip(grads, setting, scale=loss_scale(optimizer))
    return clip(grads, setting, squares=squares, scale=loss_scale(optimizer))


# -- making the shards ---------------------------------------------------------


class ShardSet:
    """The shards of one model (a plain object: Keras does not track it, so
    saving walks the model's own, whole-valued weights only)."""

    def __init__(self, strategy, originals, shards):
        self.strategy = strategy
        self.originals = list(originals)
        self.shards = list(shards)

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync


def _unique(variables):
    seen, out = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def shard_model(model, optimizer) -> ShardSet | None:
    """Replaces the storage of `model`'s trainable weights by shards.

    Builds `optimizer` on the shards (on the model's existing shards when
    it is compiled again). Returns `None`, and changes nothing, with one
    replica or no optimizer.
    """
    import keras

    strategy = model.distribute_strategy
    replicas = strategy.num_replicas_in_sync
    if replicas <= 1 or optimizer is None:
        return None
    inner = optimizer
    while isinstance(inner, keras.optimizers.LossScaleOptimizer):
        inner = inner.inner_optimizer
    check_optimizer(inner)
    _check_model(model)
    if optimizer.built:
        raise ValueError(
            "shard_parameters=True builds the optimizer on the shards, and "
            f"this optimizer ({type(inner).__name__}) is built already (on "
            "whole weights). Pass a new, unbuilt optimizer to `compile`."
        )
    existing = getattr(model, "_shards", None)
    if existing is not None:
        _prepare_optimizer(inner, existing.originals, existing.shards)
        build_whole_state(optimizer, inner, existing)
        return existing
    originals = _unique(model.trainable_weights)
    excluded = {
        id(w)
        for w in originals
        if inner.weight_decay is not None
        and not _compat.uses_weight_decay(inner, w)
    }
    shards = []
    replica_ids = local_replica_ids(strategy)
    with strategy.scope():
        for w in originals:
            shape = tuple(int(d) for d in w.shape)
            align = shard_alignment(inner, shape)
            layout = Layout(shape, replicas, align)
            whole = np.reshape(np.asarray(w.numpy()), [-1])
            with _path_scope(w.path):
                shard = keras.Variable(
                    initializer="zeros",
                    shape=(layout.part_size,),
                    dtype=w.dtype,
                    trainable=True,
                    name=w.name,
                    aggregation="none",
                )
            write_parts(components(shard), layout, whole, replica_ids)
            shard.whole_shape = shape
            _compat.replace_storage(
                w, ShardedValue(shard, layout, strategy, w.path)
            )
            shards.append(shard)
    _prepare_optimizer(inner, originals, shards, excluded)
    shard_set = ShardSet(strategy, originals, shards)
    build_whole_state(optimizer, inner, shard_set)
    return shard_set


def _path_scope(path: str):
    """Name scopes that give a new variable the path of the weight `path`.

    `keras.name_scope` refuses a `/` in its name, and a nested layer's
    weight has several (`block/embedding/embeddings`): one scope per part.
    """
    import keras

    stack = contextlib.ExitStack()
    for part in path.split("/")[:-1]:
        stack.enter_context(keras.name_scope(part))
    return stack


def _prepare_optimizer(inner, originals, shards, excluded=None) -> None:
    """Weight-decay exclusions carried to the shards; Keras's all-reduce
    and per-replica clipping off."""

    if excluded is None:  # compiled again: ask by the original names
        excluded = set()
        if inner.weight_decay is not None:
            for w, s in zip(originals, shards):
                if not _compat.uses_weight_decay(inner, s):
                    excluded.add(id(w))
    if excluded:
        inner.exclude_from_weight_decay(
            var_list=[s for w, s in zip(originals, shards) if id(w) in excluded]
        )
    _compat.skip_optimizer_all_reduce(inner)
    _finalize_on_shards(inner, originals, shards)


def _finalize_on_shards(inner, originals, shards) -> None:
    """`fit` ends with `finalize_variable_values(model.trainable_weights)`
    (with `use_ema=True`, the weights take their moving averages); the
    whole weights have no variable to assign, so each replica's average
    (1/R, kept beside its part) is written into its part of the shard."""
    if getattr(inner, "ema_overwrite_frequency", None):
        raise ValueError(
            "shard_parameters=True cannot use ema_overwrite_frequency="
            f"{inner.ema_overwrite_frequency}: Keras overwrites the weights "
            "with their averages inside a cond in the train step, which "
            "fails under MirroredStrategy (Keras's own optimizer too: "
            "'merge_call called while defining a new graph'). Use "
            "use_ema=True without ema_overwrite_frequency (the averages "
            "replace the weights when fit ends), or "
            "keras.callbacks.SwapEMAWeights."
        )
    by_id = {id(w): s for w, s in zip(originals, shards)}
    finalize = type(inner).finalize_variable_values

    def on_shards(var_list):
        return finalize(inner, [by_id.get(id(v), v) for v in var_list])

    set_untracked(inner, "finalize_variable_values", on_shards)


def _check_model(model) -> None:
    """Refuses the combinations this version cannot shard."""
    if not model.built:
        raise ValueError(
            "shard_parameters=True shards the weights when the model is "
            "compiled, and this model is not built yet. Build it first "
            "(call it on a batch, or `model.build(input_shape)`), inside "
            "the strategy's scope, then compile."
        )
    if getattr(model, "micro_batch_size", None) is not None:
        raise ValueError(
            "shard_parameters=True does not combine with micro_batch_size="
            f"{model.micro_batch_size}: under parameter sharding the "
            "micro-batches are traced one by one (the all-gather of the "
            "weights cannot run inside a tf.while_loop), so their number "
            "must be bounded. Use accumulation_steps=N instead (at most N "
            "micro-batches per batch)."
        )


# Optimizers whose update is not elementwise over a parameter (or whose
# build copies the parameter): the same list ShardedOptimizer refuses.
_REFUSED = {
    "Adafactor": "factored second moments (row and column means of the whole "
    "matrix)",
    "Lamb": "a trust ratio from the norm of the whole parameter",
    "Muon": "orthogonalised whole matrices",
    "ScheduleFreeAdamW": "a copy of the parameter made in `build`",
}


def check_optimizer(inner) -> None:
    """Raises for an optimizer whose update needs the whole parameter, and
    for a `ShardedOptimizer` (whose own partitions of the already sharded
    state trained silently wrong: 6.7 of the update from one device)."""
    name = type(inner).__name__
    if name == "ShardedOptimizer":
        raise ValueError(
            "shard_parameters=True builds your own optimizer on the shards, "
            "so its state is already 1/R per replica; it does not take a "
            "tfmemopt.ShardedOptimizer. Fix: pass the inner optimizer "
            "(e.g. optimizer=keras.optimizers.AdamW(...) or "
            "tfmemopt.optimizers.AdamW8bit(...))."
        )
    if name in _REFUSED:
        raise ValueError(
            f"shard_parameters=True cannot use {name}: its update uses "
            f"{_REFUSED[name]}, which a replica holding 1/R of each weight "
            "does not have. Use an elementwise optimizer (Adam, AdamW, SGD, "
            "RMSprop, Lion, tfmemopt.optimizers.AdamW8bit), or keep whole "
            "weights and shard only the optimizer state with "
            "tfmemopt.ShardedOptimizer."
        )
