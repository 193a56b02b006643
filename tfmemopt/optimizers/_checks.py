"""The argument checks of tfmemopt's optimizers (what was passed, what is
expected, how to fix it): hyperparameters, Keras's own accumulation
refused, float variables only."""

from __future__ import annotations

import numbers

import keras
import tensorflow as tf


def _int_at_least(name: str, value, minimum: int, expected: str, hint: str):
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < minimum
    ):
        raise ValueError(
            f"`{name}` must be {expected}. Received: {name}={value!r} "
            f"(of type {type(value).__name__}).{hint}"
        )
    return int(value)


def check_positive_int(name: str, value) -> int:
    return _int_at_least(
        name,
        value,
        1,
        "a positive integer",
        f" Pass an int >= 1, e.g. {name}=256.",
    )


def check_nonnegative_int(name: str, value) -> int:
    return _int_at_least(name, value, 0, "an integer >= 0", "")


def check_open_unit(name: str, value, low_closed: bool = False) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        ok = (0.0 <= value if low_closed else 0.0 < value) and value < 1.0
    if not ok:
        interval = "[0, 1)" if low_closed else "(0, 1)"
        raise ValueError(
            f"`{name}` must be a float in {interval}. Received: "
            f"{name}={value!r}. Typical values: beta_1=0.9, beta_2=0.999."
        )
    return float(value)


def check_nonnegative_float(name: str, value) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not value >= 0
    ):
        raise ValueError(
            f"`{name}` must be a float >= 0. Received: {name}={value!r}."
        )
    return float(value)


def refuse_keras_accumulation(cls_name: str, steps) -> None:
    if steps:
        raise ValueError(
            f"{cls_name} does not take `gradient_accumulation_steps` "
            f"(received {steps!r}): Keras's accumulation averages whole "
            "gradients per step and is not exact for ragged batches or "
            "sum-type losses. Use tfmemopt's exact accumulation instead: "
            "`tfmemopt.Model(..., accumulation_steps=N)` or "
            f"`tfmemopt.AccumulatingOptimizer({cls_name}(...), "
            "accumulation_steps=N)`."
        )


def check_float_variable(cls_name: str, variable) -> None:
    dtype = tf.as_dtype(keras.backend.standardize_dtype(variable.dtype))
    if not dtype.is_floating:
        name = getattr(variable, "path", None) or variable.name
        raise TypeError(
            f"{cls_name} can only train floating-point variables. Received "
            f"variable '{name}' of dtype {dtype.name}. Make it float "
            "(e.g. dtype='float32') or mark it `trainable=False`."
        )
