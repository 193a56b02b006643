"""The 8-bit Adam state: which variables get 8-bit codes, a slot read and
written (codes and scales, or a float32 tensor), and a saved state read
back (re-encoded when the block size, `min_8bit_size` or the Kahan setting
differs)."""

from __future__ import annotations

import warnings

import numpy as np
import tensorflow as tf

from tfmemopt.optimizers import _common
from tfmemopt.optimizers import _quantization as q

LAYOUT_KEY = "tfmemopt_layout"


class State:
    """Per model variable: whether its moments are 8-bit, and their
    variables (codes and absmax per slot, or one float32 tensor per slot).
    A plain object, so neither Keras nor TensorFlow wraps its lists."""

    def __init__(self):
        self.is_8bit = []
        self.slots = []


def size_of(shape) -> int:
    return int(np.prod(tuple(shape), dtype=np.int64))


def is_8bit(size: int, min_8bit_size: int) -> bool:
    """The rule: a variable of `size` elements gets 8-bit codes when it has
    at least `min_8bit_size` (and at least one) elements."""
    return size >= max(min_8bit_size, 1)


def read_slot(slot, eight, signed, shape, block_size):
    if eight:
        codes, absmax = slot
        flat = q.dequantize(
            tf.convert_to_tensor(_common.raw(codes)),
            tf.convert_to_tensor(_common.raw(absmax)),
            block_size,
            signed,
        )
        return tf.reshape(flat, shape)
    return tf.convert_to_tensor(_common.raw(slot))


def write_slot(slot, eight, signed, value, ok, block_size) -> list:
    if eight:
        codes, absmax = slot
        new_codes, new_absmax = q.quantize(value, block_size, signed)
        codes, absmax = _common.raw(codes), _common.raw(absmax)
        return [
            codes.assign(tf.where(ok, new_codes, codes), read_value=False),
            absmax.assign(tf.where(ok, new_absmax, absmax), read_value=False),
        ]
    return [_common.assign_if(_common.raw(slot), value, ok)]


def layout(optimizer) -> np.ndarray:
    # A fourth entry (1) only with Kahan buffers, so that a state saved
    # without them keeps its layout.
    kahan = [1] if optimizer._kahan_variables() else []
    return np.array(
        [
            optimizer.block_size,
            optimizer.min_8bit_size,
            len(optimizer._slot_names),
        ]
        + kahan,
        dtype=np.int64,
    )


def to_store(optimizer, store, values) -> None:
    """Writes `values` (one whole array per variable of `variables`) and
    the state's layout."""
    for i, value in enumerate(values):
        store[str(i)] = value
    store[LAYOUT_KEY] = layout(optimizer)


def from_store(optimizer, store):
    """The saved state as whole arrays, one per variable of `variables`
    in an unsharded build's shapes, re-encoded when the layout differs;
    None (with a warning) when it does not fit."""
    keys = set(store.keys())
    saved = None
    if LAYOUT_KEY in keys:
        saved = np.asarray(store[LAYOUT_KEY]).astype(np.int64)
        keys.discard(LAYOUT_KEY)
    ours = layout(optimizer)
    same = saved is not None and np.array_equal(saved, ours)
    if same and len(keys) == len(optimizer.variables):
        return [np.asarray(store[str(i)]) for i in range(len(keys))]
    slots = len(optimizer._slot_names)
    if saved is None or not optimizer.built or saved[2] != slots:
        # stacklevel 4: the caller of `state_from_store`'s caller.
        warnings.warn(
            f"Skipping variable loading for optimizer '{optimizer.name}': "
            f"the saved state ({len(keys)} variables, layout "
            f"{None if saved is None else saved.tolist()}) does not fit "
            f"this optimizer ({len(optimizer.variables)} variables, layout "
            f"{ours.tolist()}, built={optimizer.built}).",
            stacklevel=4,
        )
        return None
    return _relayout(
        optimizer, store, int(saved[0]), int(saved[1]), len(saved) > 3
    )


def _relayout(optimizer, store, block_size, min_8bit_size, saved_kahan):
    """A state saved with another block size, min_8bit_size or Kahan
    setting, as whole arrays: each moment decoded with the saved layout,
    encoded with ours; Kahan buffers kept, dropped or started at zero."""
    kahan = optimizer._kahan_variables()
    state = optimizer._state
    base = (len(optimizer.variables) - len(optimizer._state_variables())) - len(
        kahan
    )
    values = [np.asarray(store[str(i)]) for i in range(base)]
    k = base
    variables = optimizer._trainable_variables
    for var, eight, slots in zip(variables, state.is_8bit, state.slots):
        if slots is None:
            continue
        shape = _common.whole_shape(var)
        size = int(np.prod(shape, dtype=np.int64))
        saved_eight = is_8bit(size, min_8bit_size)
        for name in optimizer._slot_names:
            signed = name == "m"
            if saved_eight:
                value = q.dequantize(
                    tf.constant(np.asarray(store[str(k)])),
                    tf.constant(np.asarray(store[str(k + 1)])),
                    block_size,
                    signed,
                )
                k += 2
            else:
                value = tf.constant(np.asarray(store[str(k)]))
                k += 1
            if eight:
                codes, absmax = q.quantize(value, optimizer.block_size, signed)
                values += [codes.numpy(), absmax.numpy()]
            else:
                value = tf.cast(tf.reshape(value, shape), tf.float32)
                values.append(value.numpy())
    for var, buffer in zip(variables, optimizer._low.kahan):
        if buffer is None:
            continue
        if saved_kahan:
            values.append(np.asarray(store[str(k)]))
            k += 1
        else:
            shape = _common.whole_shape(var)
            values.append(tf.zeros(shape, buffer.dtype).numpy())
    return values
