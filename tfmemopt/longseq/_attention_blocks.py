"""What both paths of chunked attention share (`_attention` without XLA,
`_attention_xla` under it): the block shape, the scores of one block and
the loop over blocks."""

from __future__ import annotations

import tensorflow as tf

# Scores (batch x heads x query rows x key columns) per block: 1 Mi floats,
# 4 MiB a copy (the backward pass holds about five).
DEFAULT_BLOCK_ELEMENTS = 1 << 20
# Fewest query rows per block before the keys are cut into blocks too.
MIN_ROWS = 64


def _large_negative(dtype) -> float:
    # Keras's value (keras/src/backend/tensorflow/nn.py, the score dtype is
    # float32 here): -0.7 times the largest float.
    return -0.7 * 3.38953e38


def _block_shape(query, key, block_elements):
    """Query rows and key columns per block, as scalar tensors."""
    shape_q = tf.shape(query)
    t_len, s_len = shape_q[1], tf.shape(key)[1]
    heads = tf.maximum(shape_q[0] * shape_q[2], 1)
    whole = block_elements // tf.maximum(heads * s_len, 1)
    least = tf.minimum(t_len, MIN_ROWS)
    rows = tf.where(whole >= least, tf.minimum(whole, t_len), least)
    rows = tf.maximum(rows, 1)
    cols = tf.where(
        whole >= least,
        s_len,
        tf.clip_by_value(block_elements // (heads * rows), 1, s_len),
    )
    return rows, tf.maximum(cols, 1)


def _scores(q_blk, k_blk, block_mask, scale, soft_cap=None):
    s = tf.einsum("BTNH,BSNH->BNTS", q_blk, k_blk)
    s = tf.cast(s, tf.float32) * scale
    if soft_cap is not None:  # Gemma 2: cap * tanh(s / cap), then the mask
        s = soft_cap * tf.tanh(s / soft_cap)
    if block_mask is not None:
        s = tf.where(block_mask, s, _large_negative(s.dtype))
    return s


def _through_soft_cap(ds, s, soft_cap):
    """The gradient `ds` of capped scores `s` taken back through the cap:
    times `1 - tanh^2 = 1 - (s / cap)^2`. Masked and padded scores (a large
    negative number, -inf) are outside (-cap, cap): clipped to a factor of
    0, never inf * 0."""
    if soft_cap is None:
        return ds
    t = tf.clip_by_value(s / soft_cap, -1.0, 1.0)
    return ds * (1.0 - tf.square(t))


def _loop(n, body, loop_vars, invariants, start=None):
    return tf.while_loop(
        lambda i, *_: i < n,
        body,
        [tf.constant(0) if start is None else start, *loop_vars],
        shape_invariants=[tf.TensorShape([]), *invariants],
        parallel_iterations=1,
    )[1:]
