"""Adafactor with truly factored second moments (Shazeer & Stern, 2018)."""

from __future__ import annotations

import math
import numbers

import keras
import tensorflow as tf

from tfmemopt.optimizers import _checks
from tfmemopt.optimizers import _common


class _State:
    """Per model variable: its factored (r, c) or full (v) second moment and
    optional first moment. A plain object, so no framework wraps it."""

    def __init__(self):
        self.second = []
        self.first = []


@keras.saving.register_keras_serializable(package="tfmemopt")
class Adafactor(_common.StateOptimizer):
    """Adafactor whose state is a row and a column vector per matrix.

    For a variable of rank >= 2 with last two axes (n, m), the second moment
    is kept as its row means r (shape `[..., n]`) and column means c (shape
    `[..., m]`), 4 (n + m) bytes instead of 4 n m; the update is the T5 form
    `g * rsqrt(r / mean(r)) * rsqrt(c)`, which cannot turn into 0/0 (Keras's
    `(r / mean(r)) * c` underflows to 0 where a dead ReLU unit meets an
    always-zero input, and the step is NaN). Vectors and scalars keep a full
    second moment (their size). Unlike `keras.optimizers.Adafactor`, no
    full-size `velocity` is built for matrices: the state of a model made of
    matrices is a few percent of Keras's.

    The step (paper's Algorithm 4 with its options):
    `rho = min(learning_rate, 1/sqrt(t))` if `relative_step` else
    `learning_rate`; `alpha = max(epsilon_2, RMS(w)) * rho` if
    `scale_parameter` else `rho`; `beta2_t = 1 - t^beta_2_decay`; the update
    `u` is divided by `max(1, RMS(u) / clip_threshold)`; with `beta_1` a
    float, a float32 first moment of `u` is kept (4 bytes per parameter).
    A variable whose gradient holds a NaN or Inf is left unchanged at that
    step. Sparse gradients are summed per row, then applied densely.

    Args:
        learning_rate: Float, schedule or callable, defaults to `0.001`.
            With `relative_step` it caps the relative step `1/sqrt(t)`.
        beta_1: Float in [0, 1) or `None` (default): no first moment.
        beta_2_decay: Float in [-1, 0), defaults to `-0.8`.
        epsilon_1: Float > 0, defaults to `1e-30`, added to squared gradients.
        epsilon_2: Float >= 0, defaults to `1e-3`, floor of the parameter
            scale.
        clip_threshold: Float > 0 or `None`, defaults to `1.0`.
        relative_step: Bool, defaults to `True`.
        scale_parameter: Bool, defaults to `True`.
        weight_decay, clipnorm, clipvalue, global_clipnorm, use_ema,
            ema_momentum, ema_overwrite_frequency, loss_scale_factor, name:
            as in `keras.optimizers.Adafactor`.
        {bf16_args}
        gradient_accumulation_steps: refused; use tfmemopt's accumulation.

    Example:

    >>> import keras, numpy as np, tfmemopt
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> model.compile(tfmemopt.optimizers.Adafactor(), "mse")
    >>> _ = model.fit(np.ones((8, 4)), np.ones((8, 2)), verbose=0)
    """

    def __init__(
        self,
        learning_rate=0.001,
        beta_1=None,
        beta_2_decay=-0.8,
        epsilon_1=1e-30,
        epsilon_2=1e-3,
        clip_threshold=1.0,
        relative_step=True,
        scale_parameter=True,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        loss_scale_factor=None,
        gradient_accumulation_steps=None,
        name=None,
        bf16_update=None,
        bf16_seed=0,
        **kwargs,
    ):
        _checks.refuse_keras_accumulation(
            type(self).__name__, gradient_accumulation_steps
        )
        super().__init__(
            learning_rate=learning_rate,
            name=name,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            use_ema=use_ema,
            ema_momentum=ema_momentum,
            ema_overwrite_frequency=ema_overwrite_frequency,
            loss_scale_factor=loss_scale_factor,
            gradient_accumulation_steps=None,
            bf16_update=bf16_update,
            bf16_seed=bf16_seed,
            **kwargs,
        )
        if beta_1 is not None:
            beta_1 = _checks.check_open_unit("beta_1", beta_1, True)
        self.beta_1 = beta_1
        if (
            isinstance(beta_2_decay, bool)
            or not isinstance(beta_2_decay, numbers.Real)
            or not -1.0 <= beta_2_decay < 0.0
        ):
            raise ValueError(
                "`beta_2_decay` must be a float in [-1, 0) (beta2_t = 1 - "
                f"t^beta_2_decay). Received: beta_2_decay={beta_2_decay!r}. "
                "The paper uses -0.8."
            )
        self.beta_2_decay = float(beta_2_decay)
        if not isinstance(epsilon_1, numbers.Real) or not epsilon_1 > 0:
            raise ValueError(
                f"`epsilon_1` must be a float > 0. Received: {epsilon_1!r}."
            )
        self.epsilon_1 = float(epsilon_1)
        self.epsilon_2 = _checks.check_nonnegative_float("epsilon_2", epsilon_2)
        if clip_threshold is not None and (
            not isinstance(clip_threshold, numbers.Real)
            or not clip_threshold > 0
        ):
            raise ValueError(
                "`clip_threshold` must be a float > 0 or None. Received: "
                f"clip_threshold={clip_threshold!r}."
            )
        self.clip_threshold = (
            None if clip_threshold is None else float(clip_threshold)
        )
        self.relative_step = bool(relative_step)
        self.scale_parameter = bool(scale_parameter)
        self._state = _State()
        self._chain = _common.UpdateChain()

    def _add_state(self, variable, prefix):
        if variable is None:
            self._state.second.append(None)
            self._state.first.append(None)
            return
        shape = tuple(variable.shape)
        if len(shape) >= 2:
            second = (
                self.add_variable(
                    shape[:-1], dtype="float32", name=f"{prefix}_row"
                ),
                self.add_variable(
                    shape[:-2] + shape[-1:],
                    dtype="float32",
                    name=f"{prefix}_col",
                ),
            )
        else:
            second = self.add_variable(
                shape, dtype="float32", name=f"{prefix}_v"
            )
        first = None
        if self.beta_1 is not None:
            first = self.add_variable(
                shape, dtype="float32", name=f"{prefix}_m"
            )
        self._state.second.append(second)
        self._state.first.append(first)

    def variable_state_bytes(self, shape, dtype="float32") -> int:
        """Bytes of state for a variable of `shape` (EMA copies aside): row
        and column means for rank >= 2, else a full second moment; plus a
        float32 first moment with `beta_1`; a Kahan buffer with
        `bf16_update="kahan"` on a 16-bit `dtype`. Used by
        `estimate_memory`."""
        shape = tuple(int(d) for d in shape)
        size = math.prod(shape)
        if len(shape) >= 2:
            second = math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
        else:
            second = size
        first = size if self.beta_1 is not None else 0
        return 4 * (second + first) + self.write_state_bytes(shape, dtype)

    @staticmethod
    def _rms(x):
        return tf.sqrt(tf.reduce_mean(tf.square(x)))

    def _update(self, gradient, variable, target, index, learning_rate):
        second = self._state.second[index]
        first = self._state.first[index]
        f32 = tf.float32
        step = tf.cast(self.iterations + 1, f32)
        rho = tf.cast(learning_rate, f32)
        if self.relative_step:
            rho = tf.minimum(rho, tf.math.rsqrt(step))
        alpha = rho
        if self.scale_parameter:
            w = tf.cast(tf.convert_to_tensor(target), f32)
            alpha = tf.maximum(self.epsilon_2, self._rms(w)) * rho
        grad = tf.cast(_common.densify(gradient, variable), f32)
        grad_sq = tf.square(grad) + self.epsilon_1
        beta2 = 1.0 - tf.pow(step, self.beta_2_decay)
        eps = self.epsilon_1
        if isinstance(second, tuple):
            r_var, c_var = (_common.raw(s) for s in second)
            r = beta2 * tf.convert_to_tensor(r_var) + (
                1.0 - beta2
            ) * tf.reduce_mean(grad_sq, axis=-1)
            c = beta2 * tf.convert_to_tensor(c_var) + (
                1.0 - beta2
            ) * tf.reduce_mean(grad_sq, axis=-2)
            row = tf.math.rsqrt(
                tf.maximum(r / tf.reduce_mean(r, -1, keepdims=True), eps)
            )
            col = tf.math.rsqrt(tf.maximum(c, eps))
            update = grad * row[..., None] * col[..., None, :]
            new_second = [(r_var, r), (c_var, c)]
        else:
            v_var = _common.raw(second)
            v = beta2 * tf.convert_to_tensor(v_var) + (1.0 - beta2) * (grad_sq)
            update = grad * tf.math.rsqrt(tf.maximum(v, eps))
            new_second = [(v_var, v)]
        if self.clip_threshold is not None:
            update = update / tf.maximum(
                1.0, self._rms(update) / self.clip_threshold
            )
        new_first = []
        if first is not None:
            m_var = _common.raw(first)
            update = (
                self.beta_1 * tf.convert_to_tensor(m_var)
                + (1.0 - self.beta_1) * update
            )
            new_first = [(m_var, update)]
        delta = alpha * update
        ok = _common.all_finite([delta] + [v for _, v in new_second])
        writes = self._write_weight(variable, target, index, delta, ok)
        for var, value in new_second + new_first:
            writes.append(_common.assign_if(var, value, ok))
        return writes

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "beta_1": self.beta_1,
                "beta_2_decay": self.beta_2_decay,
                "epsilon_1": self.epsilon_1,
                "epsilon_2": self.epsilon_2,
                "clip_threshold": self.clip_threshold,
                "relative_step": self.relative_step,
                "scale_parameter": self.scale_parameter,
            }
        )
        return config
