"""`ShardedOptimizer`: ZeRO stage 1 and 2 for `tf.distribute` in `model.fit`."""

from __future__ import annotations

import keras
import tensorflow as tf

from tfmemopt import _compat
from tfmemopt._compat import set_untracked
from tfmemopt._protocols import load_state
from tfmemopt._protocols import save_state
from tfmemopt._utils import ForwardsToInner
from tfmemopt.distribute import _shard_state
from tfmemopt.distribute._zero_apply import sharded_apply
from tfmemopt.distribute._zero_plan import build_sharded

# Updates that are not elementwise over a parameter: cutting a parameter
# would change them (factored moments, a per-layer trust ratio, a matrix
# orthogonalisation) or their build reads the parameter's value.
_NOT_ELEMENTWISE = {
    "Adafactor": "its factored moments are row and column means of the "
    "whole parameter",
    "Lamb": "its trust ratio is the norm of the whole parameter",
    "Muon": "it orthogonalises each whole weight matrix",
    "ScheduleFreeAdamW": "its build copies each parameter into a slot",
}

_BASE_ARGS = (
    "weight_decay",
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "use_ema",
    "ema_momentum",
    "ema_overwrite_frequency",
    "loss_scale_factor",
    "gradient_accumulation_steps",
)


@keras.saving.register_keras_serializable(package="tfmemopt")
class ShardedOptimizer(ForwardsToInner, keras.optimizers.Optimizer):
    """Partitions an optimizer's state across the replicas (ZeRO 1 and 2).

    Under `MirroredStrategy` or `MultiWorkerMirroredStrategy` every replica
    normally holds the whole optimizer state: 8 bytes per parameter for
    Adam's two moments, on each of the R devices. Wrapped in
    `ShardedOptimizer`, each replica keeps only its 1/R of every slot (plus
    at most R - 1 elements of padding per variable and slot), updates its
    1/R of the parameters from the summed gradient with the inner
    optimizer's own `update_step`, and the replicas all-gather the updated
    parameters. Model state per parameter with Adam goes from 16 bytes to
    4 + 4 + 8 / R (stage 1) and, with the gradient partitioned too,
    4 + 12 / R on paper (stage 2; see `docs/sharding.md` for what TensorFlow
    lets stage 2 save).

    Cost: one all-gather of the parameters per step (as many bytes as one
    more all-reduce's reduce phase) on top of the gradient all-reduce.
    Updates equal the unwrapped optimizer's elementwise; `global_clipnorm`
    and `clipnorm` clip the summed gradient (one device's result, where
    Keras clips each replica's part before the all-reduce); a non-finite
    summed gradient skips the update on every replica.

    With no strategy or one replica it is the inner optimizer. The state
    saves whole, in the inner optimizer's own layout (`model.save`,
    `save_weights`, `BackupAndRestore`), so a checkpoint written with R
    replicas loads with any other number, or on one device.

    Every elementwise Keras optimizer works inside it (SGD with momentum or
    Nesterov, Adam, AdamW, Adamax, Nadam, RMSprop, Adagrad, Adadelta, Ftrl,
    Lion), and tfmemopt's `Adam8bit`/`AdamW8bit`, whose 8-bit variables are
    cut on block boundaries so that each replica holds whole blocks of codes
    and scales (the same codes as unsharded; about 2/R bytes per parameter).
    Adafactor, Lamb, Muon and ScheduleFreeAdamW are refused.
    Sparse (`tf.IndexedSlices`) gradients are made dense before the
    all-reduce: Adam then sees each row's summed gradient (Keras squares
    each occurrence of a repeated row instead) and rows absent from the batch
    still decay their moments.

    `variables` is empty: `ShardedOptimizer` saves the whole state itself
    (a `LossScaleOptimizer` around it must not read the per-replica parts).
    `state_variables` lists the variables that hold it.

    Args:
        inner_optimizer: A `keras.optimizers.Optimizer`, created inside the
            strategy's scope and not yet built.
        stage: Int, defaults to `1`. `1` partitions the optimizer state; `2`
            also leaves each replica only its partition of the summed
            gradient.
        name: String, defaults to `None`.

    Example:

    ```python
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = make_model()
        model.compile(
            optimizer=tfmemopt.ShardedOptimizer(keras.optimizers.AdamW(1e-3)),
            loss="mse",
        )
    model.fit(x, y, batch_size=64)
    ```
    """

    def __init__(self, inner_optimizer, stage: int = 1, name=None, **kwargs):
        for arg in _BASE_ARGS:
            if arg in kwargs:
                value = kwargs.pop(arg)
                if value not in (None, False, 0.99):
                    raise ValueError(
                        f"ShardedOptimizer does not take `{arg}`; set it on "
                        f"the inner optimizer instead. Received: {arg}={value}"
                    )
        if kwargs:
            raise ValueError(
                "ShardedOptimizer got unknown arguments: "
                f"{sorted(kwargs)}. Expected `inner_optimizer`, `stage` and "
                "`name`."
            )
        _check_inner(inner_optimizer)
        if isinstance(stage, bool) or stage not in (1, 2):
            raise ValueError(
                "`stage` must be 1 (partition the optimizer state) or 2 "
                "(also the summed gradient). Received: "
                f"stage={stage!r} (of type {type(stage).__name__})."
            )
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer
        self.stage = int(stage)
        self._plan = None

    # -- forwarding, as LossScaleOptimizer does -------------------------
    # learning_rate, iterations and scale_loss: ForwardsToInner.
    @property
    def variables(self):
        return []

    @property
    def state_variables(self):
        """The variables that hold the inner optimizer's state."""
        return list(self.inner_optimizer.variables)

    @property
    def replicas(self) -> int:
        """Replicas the state is cut into (1 until built, or unsharded)."""
        return 1 if self._plan is None else self._plan.replicas

    # -- build ------------------------------------------------------------
    def build(self, var_list):
        if self.built:
            return
        inner = self.inner_optimizer
        strategy = tf.distribute.get_strategy()
        own = _compat.optimizer_strategy(inner, strategy)
        if own is not strategy:
            raise ValueError(
                f"The inner optimizer {inner.name!r} was created under "
                f"another tf.distribute strategy ({type(own).__name__}) than "
                f"the one building it ({type(strategy).__name__}). Create "
                "the optimizer (and the ShardedOptimizer) inside "
                "`with strategy.scope():`."
            )
        if isinstance(strategy, tf.distribute.experimental.TPUStrategy) or (
            type(strategy).__name__.startswith("TPU")
        ):
            raise ValueError(
                "tfmemopt.ShardedOptimizer does not support TPUStrategy: TPU "
                "replicas know their index only at run time and TPUs keep "
                "their own sharded-variable machinery. Use the inner "
                "optimizer unwrapped on TPUs."
            )
        if inner.built:
            raise ValueError(
                f"The inner optimizer {inner.name!r} is already built; "
                "ShardedOptimizer must create its (partitioned) state. Pass "
                "a new, unbuilt optimizer."
            )
        # The whole state is saved by this wrapper; the inner must not save
        # (or load) its per-replica parts again as a child object.
        set_untracked(inner, "save_own_variables", _nothing)
        set_untracked(inner, "load_own_variables", _nothing)
        replicas = strategy.num_replicas_in_sync
        if replicas == 1:
            inner.build(var_list)
            self._plan = None
        else:
            self._plan = build_sharded(inner, list(var_list), replicas)
            self._plan.strategy = strategy
        super().build(var_list)

    # -- apply --------------------------------------------------------------
    def apply(self, grads, trainable_variables=None):
        if not self.built:
            if trainable_variables is None:
                raise ValueError(
                    "Call `optimizer.build(trainable_variables)` first or "
                    "pass the variables to `apply`."
                )
            with keras.name_scope(self.name, caller=self):
                self.build(list(trainable_variables))
        if self._plan is None:
            self.inner_optimizer.apply(grads, trainable_variables)
            return
        if tf.distribute.in_cross_replica_context():
            raise ValueError(
                "ShardedOptimizer.apply() must be called in a replica "
                "context (inside `strategy.run`, as `model.fit` does)."
            )
        if trainable_variables is None:
            trainable_variables = _compat.trainable_variables_of(self)
        with keras.name_scope(self.name, caller=self):
            sharded_apply(self, list(grads), list(trainable_variables))

    def finalize_variable_values(self, var_list):
        inner = self.inner_optimizer
        if self._plan is None or not inner.use_ema:
            inner.finalize_variable_values(var_list)
            return
        plan = self._plan
        averages = [plan.slot_of[id(a)] for a in _compat.ema_averages(inner)]
        whole, _ = _shard_state.read_whole(plan.strategy, averages, [])
        by_key = {
            _compat.var_key(inner, v): w for v, w in zip(plan.params, whole)
        }
        for v in var_list:
            value = by_key.get(_compat.var_key(inner, v))
            if value is not None:
                v.assign(value)

    # -- whole-tensor checkpoints --------------------------------------------
    def save_own_variables(self, store):
        inner = self.inner_optimizer
        if self._plan is None:
            type(inner).save_own_variables(inner, store)
            return
        plan = self._plan
        whole, same = _shard_state.read_whole(
            plan.strategy, plan.partitioned, plan.replicated
        )
        values = {id(v): w for (v, _), w in zip(plan.partitioned, whole)}
        values.update({id(v): w for v, w in zip(plan.replicated, same)})
        whole = [
            v.numpy() if values.get(id(v)) is None else values[id(v)]
            for v in inner.variables
        ]
        # tfmemopt's 8-bit optimizers also write their layout (block size),
        # so the whole state loads into them unsharded or re-encoded.
        save_state(inner, store, whole)

    def load_own_variables(self, store):
        inner = self.inner_optimizer
        if self._plan is None:
            type(inner).load_own_variables(inner, store)
            return
        variables = inner.variables
        # Whole arrays in the inner optimizer's unsharded layout (re-encoded
        # if its block size differs), or None: skipped, with a warning.
        whole = load_state(inner, store, name=self.name)
        if whole is None:
            return
        plan = self._plan
        saved = {id(v): w for v, w in zip(variables, whole)}
        for v in variables:
            if id(v) not in plan.slot_of and v not in plan.replicated:
                v.assign(saved[id(v)])
        _shard_state.write_whole(
            plan.strategy,
            plan.partitioned,
            [saved[id(v)] for v, _ in plan.partitioned],
            plan.replicated,
            [saved[id(v)] for v in plan.replicated],
        )

    # -- config ------------------------------------------------------------
    def get_config(self):
        return self._wrapper_config(stage=self.stage)


def _nothing(store):
    del store


def _check_inner(inner):
    if isinstance(inner, ShardedOptimizer):
        raise TypeError(
            "The optimizer is already a ShardedOptimizer; wrap the inner "
            "optimizer only once: ShardedOptimizer(keras.optimizers.AdamW())."
        )
    if isinstance(inner, keras.optimizers.LossScaleOptimizer):
        raise TypeError(
            "Wrap the other way round: "
            "LossScaleOptimizer(ShardedOptimizer(inner)), or let "
            "`compile()` add the LossScaleOptimizer under mixed_float16."
        )
    if type(inner).__name__ == "AccumulatingOptimizer":
        # By name: distribute knows nothing of accumulation (import-linter).
        # It failed in TensorFlow's colocate_vars_with at the first step.
        raise TypeError(
            "ShardedOptimizer does not take an AccumulatingOptimizer: its "
            "accumulators are whole-weight variables, and the sharded "
            "update runs on partitions. Received: ShardedOptimizer("
            "AccumulatingOptimizer(...)). Use tfmemopt.Model(..., "
            "accumulation_steps=N) (or Model.wrap(model, accumulation_"
            "steps=N)) with ShardedOptimizer(inner) as its optimizer."
        )
    if not isinstance(inner, keras.optimizers.Optimizer):
        raise TypeError(
            "`inner_optimizer` must be a keras.optimizers.Optimizer instance, "
            f"e.g. keras.optimizers.AdamW(1e-3). Received: {inner!r} "
            f"(of type {type(inner).__name__})."
        )
    for cls in type(inner).__mro__:
        reason = _NOT_ELEMENTWISE.get(cls.__name__)
        # By class name, so tfmemopt.optimizers.Adafactor (a factored
        # update, like Keras's) is refused as well.
        if reason:
            raise ValueError(
                f"ShardedOptimizer cannot partition {type(inner).__name__}: "
                f"{reason}, so an update on a partition would differ. Use an "
                "elementwise optimizer (SGD, Adam, AdamW, Adamax, Nadam, "
                "RMSprop, Adagrad, Lion) or leave this one unwrapped."
            )
    if getattr(inner, "lazy_sparse", False):
        raise ValueError(
            f"ShardedOptimizer cannot keep {type(inner).__name__}'s "
            "`lazy_sparse=True`: it makes sparse gradients dense before the "
            "all-reduce, so every row would be updated. Pass "
            "lazy_sparse=False (Keras's dense semantics) or leave the "
            "optimizer unwrapped."
        )
    if inner.gradient_accumulation_steps:
        raise ValueError(
            "ShardedOptimizer does not support the inner optimizer's "
            "`gradient_accumulation_steps` (it crashes under MirroredStrategy "
            "and advances schedules per micro-step). Use "
            "tfmemopt.Model(..., accumulation_steps=N) instead."
        )
