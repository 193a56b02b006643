"""Pieces shared by tfmemopt's optimizers: sparse gradients,
one-variable-at-a-time ordering of the update temporaries, and
`StateOptimizer`, the steps around their own state and the one weight
write (argument checks: `_checks.py`)."""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf

from tfmemopt import _compat
from tfmemopt._protocols import OffsetInParameter
from tfmemopt._protocols import PartOfParameter
from tfmemopt.distribute import count_non_finite
from tfmemopt.optimizers import _low_precision as lp
from tfmemopt.optimizers._checks import check_float_variable
from tfmemopt.optimizers._checks import check_nonnegative_int


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
    if isinstance(variable, PartOfParameter):
        return tuple(variable.whole_shape)
    return tuple(variable.shape)


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


class _LowPrecision:
    """Per model variable: its Kahan compensation buffer or None. A plain
    object, so neither Keras nor TensorFlow wraps its list."""

    def __init__(self):
        self.kahan = []
        # `_var_key`s of the variables whose weight decay the weight write
        # makes (lazy sparse rows), set by `apply`.
        self.lazy_decay = frozenset()


# The arguments every `StateOptimizer` takes, documented once: a subclass
# writes `{bf16_args}` on a line of its docstring's `Args:`, indented
# as the other arguments (`StateOptimizer.__init_subclass__`).
BF16_ARGS_DOC = """\
bf16_update: `None` (default), `"stochastic"`, `"kahan"` or
    `"plain"`: how the float32 step is written into bfloat16 (or
    float16) weights; float32 weights are unchanged by it, bit for
    bit. `None` and `"stochastic"`: stochastic rounding (bfloat16
    only; float16 is refused); `"kahan"`: a compensation buffer of
    the weight's dtype per weight (2 bytes per parameter, in
    `variables`); `"plain"`: round to nearest, which loses updates
    under half a bfloat16 ulp (lossy). Their weight decay is applied
    in float32 inside the step; with `use_ema=True` their moving
    averages are float32 (4 bytes per parameter) and move in
    float32. See docs/optimizers.md.
bf16_seed: Int >= 0, defaults to `0`. Seed of the stochastic
    rounding's bits (hashed with the step, the variable's index and
    the element's index: the same on every replica and on resume)."""


class StateOptimizer(keras.optimizers.Optimizer):
    """The steps tfmemopt's optimizers share around their own state.

    `build` checks that every variable is float and makes each variable's
    state next to it (`_add_state(variable, prefix)`, with `variable` None
    where Keras overwrites the variable with its gradient); `update_step`
    runs `_update(gradient, variable, target, index, learning_rate)` (which
    returns its writes) after the previous variable's writes on the same
    device (`self._chain`, an `UpdateChain` the subclass makes).

    The step is made in float32 and written into the weight in one place,
    `_write_weight`: float32 weights by `assign_sub` (Keras's write), bfloat16
    ones as `bf16_update` says (`_low_precision.py`), with their weight decay
    folded into the float32 step (Keras decays them in bfloat16, where
    `w * wd * lr` is under half an ulp and lost).
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        doc = cls.__dict__.get("__doc__")
        if doc and "{bf16_args}" in doc:
            line = next(x for x in doc.splitlines() if "{bf16_args}" in x)
            indent = line[: len(line) - len(line.lstrip())]
            text = "\n".join(
                indent + x if x else x for x in BF16_ARGS_DOC.splitlines()
            )
            cls.__doc__ = doc.replace(indent + "{bf16_args}", text)

    def __init__(self, *args, bf16_update=None, bf16_seed=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.bf16_update = lp.check_bf16_update(bf16_update)
        self.bf16_seed = check_nonnegative_int("bf16_seed", bf16_seed)
        self._low = _LowPrecision()

    def build(self, var_list):
        if self.built:
            return
        for var in var_list:
            check_float_variable(type(self).__name__, var)
            self._check_low_precision(var)
        super().build(var_list)
        strategy = tf.distribute.get_strategy()
        for var in var_list:
            if self._overwrite_variable_with_gradient(var):
                self._add_state(None, None)
                continue
            with colocated(strategy, var):
                self._add_state(var, state_prefix(var))
        # After all other state, so that the state's order is unchanged
        # without Kahan buffers.
        self._low.kahan = []
        for var in var_list:
            kahan = None
            if not self._overwrite_variable_with_gradient(var) and (
                lp.mode_for(self.bf16_update, var.dtype) == "kahan"
            ):
                with colocated(strategy, var):
                    kahan = self.add_variable_from_reference(var, "kahan")
            self._low.kahan.append(kahan)

    def _check_low_precision(self, variable) -> None:
        dtype = tf.as_dtype(keras.backend.standardize_dtype(variable.dtype))
        if (
            dtype == tf.float16
            and lp.mode_for(self.bf16_update, dtype) == "stochastic"
        ):
            name = getattr(variable, "path", None) or variable.name
            raise TypeError(
                f"{type(self).__name__} cannot round the float16 variable "
                f"'{name}' stochastically (bf16_update="
                f"{self.bf16_update!r}; stochastic rounding is made for "
                "bfloat16 weights). Pass bf16_update='kahan' (a float16 "
                "compensation buffer per weight) or 'plain' (round to "
                "nearest, lossy), or keep float32 weights with the "
                "'mixed_float16' policy."
            )

    def _add_state(self, variable, prefix) -> None:
        raise NotImplementedError

    # -- EMA of 16-bit weights -----------------------------------------------

    def add_variable_from_reference(
        self, reference_variable, name=None, initializer="zeros"
    ):
        """Keras's, except the EMA averages (`use_ema=True`) of bfloat16
        and float16 weights: those are float32. A 16-bit average moves by
        `(1 - ema_momentum) * (w - average)`, under half an ulp of it once
        the weights settle, so it would stall."""
        dtype = keras.backend.standardize_dtype(reference_variable.dtype)
        if not (
            name == "average" and self.use_ema and tf.as_dtype(dtype) in lp.LOW
        ):
            return super().add_variable_from_reference(
                reference_variable, name=name, initializer=initializer
            )
        path = getattr(reference_variable, "path", None)
        label = f"{path.replace('/', '_')}_{name}" if path else name
        target = getattr(reference_variable, "value", reference_variable)
        strategy = tf.distribute.get_strategy()
        with strategy.extended.colocate_vars_with(target):
            return self.add_variable(
                tuple(reference_variable.shape),
                initializer=initializer,
                dtype="float32",
                name=label,
            )

    def _update_model_variables_moving_average(self, trainable_variables):
        # Keras's EMA step, in float32: Keras casts `ema_momentum` to the
        # weight's dtype (bfloat16(0.99) == 0.98828125) and multiplies in
        # it. For float32 weights the same ops in the same order as Keras.
        if not self.use_ema:
            return
        f32 = tf.float32
        first = tf.equal(self.iterations, 0)
        momentum = tf.cast(tf.logical_not(first), f32) * self.ema_momentum
        for var, average in zip(trainable_variables, _compat.ema_slots(self)):
            if average is None:
                continue
            value = momentum * tf.cast(average, f32) + (1 - momentum) * (
                tf.cast(var, f32)
            )
            average.assign(tf.cast(value, average.dtype))

    def _overwrite_model_variables_with_average_value(
        self, trainable_variables
    ):
        # Keras's, with the float32 average of a 16-bit weight cast to the
        # weight's dtype (Keras's TensorFlow `assign` refuses the mismatch).
        averages = _compat.ema_slots(self)
        if all(
            a is None or a.dtype == v.dtype
            for v, a in zip(trainable_variables, averages)
        ):
            return super()._overwrite_model_variables_with_average_value(
                trainable_variables
            )
        strategy = _compat.optimizer_strategy(
            self, tf.distribute.get_strategy()
        )
        for var, average in zip(trainable_variables, averages):
            if average is None:
                continue
            target = var.value if isinstance(var, keras.Variable) else var
            strategy.extended.update(
                target,
                lambda a, b: a.assign(tf.cast(b, a.dtype)),
                args=(average,),
            )

    def write_state_bytes(self, shape, dtype="float32") -> int:
        """Bytes the weight write keeps for a variable of `shape` and
        `dtype`: its Kahan buffer (the variable's own size) with
        `bf16_update="kahan"` on a 16-bit variable, else 0."""
        dtype = tf.as_dtype(keras.backend.standardize_dtype(dtype))
        if lp.mode_for(self.bf16_update, dtype) != "kahan":
            return 0
        size = 1
        for d in shape:
            size *= int(d)
        return size * dtype.size

    def _kahan_variables(self) -> list:
        return [k for k in self._low.kahan if k is not None]

    # -- the weight write ----------------------------------------------------

    def folds_weight_decay(self, variable) -> bool:
        """Whether this optimizer applies `variable`'s weight decay inside
        its float32 step (bfloat16 and float16 weights, and variables
        updated as lazy sparse rows, whose absent rows are not decayed)
        instead of Keras's decay of the whole variable in its dtype.
        `ShardedOptimizer` asks it."""
        return lp.mode_for(
            self.bf16_update, variable.dtype
        ) is not None or self._decays_lazily(variable)

    def _decays_lazily(self, variable) -> bool:
        keys = self._low.lazy_decay
        return bool(keys) and _compat.var_key(self, variable) in keys

    def _lazy_gradient(self, gradient) -> bool:
        """Whether `gradient` updates only its rows (`lazy_sparse`)."""
        return False

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
        variables = trainable_variables
        if variables is None and self.built:
            variables = _compat.trainable_variables_of(self)
        keys = frozenset()
        if variables is not None and self.weight_decay is not None:
            keys = frozenset(
                _compat.var_key(self, v)
                for g, v in zip(grads, variables)
                if self._lazy_gradient(g)
            )
        # Kept after the step (not reset): Keras's decay and the weight
        # write read it at different times, in each replica's thread under
        # MirroredStrategy, and both must see the same set.
        self._low.lazy_decay = keys
        return super().apply(grads, trainable_variables)

    def _apply_weight_decay(self, variables):
        if self.weight_decay is None:
            return
        super()._apply_weight_decay(
            [v for v in variables if not self.folds_weight_decay(v)]
        )

    def _decay(self, variable):
        """`(weight_decay, learning_rate)` as float32 scalars where Keras
        would decay `variable`, else None."""
        if self.weight_decay is None or not _compat.uses_weight_decay(
            self, variable
        ):
            return None
        rate = tf.cast(self.learning_rate, tf.float32)
        return tf.cast(self.weight_decay, tf.float32), rate

    def _write_weight(self, variable, target, index, delta, ok=None, rows=None):
        """Subtracts the float32 `delta` from the weight, where `ok` (a
        scalar; None when `delta` is already masked), at `rows` (lazy sparse
        rows, else the whole weight). Returns the writes."""
        mode = lp.mode_for(self.bf16_update, target.dtype)
        if mode is None:
            if ok is None:
                delta = tf.cast(delta, target.dtype)
            else:
                delta = masked_delta(ok, delta, target.dtype)
            decay = self._decay(variable)
            if decay is not None and self._decays_lazily(variable):
                # Only the rows present decay (also at a skipped step).
                w = tf.convert_to_tensor(target)
                w = w if rows is None else tf.gather(w, rows)
                rate = tf.cast(decay[0] * decay[1], target.dtype)
                delta = delta + w * rate
            if rows is not None:
                return [target.scatter_sub(tf.IndexedSlices(delta, rows))]
            return [target.assign_sub(delta, read_value=False)]
        w = tf.convert_to_tensor(target)
        kahan = self._low.kahan[index] if self._low.kahan else None
        comp = None
        if kahan is not None:
            kahan = local(kahan, getattr(target, "device", "") or "")
            comp = tf.convert_to_tensor(kahan)
        ids = None
        if rows is not None:
            ids = self._element_ids(variable, tuple(w.shape))
            w = tf.gather(w, rows)
            ids = tf.gather(ids, rows)
            comp = None if comp is None else tf.gather(comp, rows)
        delta = tf.cast(delta, tf.float32)
        if ok is not None:
            delta = tf.where(ok, delta, tf.zeros([], tf.float32))
        # As Keras's decay, applied also when the step is skipped.
        decay = self._decay(variable)
        key = lp.stream_key(self.bf16_seed, self.iterations + 1, index)
        if rows is None:
            zero = tf.zeros([], tf.float32)
            out = lp.compiled_new_weight(mode, decay is not None)(
                w,
                delta,
                w if comp is None else comp,
                key,
                tf.constant(self._element_offset(variable), tf.int32),
                decay or (zero, zero),
            )
            new, new_comp = out if comp is not None else (out, None)
        else:
            new, new_comp = lp.new_weight(mode, w, delta, comp, key, ids, decay)
        if rows is None:
            writes = [target.assign(new, read_value=False)]
            if new_comp is not None:
                writes.append(kahan.assign(new_comp, read_value=False))
            return writes
        rows_2d = rows[:, None]
        writes = [target.scatter_update(tf.IndexedSlices(new, rows))]
        if new_comp is not None:
            full = tf.tensor_scatter_nd_update(
                tf.convert_to_tensor(kahan), rows_2d, new_comp
            )
            writes.append(kahan.assign(full, read_value=False))
        return writes

    @staticmethod
    def _element_offset(variable) -> int:
        """Where `variable` starts in the whole parameter: 0, or a
        `ShardedOptimizer` partition's `element_offset`. The rounding bits
        are drawn per element of the whole parameter."""
        if isinstance(variable, OffsetInParameter):
            return int(variable.element_offset)
        return 0

    def _element_ids(self, variable, shape):
        """Each element's index in the whole parameter."""
        size = 1
        for d in shape:
            size *= int(d)
        start = self._element_offset(variable)
        return tf.reshape(tf.range(start, start + size), shape)

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

    def get_config(self):
        config = super().get_config()
        config["bf16_update"] = self.bf16_update
        config["bf16_seed"] = self.bf16_seed
        return config
