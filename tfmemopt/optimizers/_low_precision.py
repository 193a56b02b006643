"""Low-precision weights: the one write of a float32 step into a bfloat16
(or float16) weight.

tfmemopt's optimizers make their step in float32. A float32 weight takes it
as before (`assign_sub`, bit for bit). A bfloat16 weight has 8 bits of
mantissa: rounding `w - delta` to the nearest bfloat16 drops every step
under half an ulp of the weight (about 2e-3 of it), so small updates are
lost (Zamirai et al., 2020). Two unbiased writes keep them:

- "stochastic": `w - delta` is rounded up or down at random with the
  probabilities that make the expected bfloat16 value the float32 one. The
  16 random bits per element are a hash of (seed, step, variable index,
  element index in the whole variable): no random state, the same bits on
  every replica, in a resumed run and for a `ShardedOptimizer` partition as
  for the whole variable.
- "kahan": a bfloat16 compensation buffer per weight keeps what the last
  rounding lost and adds it to the next step (2 bytes per parameter).
- "plain": round to nearest (lossy; kept for comparison).
"""

from __future__ import annotations

import functools

import tensorflow as tf

MODES = ("stochastic", "kahan", "plain")
LOW = (tf.bfloat16, tf.float16)


def check_bf16_update(value):
    """`bf16_update`, checked: None or one of `MODES`."""
    if value is None or (isinstance(value, str) and value in MODES):
        return value
    raise ValueError(
        "`bf16_update` must be None, 'stochastic', 'kahan' or 'plain'. "
        f"Received: bf16_update={value!r}. None (the default) rounds "
        "bfloat16 weights stochastically and leaves float32 weights as "
        "they are."
    )


def mode_for(bf16_update, dtype) -> str | None:
    """The write used for a weight of `dtype`: None for float32/float64
    (Keras's `assign_sub`), else the chosen mode (None -> stochastic)."""
    if tf.as_dtype(dtype) not in LOW:
        return None
    return bf16_update or "stochastic"


def _u32(value):
    return tf.constant(value, tf.uint32)


def hash32(x):
    """A bijective integer hash of uint32 `x` (Wellons' lowbias32): every
    input bit flips about half of the output bits."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))
    x = x * _u32(0x7FEB352D)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(15)))
    x = x * _u32(0x846CA68B)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u32(16)))


def stream_key(seed: int, step, index: int):
    """A uint32 key from the seed, the step (`iterations + 1`, a tensor)
    and the variable's index."""
    key = hash32(_u32(seed & 0xFFFFFFFF))
    key = hash32(key + tf.cast(step, tf.uint32))
    return hash32(key + _u32((index * 0x9E3779B9) & 0xFFFFFFFF))


def random16(key, element_ids):
    """16 random bits (int32 in [0, 65536)) per element, from the key and
    each element's index in the whole variable (int tensor)."""
    bits = hash32(hash32(tf.cast(element_ids, tf.uint32) + key))
    return tf.cast(tf.bitwise.right_shift(bits, _u32(16)), tf.int32)


def stochastic_round_bf16(x, bits16):
    """float32 `x` rounded to bfloat16, away from zero with the probability
    of its 16 dropped bits read as a fraction (then truncated).

    A float32 is [sign, 8 exponent, 23 mantissa bits]; bfloat16 keeps the
    top 16. Adding a uniform 16-bit number to the bit pattern carries into
    bit 16 with probability (low 16 bits) / 2^16, which moves the magnitude
    one bfloat16 ulp away from zero (the carry runs into the exponent at a
    power of two, as it should); masking the low bits then truncates. A
    value already a bfloat16 is unchanged, whatever the bits.
    """
    raw = tf.bitwise.bitwise_and(
        tf.bitcast(x, tf.int32) + bits16, tf.constant(-65536, tf.int32)
    )
    return tf.cast(tf.bitcast(raw, tf.float32), tf.bfloat16)


def new_weight(
    mode, w, delta, comp=None, key=None, element_ids=None, decay=None
):
    """The weight `w` (low precision) after subtracting float32 `delta`
    (and `w * weight_decay * learning_rate` with `decay`, a pair of float32
    scalars, as Keras's decay), and the new compensation (mode "kahan",
    else None).

    "kahan": `u = comp - delta` is added to `w` and rounded to nearest;
    what that rounding lost, `u - (new - w)`, is the new compensation
    (the difference of two nearby weights is exact in float32).
    """
    w32 = tf.cast(w, tf.float32)
    if decay is not None:
        delta = delta + w32 * decay[0] * decay[1]
    if mode == "kahan":
        u = tf.cast(comp, tf.float32) - delta
        new = tf.cast(w32 + u, w.dtype)
        lost = u - (tf.cast(new, tf.float32) - w32)
        return new, tf.cast(lost, comp.dtype)
    if mode == "stochastic":
        bits = random16(key, element_ids)
        return stochastic_round_bf16(w32 - delta, bits), None
    return tf.cast(w32 - delta, w.dtype), None


@functools.lru_cache(maxsize=None)
def compiled_new_weight(mode: str, decays: bool = False):
    """`new_weight` for a whole weight as one XLA-compiled function
    `step(w, delta, comp, key, offset)`, returning the new weight (and the
    new compensation with "kahan"; the element indices are made inside,
    from `offset`): its 10-25 element-wise ops fuse into one loop instead
    of one kernel each, and the weight decay's float32 temporaries (three
    weight-sized tensors as plain ops) are never made. Integer hashing and
    single float32 additions round the same in XLA, so without decay the
    plain and compiled results are equal (with it, XLA may fuse the decay's
    multiply-add: one rounding less)."""

    def step(w, delta, comp, key, offset, decay):
        ids = None
        if mode == "stochastic":
            size = tf.size(w, out_type=tf.int32)
            ids = tf.reshape(tf.range(size) + offset, tf.shape(w))
        new, new_comp = new_weight(
            mode, w, delta, comp, key, ids, decay if decays else None
        )
        # One output without a buffer: a second weight-sized result would
        # be one more allocation at the update's peak.
        return new if new_comp is None else (new, new_comp)

    return tf.function(step, jit_compile=True, autograph=False)
