"""Private glue between `AccumulatingOptimizer` and Keras's optimizers.

Argument checks live here too, to keep the optimizer's module short.

Two Keras behaviours would make accumulation across steps inexact, and both
are corrected here on the *instances* involved (never on Keras's classes):

- `LossScaleOptimizer` skips a non-finite micro-step without telling the
  optimizer it wraps, which would silently drop that micro-batch from the
  window. `adopt_loss_scale_optimizer` makes its non-finite branch also
  mark the window as skipped.
- Keras clips gradients per replica *before* its all-reduce.
  `clip_after_all_reduce` moves the inner optimizer's clipping to just
  after it, so `clipnorm`/`global_clipnorm` see the gradient of the whole
  window on all replicas.
"""

from __future__ import annotations

import contextlib
import weakref

import keras
import tensorflow as tf

from tfmemopt._compat import in_xla_function
from tfmemopt._compat import set_untracked
from tfmemopt._utils import check_int
from tfmemopt.distribute import count_non_finite
from tfmemopt.distribute import refuse_jit_replicas

_ORIGINAL = "_tfmemopt_original_non_finite_handler"

_BASE_DEFAULTS = {
    "weight_decay": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}


def _check_steps(accumulation_steps) -> int:
    return check_int(
        "accumulation_steps",
        accumulation_steps,
        hint="Pass the number of micro-batches per optimizer update, e.g. "
        "accumulation_steps=4.",
    )


def _check_inner(cls, inner_optimizer) -> None:
    if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "`inner_optimizer` must be a `keras.optimizers.Optimizer` "
            f"instance. Received: inner_optimizer={inner_optimizer!r} (of "
            f"type {type(inner_optimizer).__name__}). Pass e.g. "
            "`keras.optimizers.Adam(1e-3)`, not a string or a class."
        )
    if isinstance(inner_optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            "AccumulatingOptimizer cannot wrap a LossScaleOptimizer: the "
            "loss scale would be checked per window while `compile` (under "
            "`mixed_float16`) adds a second LossScaleOptimizer outside. "
            "Wrap the other way round: "
            "`LossScaleOptimizer(AccumulatingOptimizer(inner))`, or simply "
            "pass `AccumulatingOptimizer(inner)` to `compile`, which does "
            "that for you. Received: inner_optimizer="
            f"{type(inner_optimizer).__name__}."
        )
    if isinstance(inner_optimizer, cls):
        raise ValueError(
            "AccumulatingOptimizer cannot wrap another AccumulatingOptimizer."
            " Use one wrapper with the product of the two "
            "`accumulation_steps`."
        )
    if inner_optimizer.gradient_accumulation_steps:
        raise ValueError(
            "The inner optimizer has Keras's own "
            "`gradient_accumulation_steps="
            f"{inner_optimizer.gradient_accumulation_steps}`; it advances "
            "schedules and EMA per micro-step and crashes under "
            "MirroredStrategy. Create the inner optimizer without it and "
            "pass `accumulation_steps="
            f"{inner_optimizer.gradient_accumulation_steps}` to "
            "AccumulatingOptimizer instead."
        )


def check_arguments(cls, inner_optimizer, accumulation_steps, kwargs) -> int:
    """Validates `AccumulatingOptimizer`'s arguments; returns the steps."""
    accumulation_steps = _check_steps(accumulation_steps)
    _check_inner(cls, inner_optimizer)
    kwargs = dict(kwargs)
    for arg_name, default in _BASE_DEFAULTS.items():
        if arg_name in kwargs and kwargs.pop(arg_name) != default:
            raise ValueError(
                f"AccumulatingOptimizer does not take `{arg_name}`. Set "
                f"`{arg_name}` on the `inner_optimizer` instead; the "
                "wrapper applies it once per update."
            )
    if "learning_rate" in kwargs:
        raise ValueError(
            "AccumulatingOptimizer does not take `learning_rate`. Set it on "
            "the `inner_optimizer`; `AccumulatingOptimizer.learning_rate` "
            "reads and writes the inner optimizer's."
        )
    if kwargs:
        raise ValueError(
            "AccumulatingOptimizer does not support arguments: "
            f"`{'`, `'.join(sorted(kwargs))}`. It takes "
            "`inner_optimizer`, `accumulation_steps` and `name`."
        )
    return accumulation_steps


def null_scope():
    return contextlib.nullcontext()


def adopt_loss_scale_optimizer(accumulating, outer) -> None:
    """Links `accumulating` to the `LossScaleOptimizer` `outer` wrapping it."""
    if not isinstance(outer, keras.optimizers.LossScaleOptimizer):
        return
    if getattr(outer, "inner_optimizer", None) is not accumulating:
        return
    if outer.__dict__.get(_ORIGINAL) is None:
        original = outer._stateful_handle_non_finite_grads
        set_untracked(outer, _ORIGINAL, original)

        def handle_non_finite_micro_step():
            original()
            outer.inner_optimizer._skip_micro_step()

        set_untracked(
            outer,
            "_stateful_handle_non_finite_grads",
            handle_non_finite_micro_step,
        )
    ref = weakref.ref(outer)
    set_untracked(accumulating, "_outer_loss_scale_ref", ref)
    # As LossScaleOptimizer does for its direct inner optimizer: the loss is
    # scaled once, by the outer optimizer.
    accumulating.inner_optimizer.loss_scale_factor = None


def original_non_finite_handler(outer):
    """The `LossScaleOptimizer`'s own non-finite branch (halves the scale)."""
    return outer.__dict__[_ORIGINAL]


def densify_for(accumulator, grad):
    """`grad`, dense where `accumulator` is replica-local (no scatter)."""
    if isinstance(grad, tf.IndexedSlices) and isinstance(
        accumulator.value, tf.distribute.DistributedValues
    ):
        return tf.convert_to_tensor(grad)
    return grad


def _weighted(grad, weight):
    grad = tf.cast(tf.convert_to_tensor(grad), "float32")
    return grad if weight is None else grad * weight


def start(accumulator, grad, weight=None) -> None:
    """Overwrites `accumulator` with `grad` (times `weight`): a window's
    first micro-step, so the accumulators never need a zeroing pass."""
    accumulator.value.assign(_weighted(grad, weight))


def accumulate(accumulator, grad, weight=None) -> None:
    """Adds `grad` (times `weight`) to `accumulator` in place.

    `keras.Variable.assign_add` reads, adds into a new gradient-sized
    buffer and assigns it; the underlying `tf.Variable`'s `assign_add` is
    one in-place `AssignAddVariableOp`, and `scatter_add` adds only the
    rows of a sparse (`tf.IndexedSlices`) gradient (replica-local
    `ON_READ` variables have no `scatter_add`: see `densify_for`).
    """
    target = accumulator.value
    if isinstance(grad, tf.IndexedSlices):
        values = tf.cast(grad.values, "float32")
        if weight is not None:
            values = values * weight
        target.scatter_add(
            tf.IndexedSlices(values, grad.indices, grad.dense_shape)
        )
        return
    target.assign_add(_weighted(grad, weight))


def window_sum(accumulator, grad, weight, window):
    """The window's sum at its last micro-step, `accumulator + grad` (only
    `grad` when the window has one micro-step), not written back: the next
    window's first micro-step overwrites the accumulator. A sparse `grad`
    is scattered into the accumulator, cheaper than densifying it."""
    if not window:
        return _weighted(grad, weight)
    if isinstance(grad, tf.IndexedSlices):
        accumulate(accumulator, grad, weight)
        return tf.convert_to_tensor(accumulator.value)
    return tf.convert_to_tensor(accumulator.value) + _weighted(grad, weight)


def local_values(strategy, variable):
    """Each replica's local value of a (possibly) replica-local variable."""
    value = variable.value if isinstance(variable, keras.Variable) else variable
    return [
        v if isinstance(v, tf.IndexedSlices) else tf.convert_to_tensor(v)
        for v in strategy.experimental_local_results(value)
    ]


def local_sum(strategy, variable):
    """Sum of the replicas' local values, without a cross-device reduce."""
    values = local_values(strategy, variable)
    return values[0] if len(values) == 1 else tf.add_n(values)


def all_finite(strategy, grads, accumulators):
    """True when every replica's gradients and accumulators are finite."""
    locals_ = [
        local
        for value in list(grads) + list(accumulators)
        for local in local_values(strategy, value)
    ]
    return tf.equal(count_non_finite(locals_), 0.0)


def clip_after_all_reduce(inner) -> None:
    """Makes `inner` clip after its gradient all-reduce, not before."""
    if not (inner.clipnorm or inner.global_clipnorm or inner.clipvalue):
        return
    if not hasattr(inner, "_all_reduce_sum_gradients"):
        return  # Not the TensorFlow optimizer: there is no all-reduce.
    if "_all_reduce_sum_gradients" in inner.__dict__:
        return  # Already done.
    reduce = inner._all_reduce_sum_gradients
    clip = inner._clip_gradients

    def reduce_then_clip(grads_and_vars):
        reduced = list(reduce(grads_and_vars))
        clipped = clip([g for g, _ in reduced])
        return [(g, v) for g, (_, v) in zip(clipped, reduced)]

    set_untracked(inner, "_clip_gradients", lambda grads: grads)
    set_untracked(inner, "_all_reduce_sum_gradients", reduce_then_clip)


def refuse_jit_on_mirrored_cpus() -> None:
    """Raises when the step being traced is XLA-compiled on mirrored CPUs.

    A model compiled with `jit_compile=True` traces its train step inside a
    jit-compiled `tf.function`; see `refuse_jit_replicas` for why that
    fails under `MirroredStrategy` on CPU devices. Auto-clustering is not
    refused.
    """
    if in_xla_function():
        refuse_jit_replicas(tf.distribute.get_strategy())
