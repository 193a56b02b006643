"""Adam and AdamW with blockwise 8-bit moments (bitsandbytes' scheme)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tfmemopt import _compat
from tfmemopt.distribute import StateCut
from tfmemopt.optimizers import _checks
from tfmemopt.optimizers import _common
from tfmemopt.optimizers import _quantization as q
from tfmemopt.optimizers._adam8bit_state import State
from tfmemopt.optimizers._adam8bit_state import from_store
from tfmemopt.optimizers._adam8bit_state import is_8bit
from tfmemopt.optimizers._adam8bit_state import read_slot
from tfmemopt.optimizers._adam8bit_state import size_of
from tfmemopt.optimizers._adam8bit_state import to_store
from tfmemopt.optimizers._adam8bit_state import write_slot
from tfmemopt.optimizers._update_8bit import adam_moments
from tfmemopt.optimizers._update_8bit import compiled_pieces
from tfmemopt.optimizers._update_8bit import compiled_whole


@keras.saving.register_keras_serializable(package="tfmemopt")
class Adam8bit(_common.StateOptimizer):
    """Adam whose two moments are stored as 8-bit codes: ~2 bytes/parameter.

    Keras's `Adam` keeps two float32 moments, 8 bytes per parameter (twice a
    float32 model). Here each moment is flattened into blocks of `block_size`
    values; a block keeps one float32 scale (its largest absolute value) and
    one uint8 code per value, an index into bitsandbytes' 256-entry dynamic
    map (signed for the first moment, unsigned for the second). State:
    `2 + 8 / block_size` bytes per parameter (2.03 at 256), 0.254x Keras's.

    Each step, variable by variable, the moments are decoded to float32, the
    Adam update is made in float32 with Keras's `Adam` formulas, the
    weights move, and the new moments are encoded again, all in one
    XLA-compiled function per variable (its multiply-adds fused). A
    variable above 2^16 elements is updated in pieces of 2^16 in a
    compiled loop, so the float32 temporaries stay under 4 MiB whatever its
    size; the new codes and the weights' delta (6 bytes per parameter of
    the largest variable) are what remains (see docs/optimizers.md for
    measured peaks). Variables smaller than `min_8bit_size` keep float32
    moments, as in bitsandbytes (biases, norms: few bytes, most sensitive);
    with a very large `min_8bit_size` this optimizer is Keras's `Adam`, bit
    for bit.

    A variable whose gradient (or new moments) holds a NaN or Inf keeps its
    weights and state unchanged at that step; under `LossScaleOptimizer`
    the whole step is skipped before reaching here, as usual.

    Sparse gradients (`tf.IndexedSlices`, e.g. from `Embedding`): repeated
    rows are summed first, then the update is Keras's dense one (rows absent
    from the batch still have their moments decayed and still move). With
    `lazy_sparse=True`, only the rows present are updated (their moments,
    weights and weight decay); the others are left alone, like TF1's
    `LazyAdam`.

    Args:
        learning_rate: Float, `LearningRateSchedule` or callable, defaults to
            `0.001`.
        beta_1: Float in [0, 1), defaults to `0.9`.
        beta_2: Float in (0, 1), defaults to `0.999`.
        epsilon: Float >= 0, defaults to `1e-7` (Keras's "epsilon hat").
        amsgrad: Bool, defaults to `False`. The running maximum of the second
            moment is a third 8-bit state.
        block_size: Int >= 1, defaults to `256`. Values per float32 scale.
        min_8bit_size: Int >= 0, defaults to `4096`. Variables with fewer
            elements keep float32 moments.
        lazy_sparse: Bool, defaults to `False`. See above.
        weight_decay, clipnorm, clipvalue, global_clipnorm, use_ema,
            ema_momentum, ema_overwrite_frequency, loss_scale_factor, name:
            as in `keras.optimizers.Adam`.
        {bf16_args}
        gradient_accumulation_steps: refused; use `tfmemopt.Model(...,
            accumulation_steps=N)` or `tfmemopt.AccumulatingOptimizer`.

    Example:

    >>> import keras, numpy as np, tfmemopt
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> model.compile(tfmemopt.optimizers.Adam8bit(min_8bit_size=0), "mse")
    >>> _ = model.fit(np.ones((8, 4)), np.ones((8, 2)), verbose=0)
    """

    def __init__(
        self,
        learning_rate=0.001,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-7,
        amsgrad=False,
        block_size=256,
        min_8bit_size=4096,
        lazy_sparse=False,
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
        name_ = type(self).__name__
        _checks.refuse_keras_accumulation(name_, gradient_accumulation_steps)
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
        self.beta_1 = _checks.check_open_unit("beta_1", beta_1, True)
        self.beta_2 = _checks.check_open_unit("beta_2", beta_2)
        self.epsilon = _checks.check_nonnegative_float("epsilon", epsilon)
        self.amsgrad = bool(amsgrad)
        self.block_size = _checks.check_positive_int("block_size", block_size)
        self.min_8bit_size = _checks.check_nonnegative_int(
            "min_8bit_size", min_8bit_size
        )
        self.lazy_sparse = bool(lazy_sparse)
        self._state = State()
        self._chain = _common.UpdateChain()

    # -- state ---------------------------------------------------------------

    @property
    def _slot_names(self):
        return ("m", "v", "vhat") if self.amsgrad else ("m", "v")

    def uses_8bit(self, shape) -> bool:
        """Whether a variable of `shape` keeps 8-bit codes (else float32
        moments). The one place this is decided: the state it builds, its
        bytes, `ShardedOptimizer`'s cut and the estimator all ask here. The
        whole parameter's shape decides, also for a partition of it."""
        return is_8bit(size_of(shape), self.min_8bit_size)

    def _uses_8bit(self, variable) -> bool:
        return self.uses_8bit(_common.whole_shape(variable))

    def _add_state(self, variable, prefix):
        if variable is None:
            self._state.is_8bit.append(None)
            self._state.slots.append(None)
            return
        size = int(np.prod(variable.shape, dtype=np.int64))
        eight = self._uses_8bit(variable)
        slots = []
        for slot in self._slot_names:
            if eight:
                slots.append(
                    (
                        self._add_codes(size, slot, prefix),
                        self.add_variable(
                            (q.num_blocks(size, self.block_size),),
                            dtype="float32",
                            name=f"{prefix}_{slot}_absmax",
                        ),
                    )
                )
            else:
                slots.append(
                    self.add_variable(
                        tuple(variable.shape),
                        dtype="float32",
                        name=f"{prefix}_{slot}",
                    )
                )
        self._state.is_8bit.append(eight)
        self._state.slots.append(slots)

    def _add_codes(self, size, slot, prefix):
        """The uint8 codes of `slot`, all the map's zero. Across workers
        (MultiWorkerMirroredStrategy) each worker makes them itself: the
        strategy would broadcast the chief's initial value, and TensorFlow's
        broadcast takes no uint8. They are a constant, alike everywhere."""
        strategy = tf.distribute.get_strategy()
        with _compat.local_initial_values(strategy):
            return self.add_variable(
                (size,),
                initializer=keras.initializers.Constant(
                    q.zero_code(slot == "m")
                ),
                dtype="uint8",
                name=f"{prefix}_{slot}_codes",
            )

    def variable_state_bytes(self, shape, dtype="float32") -> int:
        """Bytes of moments this optimizer keeps for a variable of `shape`
        (EMA copies aside): codes and scales, or float32 moments below
        `min_8bit_size`, and a Kahan buffer (`bf16_update="kahan"`, 16-bit
        `dtype`). Used by `tfmemopt.estimate_memory`."""
        size = size_of(shape)
        slots = len(self._slot_names)
        write = self.write_state_bytes(shape, dtype)
        if self.uses_8bit(shape):
            blocks = q.num_blocks(size, self.block_size)
            return slots * (size + 4 * blocks) + write
        return slots * 4 * size + write

    # -- tfmemopt.ShardedOptimizer ------------------------------------------

    def shard_alignment(self, shape) -> int:
        """Elements that a partition boundary of a variable of `shape` is a
        multiple of, for `tfmemopt.ShardedOptimizer`: `block_size` for an
        8-bit variable, so each replica's blocks are whole blocks of the
        unsharded state (the same codes and scales), 1 otherwise."""
        return self.block_size if self.uses_8bit(shape) else 1

    def shard_state(self) -> list:
        """How `tfmemopt.ShardedOptimizer` cuts this state, after a build on
        its partition stand-ins: a `StateCut(variable, index, whole_shape,
        per_entry)` for each state variable.
        Codes and float32 moments hold one entry per element of the
        partition; scales one per `block_size` elements (one per block)."""
        out = []
        state = self._state
        for index, (var, eight, slots) in enumerate(
            zip(self._trainable_variables, state.is_8bit, state.slots)
        ):
            if slots is None:
                continue
            shape = _common.whole_shape(var)
            size = int(np.prod(shape, dtype=np.int64))
            for slot in slots:
                if eight:
                    out.append(StateCut(slot[0], index, (size,), 1))
                    blocks = (q.num_blocks(size, self.block_size),)
                    out.append(
                        StateCut(slot[1], index, blocks, self.block_size)
                    )
                else:
                    out.append(StateCut(slot, index, shape, 1))
        return out

    def _state_variables(self) -> list:
        out = []
        for slots in self._state.slots:
            for slot in slots or ():
                out.extend(slot if isinstance(slot, tuple) else (slot,))
        return out

    # -- update --------------------------------------------------------------

    def _lazy_gradient(self, gradient) -> bool:
        return self.lazy_sparse and isinstance(gradient, tf.IndexedSlices)

    def _update(self, gradient, variable, target, index, learning_rate):
        eight = self._state.is_8bit[index]
        slots = self._state.slots[index]
        f32 = tf.float32
        lr = tf.cast(learning_rate, f32)
        step = tf.cast(self.iterations + 1, f32)
        b1 = tf.cast(self.beta_1, f32)
        b2 = tf.cast(self.beta_2, f32)
        alpha = lr * tf.sqrt(1 - tf.pow(b2, step)) / (1 - tf.pow(b1, step))
        lazy = self._lazy_gradient(gradient)
        if eight and not lazy:
            return self._update_8bit(
                gradient, variable, target, index, slots, alpha
            )
        return self._update_whole(
            gradient, variable, target, index, slots, eight, alpha, lazy
        )

    # Elements per piece of a large 8-bit variable: XLA keeps about 14
    # float32 temporaries per piece, so they stay under 4 MiB whatever the
    # variable's size. Measured on a 5.3M-parameter MLP (one step's peak,
    # Keras AdamW 112.6 MiB): 2^16 71.7, 2^17 73.4, 2^18 81.3, 2^20 125.7,
    # one piece 120.3 MiB; step time within 10% from 2^16 to one piece.
    _CHUNK = 2**16

    def _chunks(self, shape):
        """`(piece, pieces)`: a variable above `_CHUNK` elements is updated
        in `pieces` flat pieces of `piece` elements (a multiple of
        `block_size`, so each piece holds whole blocks) and the rest; None
        for one piece."""
        size = int(np.prod(shape, dtype=np.int64))
        piece = max(1, self._CHUNK // self.block_size) * self.block_size
        if size <= piece:
            return None
        return piece, size // piece

    def _update_8bit(self, gradient, variable, target, index, slots, alpha):
        """The dense 8-bit update: one compiled function, in one piece
        (`compiled_whole`) or a piece at a time in a compiled loop
        (`compiled_pieces`, above `_CHUNK` elements). The weights get one
        dense `assign_sub` (a partial write would switch a weight to
        TensorFlow's copy-on-read mode, and every forward pass would copy
        it)."""
        grad = _common.densify(gradient, variable)
        device = getattr(target, "device", "") or ""
        local = [
            (_common.local(c, device), _common.local(a, device))
            for c, a in slots
        ]
        bounds = self._chunks(tuple(variable.shape))
        if bounds is None:
            step = compiled_whole(self._hyper())
        else:
            step = compiled_pieces(
                self._hyper(), *bounds, in_place=_compat.in_xla_function()
            )
        codes, absmax, delta = step(
            tf.reshape(tf.cast(grad, tf.float32), [-1]),
            [tf.convert_to_tensor(c) for c, _ in local],
            [tf.convert_to_tensor(a) for _, a in local],
            alpha,
        )
        delta = tf.reshape(delta, variable.shape)
        writes = self._write_weight(variable, target, index, delta)
        for (c_var, a_var), c, a in zip(local, codes, absmax):
            writes.append(c_var.assign(c, read_value=False))
            writes.append(a_var.assign(a, read_value=False))
        return writes

    def _update_whole(
        self, gradient, variable, target, index, slots, eight, alpha, lazy
    ):
        """Float32 moments, or lazy sparse rows of 8-bit ones."""
        f32 = tf.float32
        shape = tuple(variable.shape)
        state = [
            read_slot(slot, eight, name == "m", shape, self.block_size)
            for slot, name in zip(slots, self._slot_names)
        ]
        if lazy:
            rows, grad = _common.dedup_rows(gradient)
            grad = tf.cast(grad, f32)
            rows_2d = rows[:, None]
            old = [tf.gather(s, rows) for s in state]
        else:
            grad = tf.cast(_common.densify(gradient, variable), f32)
            old = state
        new = self._adam(grad, old)
        delta = alpha * new[0] / (tf.sqrt(new[-1]) + self.epsilon)
        ok = _common.all_finite([delta] + new)
        if lazy:
            new = [
                tf.tensor_scatter_nd_update(s, rows_2d, n)
                for s, n in zip(state, new)
            ]
        writes = self._write_weight(
            variable, target, index, delta, ok, rows if lazy else None
        )
        for slot, name, value in zip(slots, self._slot_names, new):
            writes += write_slot(
                slot, eight, name == "m", value, ok, self.block_size
            )
        return writes

    def _hyper(self) -> tuple:
        return (
            self.block_size,
            tuple(name == "m" for name in self._slot_names),
            float(self.beta_1),
            float(self.beta_2),
            float(self.epsilon),
        )

    def _adam(self, grad, old):
        return adam_moments(grad, old, self.beta_1, self.beta_2, self.amsgrad)

    # -- saving --------------------------------------------------------------

    def save_own_variables(self, store):
        self.state_to_store(store, [v.numpy() for v in self.variables])

    def load_own_variables(self, store):
        values = self.state_from_store(store)
        if values is not None:
            for variable, value in zip(self.variables, values):
                variable.assign(value)

    def state_to_store(self, store, values):
        """Writes `values` (one whole array per variable of `variables`,
        as an unsharded build holds it) and the state's layout. Also used by
        `tfmemopt.ShardedOptimizer`, which gathers the values first."""
        to_store(self, store, values)

    def state_from_store(self, store):
        """The saved state as whole arrays, one per variable of `variables`
        in an unsharded build's shapes, re-encoded when the block size or
        `min_8bit_size` differs; None (with a warning) when it does not fit.
        """
        return from_store(self, store)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "amsgrad": self.amsgrad,
                "block_size": self.block_size,
                "min_8bit_size": self.min_8bit_size,
                "lazy_sparse": self.lazy_sparse,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="tfmemopt")
class AdamW8bit(Adam8bit):
    """AdamW (decoupled weight decay) with blockwise 8-bit moments.

    `Adam8bit` with Keras's `AdamW` weight decay: before each update,
    `w -= w * weight_decay * learning_rate` (exactly as `keras.optimizers.
    AdamW`), excluded variables as set by `exclude_from_weight_decay`.

    Args:
        weight_decay: Float, defaults to `0.004` (Keras's AdamW default).
        Others: as `Adam8bit`.

    Example:

    >>> import tfmemopt
    >>> opt = tfmemopt.optimizers.AdamW8bit(1e-3, weight_decay=0.01)
    """

    # After `weight_decay`, the arguments (positional ones too) are
    # Adam8bit's in its order: beta_1, beta_2, epsilon, amsgrad, block_size,
    # min_8bit_size, lazy_sparse.
    _POSITIONAL = 7

    def __init__(
        self, learning_rate=0.001, weight_decay=0.004, *args, **kwargs
    ):
        if weight_decay is None:
            raise ValueError(
                "`weight_decay` must be a float for AdamW8bit. Received: "
                "weight_decay=None. Use Adam8bit for no weight decay."
            )
        if len(args) > self._POSITIONAL:
            raise TypeError(
                f"AdamW8bit takes at most {self._POSITIONAL + 2} positional "
                f"arguments; received {len(args) + 2}. Pass the others by "
                "keyword, e.g. clipnorm=1.0."
            )
        super().__init__(
            learning_rate, *args, weight_decay=weight_decay, **kwargs
        )
