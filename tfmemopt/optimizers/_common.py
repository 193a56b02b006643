"""Pieces shared by tfmemopt's optimizers: argument checks, sparse
gradients, one-variable-at-a-time ordering of the update temporaries."""

from __future__ import annotations

import contextlib
import numbers

import keras
import tensorflow as tf

from tfmemopt.distribute._gradients import count_non_finite


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


def whole_shape(variable) -> tuple:
    """The shape of the model variable behind `variable`: its own, or the
    whole parameter's for `tfmemopt.ShardedOptimizer`'s partition stand-ins
    (whose `shape` is the partition's)."""
    return tuple(getattr(variable, "whole_shape", variable.shape))


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


def state_prefix(variable) -> str:
    """The name prefix of the state made for `variable` (its path, with
    `/` and `:` replaced)."""
    prefix = (getattr(variable, "path", None) or variable.name).replace(
        "/", "_"
    )
    return prefix.replace(":", "_")


def all_finite(tensors) -> tf.Tensor:
    """True when every tensor of `tensors` is finite (at least one): the
    package's one non-finite count (`distribute/_gradients.py`)."""
    return tf.equal(count_non_finite(list(tensors)), 0.0)


def masked_delta(ok, delta, dtype) -> tf.Tensor:
    """`delta` where `ok`, else zeros, cast to the weight's `dtype`.

    The zero is a scalar that `tf.where` broadcasts: `tf.zeros_like(delta)`
    was folded by Grappler into a constant as large as the weight that
    stayed allocated for the whole run (4 bytes per parameter, measured on
    Adafactor's step: 24.0 -> 18.0 MiB on a 1.58M-parameter MLP).
    """
    return tf.cast(tf.where(ok, delta, tf.zeros([], delta.dtype)), dtype)


def assign_if(variable, value, ok):
    """Writes `value` into `variable` where `ok` (keeps it otherwise)."""
    return variable.assign(tf.where(ok, value, variable), read_value=False)


class StateOptimizer(keras.optimizers.Optimizer):
    """The steps tfmemopt's optimizers share around their own state.

    `build` checks that every variable is float and makes each variable's
    state next to it (`_add_state(variable, prefix)`, with `variable` None
    where Keras overwrites the variable with its gradient); `update_step`
    runs `_update(gradient, variable, target, index, learning_rate)` (which
    returns its writes) after the previous variable's writes on the same
    device (`self._chain`, an `UpdateChain` the subclass makes).
    """

    def build(self, var_list):
        if self.built:
            return
        for var in var_list:
            check_float_variable(type(self).__name__, var)
        super().build(var_list)
        strategy = tf.distribute.get_strategy()
        for var in var_list:
            if self._overwrite_variable_with_gradient(var):
                self._add_state(None, None)
                continue
            with colocated(strategy, var):
                self._add_state(var, state_prefix(var))

    def _add_state(self, variable, prefix) -> None:
        raise NotImplementedError

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        target = raw(variable)
        device = getattr(target, "device", "") or ""
        with tf.control_dependencies(self._chain.deps(device)):
            writes = self._update(
                gradient, variable, target, index, learning_rate
            )
        self._chain.record(device, writes)

    def _update(self, gradient, variable, target, index, learning_rate):
        raise NotImplementedError
