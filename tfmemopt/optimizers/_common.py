"""Pieces shared by tfmemopt's optimizers: argument checks, sparse
gradients, one-variable-at-a-time ordering of the update temporaries."""

from __future__ import annotations

import contextlib
import numbers

import keras
import tensorflow as tf


def check_positive_int(name: str, value) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < 1
    ):
        raise ValueError(
            f"`{name}` must be a positive integer. Received: {name}={value!r} "
            f"(of type {type(value).__name__}). Pass an int >= 1, e.g. "
            f"{name}=256."
        )
    return int(value)


def check_nonnegative_int(name: str, value) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < 0
    ):
        raise ValueError(
            f"`{name}` must be an integer >= 0. Received: {name}={value!r} "
            f"(of type {type(value).__name__})."
        )
    return int(value)


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


def raw(variable):
    """The tf.Variable behind a keras.Variable (itself otherwise)."""
    if isinstance(variable, keras.Variable):
        return variable.value
    return variable


def local(variable, device: str):
    """The component of a (mirrored) optimizer variable on `device`, for the
    partial reads and writes a MirroredVariable does not offer."""
    target = raw(variable)
    components = tf.distribute.get_strategy().experimental_local_results(target)
    if len(components) > 1:
        for component in components:
            if component.device == device:
                return component
    return target


def colocated(strategy, variable):
    """Creates slots next to `variable` (a no-op for stand-ins that are not
    variables, e.g. ShardedOptimizer's partition references)."""
    target = raw(variable)
    if isinstance(target, tf.Variable):
        return strategy.extended.colocate_vars_with(target)
    return contextlib.nullcontext()


def dedup_rows(grad: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """Unique row indices and the summed rows (repeated indices added first:
    a token seen twice contributes its summed gradient once)."""
    rows, pos = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, pos, tf.shape(rows)[0])
    return rows, values


def densify(grad, variable) -> tf.Tensor:
    """A dense gradient; IndexedSlices rows are summed per index first."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.math.unsorted_segment_sum(
            grad.values, grad.indices, int(variable.shape[0])
        )
    return tf.convert_to_tensor(grad)


class UpdateChain:
    """Orders the per-variable updates inside a traced step.

    Each variable's reads wait for the previous variable's writes on the same
    device, so the dequantised/full-size temporaries of one variable are freed
    before the next variable's are made (TensorFlow would otherwise run the
    independent updates in any order, all temporaries alive at once). Only
    ops of the graph being traced are chained; eager execution is already
    sequential.
    """

    def __init__(self):
        self._last = {}

    def deps(self, device: str) -> list:
        if tf.executing_eagerly():
            return []
        graph = tf.compat.v1.get_default_graph()
        entry = self._last.get(device)
        if entry is not None and entry[0] is graph:
            return [entry[1]]
        return []

    def record(self, device: str, ops) -> None:
        if tf.executing_eagerly():
            return
        graph = tf.compat.v1.get_default_graph()
        self._last[device] = (graph, tf.group(*ops))
