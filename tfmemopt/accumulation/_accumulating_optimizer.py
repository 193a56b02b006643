"""`AccumulatingOptimizer`: exact gradient accumulation across steps.

The wrapper sums the gradients of `accumulation_steps` consecutive
`apply_gradients` calls (micro-steps) into float32 accumulators and hands
their mean to the inner optimizer once per window. Everything the inner
optimizer does per update (learning-rate schedule, EMA, weight decay,
clipping, `iterations`) therefore happens once per window.

Under `tf.distribute` the accumulators are replica-local
(`synchronization=ON_READ`, `aggregation=SUM`): each replica sums its own
gradients and the inner optimizer's usual all-reduce runs once per window.
The end of a window is decided in cross-replica context
(`merge_call` -> `cond` -> `call_for_each_replica(apply)`), the pattern of
`keras.optimizers.LossScaleOptimizer`; a plain `cond` around
`apply_gradients` in replica context crashes under `MirroredStrategy`.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from tfmemopt import _compat
from tfmemopt._compat import set_untracked
from tfmemopt._utils import ForwardsToInner
from tfmemopt.accumulation import _accumulation_hooks as hooks


@keras.saving.register_keras_serializable(package="tfmemopt")
class AccumulatingOptimizer(ForwardsToInner, keras.optimizers.Optimizer):
    """Applies the mean gradient of every `accumulation_steps` micro-steps.

    Use it when one step cannot hold the batch and the micro-batches come
    from outside the model: a dataset that yields micro-batches to
    `model.fit`, a hand-written `tf.GradientTape` loop, or a model with its
    own `train_step`. Each call of `apply_gradients` adds the gradients to
    float32 accumulators; every `accumulation_steps`-th call hands the
    window's mean (or item-weighted mean, see `num_items`) to the inner
    optimizer, so schedules, EMA, weight decay, clipping and `iterations`
    advance once per update, exactly as with the full batch.

    Cost: one float32 accumulator per trainable weight (4 bytes per
    parameter, per replica) and one addition per micro-step. Under
    `tf.distribute` the gradients are all-reduced once per window, not per
    micro-step.

    With `mixed_float16`, `compile` wraps this optimizer in a
    `keras.optimizers.LossScaleOptimizer`; that order is supported: a
    non-finite micro-step skips the whole window (no partial update) and
    lowers the loss scale once. The opposite order is refused.
    BatchNormalization still sees micro-batch statistics.

    Args:
        inner_optimizer: `keras.optimizers.Optimizer`. Applies the updates.
            Set `learning_rate`, clipping, `weight_decay` and `use_ema` on
            it; it must not have `gradient_accumulation_steps`.
        accumulation_steps: Int, defaults to `2`. Micro-steps per update.
        name: String or `None`, defaults to `None`.

    Raises:
        ValueError: `accumulation_steps` is not an int >= 1, the inner
            optimizer has `gradient_accumulation_steps`, is a
            `LossScaleOptimizer` or an `AccumulatingOptimizer`, or a base
            optimizer argument (e.g. `clipnorm`) is passed to the wrapper.
            When a model compiled with `jit_compile=True` builds or calls
            it under `MirroredStrategy` on two or more CPU devices (Keras
            fails there with or without the wrapper; see
            `docs/accumulating_optimizer.md`).
        TypeError: `inner_optimizer` is not a Keras optimizer.

    Example:

    >>> import keras, numpy as np, tfmemopt
    >>> opt = tfmemopt.AccumulatingOptimizer(
    ...     keras.optimizers.SGD(0.1), accumulation_steps=2)
    >>> w = keras.Variable(np.ones(2, "float32"))
    >>> _ = opt.apply_gradients([(np.array([1.0, 2.0], "float32"), w)])
    >>> _ = opt.apply_gradients([(np.array([3.0, 0.0], "float32"), w)])
    >>> w.numpy().tolist(), int(opt.iterations)
    ([0.800000011920929, 0.8999999761581421], 1)
    """

    def __init__(
        self,
        inner_optimizer: keras.optimizers.Optimizer,
        accumulation_steps: int = 2,
        name: str | None = None,
        **kwargs,
    ):
        accumulation_steps = hooks.check_arguments(
            type(self), inner_optimizer, accumulation_steps, kwargs
        )
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer
        self.accumulation_steps = accumulation_steps
        # The LossScaleOptimizer that wraps this one, if any, by a weak
        # reference (`_outer_loss_scale()`): not tracked (it tracks us), and
        # not an attribute that Keras's saving walks (it reads every
        # attribute of `dir()`; a loss scale optimizer here led back to
        # itself, and `load_model` ended in a RecursionError).
        set_untracked(self, "_outer_loss_scale_ref", None)

    def _outer_loss_scale(self):
        """The `LossScaleOptimizer` that wraps this one, or `None`."""
        ref = self._outer_loss_scale_ref
        return None if ref is None else ref()

    def build(self, var_list):
        if self.built:
            return
        hooks.refuse_jit_on_mirrored_cpus()
        self._micro_step = self.add_variable(
            (),
            dtype="int32",
            aggregation="only_first_replica",
            name="micro_step",
        )
        self._skip_window = self.add_variable(
            (),
            dtype="int32",
            aggregation="only_first_replica",
            name="skip_window",
        )
        self._item_count = self._add_accumulator((), None, "item_count")
        set_untracked(
            self,
            "_accumulators",
            [
                self._add_accumulator(v.shape, v, "accumulator")
                for v in var_list
            ],
        )
        self.inner_optimizer.build(var_list)
        hooks.clip_after_all_reduce(self.inner_optimizer)
        super().build(var_list)

    def _add_accumulator(self, shape, reference, name):
        colocate = (
            reference.value
            if isinstance(reference, keras.Variable)
            else reference
        )
        strategy = tf.distribute.get_strategy()
        scope = (
            strategy.extended.colocate_vars_with(colocate)
            if colocate is not None
            else hooks.null_scope()
        )
        with scope, keras.name_scope(self.name, caller=self):
            variable = keras.Variable(
                initializer="zeros",
                shape=shape,
                dtype="float32",
                trainable=False,
                aggregation="sum",
                synchronization="on_read",
                name=name,
            )
        self._track_variable(variable)
        return variable

    @property
    def variables(self):
        return self._variables[:] + self.inner_optimizer.variables

    # learning_rate, iterations (updates applied, not micro-steps) and
    # scale_loss: the inner optimizer's (ForwardsToInner).

    @property
    def micro_step(self):
        """Micro-steps accumulated in the current window (0 at its start)."""
        return self._micro_step

    def apply_gradients(self, grads_and_vars, num_items=None):
        """Accumulates one micro-step; applies the window at its end.

        Args:
            grads_and_vars: Iterable of `(gradient, variable)` pairs.
            num_items: Scalar or `None`, defaults to `None`. The number of
                items (samples, valid tokens) the loss of this micro-step
                was averaged over. When given, the window's gradient is
                `sum(num_items_i * grad_i) / sum(num_items_i)`, the gradient
                of the loss averaged over all items of the window; when
                `None`, each micro-step weighs 1. Under a strategy pass the
                replica's own count; the loss is assumed divided by
                `num_replicas_in_sync`, as Keras's built-in losses are.

        Returns:
            The inner optimizer's `iterations` (number of updates).
        """
        grads, trainable_variables = zip(*grads_and_vars)
        self.apply(grads, trainable_variables, num_items=num_items)
        return self.iterations

    def apply(self, grads, trainable_variables=None, num_items=None):
        if tf.distribute.in_cross_replica_context() and (
            tf.distribute.has_strategy()
        ):
            raise ValueError(
                "AccumulatingOptimizer.apply() must be called in a replica "
                "context (inside `strategy.run`), not in cross-replica "
                "context."
            )
        if tf.distribute.get_strategy().num_replicas_in_sync > 1:
            hooks.refuse_jit_on_mirrored_cpus()
        grads = list(grads)
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "Pass `trainable_variables` on the first call (or call "
                    "`optimizer.build(variables)` first)."
                )
            trainable_variables = self._trainable_variables
        trainable_variables = list(trainable_variables)
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        pairs = [
            (g, v) for g, v in zip(grads, trainable_variables) if g is not None
        ]
        if not pairs:
            raise ValueError("No gradients provided for any variable.")
        weight = None if num_items is None else tf.cast(num_items, "float32")
        accumulators = [
            self._accumulators[self._get_variable_index(v)] for _, v in pairs
        ]
        grads = [
            hooks.densify_for(a, g) for a, (g, _) in zip(accumulators, pairs)
        ]
        variables = [v for _, v in pairs]
        tf.distribute.get_replica_context().merge_call(
            self._end_micro_step, args=(grads, weight, accumulators, variables)
        )

    def _end_micro_step(self, strategy, grads, weight, accumulators, variables):
        """Cross-replica: the first micro-step of a window writes the
        accumulators (no zeroing pass), the next ones add, the last one adds
        without writing back and applies the window."""
        step = self._micro_step.value.read_value()
        self._micro_step.value.assign_add(1)
        args = (grads, weight, accumulators)

        def start():
            strategy.extended.call_for_each_replica(self._start, args=args)

        def add():
            strategy.extended.call_for_each_replica(self._add, args=args)

        def finish():
            self._finish(strategy, grads, weight, accumulators, variables)

        steps = self.accumulation_steps
        if steps == 1:
            return finish()
        # One `Case` per micro-step: each branch's captured inputs are
        # switched once.
        index = ops.where(ops.greater_equal(step, steps - 1), 2, 1)
        index = ops.where(ops.equal(step, 0), 0, index)
        branches = [start, add, finish] if steps > 2 else [start, finish]
        tf.switch_case(ops.minimum(index, len(branches) - 1), branches)

    def _start(self, grads, weight, accumulators):
        for acc, grad in zip(accumulators, grads):
            hooks.start(acc, grad, weight)
        self._item_count.value.assign(1.0 if weight is None else weight)

    def _add(self, grads, weight, accumulators):
        for acc, grad in zip(accumulators, grads):
            hooks.accumulate(acc, grad, weight)
        self._item_count.value.assign_add(1.0 if weight is None else weight)

    def _finish(self, strategy, grads, weight, accumulators, variables):
        """Applies the window (sums of the accumulators and this micro-step's
        gradients), unless the loss scale optimizer found it non-finite."""
        window = self.accumulation_steps > 1
        count = (
            float(strategy.num_replicas_in_sync)
            if weight is None
            else hooks.local_sum(strategy, weight)
        )
        if window:
            count += hooks.local_sum(strategy, self._item_count)
        normaliser = count / strategy.num_replicas_in_sync

        def apply_window():
            strategy.extended.call_for_each_replica(
                self._apply_window,
                args=(grads, weight, accumulators, variables, normaliser),
            )

        if self._outer_loss_scale() is None:
            # Only the loss scale optimizer skips windows; a second `cond`
            # would switch every captured input once more.
            apply_window()
        else:
            ok = ops.logical_and(
                ops.equal(self._skip_window, 0),
                hooks.all_finite(
                    strategy, grads, accumulators if window else []
                ),
            )
            ops.cond(ok, apply_window, self._on_bad_window)
        self._reset_window()

    def _apply_window(self, grads, weight, accumulators, variables, norm):
        """Replica context: the inner optimizer all-reduces and updates."""
        window = self.accumulation_steps > 1
        grads = [
            ops.cast(hooks.window_sum(acc, g, weight, window) / norm, v.dtype)
            for acc, g, v in zip(accumulators, grads, variables)
        ]
        self.inner_optimizer.apply(grads, variables)

    def _on_bad_window(self):
        # A non-finite gradient reached the accumulators without the loss
        # scale optimizer seeing it (another replica): lower the scale once.
        if self._outer_loss_scale() is None:
            return
        ops.cond(
            ops.equal(self._skip_window, 0),
            hooks.original_non_finite_handler(self._outer_loss_scale()),
            lambda: None,
        )

    def _reset_window(self):
        # The accumulators and the item count are overwritten by the next
        # window's first micro-step: no zeroing pass.
        self._micro_step.assign(0)
        self._skip_window.assign(0)

    def _skip_micro_step(self):
        """Counts a micro-step the loss scale optimizer found non-finite."""
        self._skip_window.assign(1)
        self._micro_step.assign_add(1)
        ops.cond(
            ops.greater_equal(self._micro_step, self.accumulation_steps),
            self._reset_window,
            lambda: None,
        )

    def finalize_variable_values(self, var_list):
        # `fit` calls this at its end, possibly mid-window: before the first
        # update the inner optimizer's EMA averages are still zeros.
        def finalize():
            self.inner_optimizer.finalize_variable_values(var_list)

        if not self.built:
            return
        ops.cond(ops.greater(self.iterations, 0), finalize, lambda: None)

    def get_config(self):
        return self._wrapper_config(accumulation_steps=self.accumulation_steps)


def _adopt_if_accumulating(outer) -> None:
    # A `LossScaleOptimizer` was just made; if it wraps one of ours, its
    # non-finite branch must also close our window (see
    # `hooks.adopt_loss_scale_optimizer`).
    inner = getattr(outer, "inner_optimizer", None)
    if isinstance(inner, AccumulatingOptimizer):
        hooks.adopt_loss_scale_optimizer(inner, outer)


_compat.on_loss_scale_optimizer(_adopt_if_accumulating)
