"""Blockwise 8-bit quantisation with a dynamic (non-linear) map.

The scheme of Dettmers et al., "8-bit Optimizers via Block-wise
Quantization" (2022), as bitsandbytes implements it: a tensor is flattened
and cut into blocks of `block_size` values; each block keeps one float32
scale (its largest absolute value) and one 8-bit code per value, an index
into a 256-entry map of numbers in [-1, 1] (signed) or [0, 1] (unsigned).
The map is "dynamic": a decimal exponent and a fraction whose precision
grows with the exponent, so values down to ~1e-7 of the block's maximum are
represented (a linear absmax map would round everything below 1/255 of the
maximum to zero, which makes Adam's second moment diverge).

Everything here is a pure function of tensors; the optimizers own the
variables.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import tensorflow as tf


@functools.lru_cache(maxsize=None)
def dynamic_map(signed: bool) -> np.ndarray:
    """The 256 sorted values of bitsandbytes' `create_dynamic_map`.

    Signed: 127 negative values, 0, 127 positive values and 1.0 (the most
    negative value is -0.99297, as in bitsandbytes). Unsigned: 0, 254 positive
    values and 1.0. The decade 10^(k-7)..10^(k-6) (k = 1..7) holds 2^(k-1)
    values (signed, per sign) or 2^k values (unsigned), each the midpoint of
    an equal split of [0.1, 1] times the decade's power of ten.
    """
    exponent_bits = 7
    data: list[float] = []
    for i in range(exponent_bits):
        items = 2**i + 1 if signed else 2 ** (i + 1) + 1
        bounds = np.linspace(0.1, 1.0, items)
        means = (bounds[:-1] + bounds[1:]) / 2.0
        scale = 10.0 ** (-(exponent_bits - 1) + i)
        data += list(scale * means)
        if signed:
            data += list(-scale * means)
    data += [0.0, 1.0]
    if len(data) != 256:  # pragma: no cover - a bug in the construction
        raise RuntimeError(f"dynamic map has {len(data)} values, not 256")
    return np.sort(np.asarray(data, dtype=np.float32))


@functools.lru_cache(maxsize=None)
def _midpoints(signed: bool) -> np.ndarray:
    qmap = dynamic_map(signed).astype(np.float64)
    return ((qmap[:-1] + qmap[1:]) / 2.0).astype(np.float32)


# Codes are found through the float32 bit pattern: its top 17 bits (sign,
# exponent, 8 mantissa bits) select a bucket of values whose magnitudes span
# a factor of at most 1 + 2^-8 (0.39%), less than the smallest relative gap
# between two neighbouring midpoints of either map (0.71%, unsigned, near
# 1.0). So a bucket holds at most one midpoint: a table gives the code of
# its lowest value, and one comparison with the next midpoint finishes.
# Exactly `searchsorted(midpoints, x, side="left")`, without a binary
# search per element (~10x faster on CPU).
_SHIFT = 15


@functools.lru_cache(maxsize=None)
def _bucket_table(signed: bool) -> tuple[np.ndarray, np.ndarray]:
    mids = _midpoints(signed)
    keys = np.arange(1 << (32 - _SHIFT), dtype=np.uint64)
    low = keys << np.uint64(_SHIFT)
    negative = (keys >> np.uint64(31 - _SHIFT)) & np.uint64(1)
    # a negative bucket's lowest value has the largest magnitude
    low = low | (negative * np.uint64((1 << _SHIFT) - 1))
    lowest = low.astype(np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):
        table = np.searchsorted(mids, lowest, side="left")
    table = np.where(np.isnan(lowest), 0, table).astype(np.uint8)
    extended = np.concatenate([mids, [np.inf]]).astype(np.float32)
    return table, extended


def _nearest_codes(scaled: tf.Tensor, signed: bool) -> tf.Tensor:
    """uint8 index of the nearest map value for each float32 in [-1, 1]."""
    table, extended = _bucket_table(signed)
    bits = tf.bitcast(scaled, tf.uint32)
    keys = tf.cast(tf.bitwise.right_shift(bits, _SHIFT), tf.int32)
    codes = tf.gather(tf.constant(table), keys)
    nxt = tf.gather(tf.constant(extended), tf.cast(codes, tf.int32))
    return codes + tf.cast(scaled > nxt, tf.uint8)


def zero_code(signed: bool) -> int:
    """The code whose map value is 0 (127 signed, 0 unsigned)."""
    return int(np.flatnonzero(dynamic_map(signed) == 0.0)[0])


def num_blocks(size: int, block_size: int) -> int:
    """Blocks needed for `size` values (the last one may be short)."""
    return max(1, math.ceil(int(size) / int(block_size)))


def _blocks(flat: tf.Tensor, size: int, block_size: int) -> tf.Tensor:
    nb = num_blocks(size, block_size)
    pad = nb * block_size - size
    if pad:
        flat = tf.pad(flat, [[0, pad]])
    return tf.reshape(flat, [nb, block_size])


def quantize(
    values: tf.Tensor, block_size: int, signed: bool
) -> tuple[tf.Tensor, tf.Tensor]:
    """Encodes `values` (any shape, float32) blockwise.

    Returns `(codes, absmax)`: uint8 codes of shape `[size]` (the flattened
    values, no padding stored) and float32 scales of shape
    `[ceil(size / block_size)]`. Each value maps to the nearest map entry
    (ties to the lower one) after division by its block's absmax; a block of
    zeros gets absmax 0 and the zero code. The caller keeps non-finite values
    out (a NaN would give NaN scales).
    """
    flat = tf.reshape(tf.cast(values, tf.float32), [-1])
    size = int(flat.shape[0])
    blocks = _blocks(flat, size, block_size)
    absmax = tf.reduce_max(tf.abs(blocks), axis=1)
    safe = tf.where(absmax > 0.0, absmax, tf.ones_like(absmax))
    scaled = tf.reshape(blocks / safe[:, None], [-1])[:size]
    # The number of midpoints below a value is the index of its nearest map
    # entry (ties to the lower one), in [0, 255]: never wraps.
    return _nearest_codes(scaled, signed), absmax


def dequantize(
    codes: tf.Tensor, absmax: tf.Tensor, block_size: int, signed: bool
) -> tf.Tensor:
    """Decodes `quantize`'s output to a flat float32 tensor of `size`."""
    size = int(codes.shape[0])
    qmap = tf.constant(dynamic_map(signed))
    values = tf.gather(qmap, tf.cast(codes, tf.int32))
    blocks = _blocks(values, size, block_size) * absmax[:, None]
    return tf.reshape(blocks, [-1])[:size]


def max_error(signed: bool) -> dict[str, float]:
    """Worst-case decoding errors of the map, relative to the block absmax.

    `absolute`: half the largest gap between neighbouring map values (a value
    anywhere in the block is decoded within this fraction of the absmax).
    `top_decade`: the worst error relative to the value itself for values
    between 0.1 and 1 of the absmax.
    """
    qmap = dynamic_map(signed).astype(np.float64)
    gaps = np.diff(qmap)
    xs = np.linspace(0.1, 1.0, 200001)
    if signed:
        xs = np.concatenate([xs, -xs])
    mids = _midpoints(signed).astype(np.float64)
    decoded = qmap[np.searchsorted(mids, xs, side="left")]
    rel = np.abs(decoded - xs) / np.abs(xs)
    return {"absolute": float(gaps.max() / 2.0), "top_decade": float(rel.max())}
