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


def large_negative(dtype) -> float:
    # Keras's value (keras/src/backend/tensorflow/nn.py, the score dtype is
    # float32 here): -0.7 times the largest float.
    return -0.7 * 3.38953e38


def block_shape(query, key, block_elements):
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


def _grouped(x, axis: int, groups: int):
    """`x` with its heads axis `axis` (`N = K * groups`) split in two,
    `(K, groups)`: query head `n` is `(n // groups, n % groups)`, so it
    reads key/value head `n // groups`, keras-hub's order (`ops.repeat` of
    the shared heads; Gemma's reshape of the queries)."""
    shape = tf.shape(x)
    return tf.reshape(
        x, tf.concat([shape[:axis], [-1, groups], shape[axis + 1 :]], 0)
    )


def _merged(x, axis: int):
    """`_grouped` undone: axes `axis, axis + 1` merged back into heads."""
    shape = tf.shape(x)
    return tf.reshape(
        x,
        tf.concat(
            [shape[:axis], [shape[axis] * shape[axis + 1]], shape[axis + 2 :]],
            0,
        ),
    )


# The four products of attention with `N = K * groups` query heads and `K`
# shared key/value heads (grouped-query attention), in blocks. The shared
# heads are never repeated: each product is one einsum over the query heads
# split as `(K, groups)`. With one group, the plain einsums.
def qk(q, k, groups: int = 1):
    """`(B, T, N, H) x (B, S, K, H) -> (B, N, T, S)`: the scores (and
    `d_out x v`)."""
    if groups == 1:
        return tf.einsum("BTNH,BSNH->BNTS", q, k)
    # The query block first to (B, K, G, T, H) (small): the product then
    # comes out in the scores' order; "BTKGH,..." would make einsum
    # transpose the scores (T before G), a copy of the largest tensor.
    q = tf.transpose(_grouped(q, 2, groups), [0, 2, 3, 1, 4])
    return _merged(tf.einsum("BKGTH,BSKH->BKGTS", q, k), 1)


def pv(p, v, groups: int = 1):
    """`(B, N, T, S) x (B, S, K, H) -> (B, N, T, H)`: the output."""
    if groups == 1:
        return tf.einsum("BNTS,BSNH->BNTH", p, v)
    return _merged(tf.einsum("BKGTS,BSKH->BKGTH", _grouped(p, 1, groups), v), 1)


def pk(ds, k, groups: int = 1):
    """`(B, N, T, S) x (B, S, K, H) -> (B, T, N, H)`: the query's
    gradient."""
    if groups == 1:
        return tf.einsum("BNTS,BSNH->BTNH", ds, k)
    return _merged(
        tf.einsum("BKGTS,BSKH->BTKGH", _grouped(ds, 1, groups), k), 2
    )


def pq(p, q, groups: int = 1):
    """`(B, N, T, S) x (B, T, N, H) -> (B, S, K, H)`: the keys' and values'
    gradients, summed over each shared head's group."""
    if groups == 1:
        return tf.einsum("BNTS,BTNH->BSNH", p, q)
    return tf.einsum(
        "BKGTS,BTKGH->BSKH", _grouped(p, 1, groups), _grouped(q, 2, groups)
    )


def causal_mask(q_idx, k_idx, window=None):
    """`(1, 1, rows, cols)`: query `i` sees key `j <= i` (and `j > i -
    window` under a sliding window)."""
    ahead = q_idx[:, None] - k_idx[None, :]
    seen = ahead >= 0
    if window is not None:
        seen = tf.logical_and(seen, ahead < window)
    return seen[None, None]


def rows_seen(keys, t_len, window=None):
    """`[..., T]`: whether query `i` sees a key under the causal mask (and
    `window`: keys `i - window < j <= i`) and the key mask `keys`
    `[..., S]`: counted by a cumulative sum over the keys, never a `(T, S)`
    tensor."""
    count = tf.cumsum(tf.cast(keys, tf.int32), axis=-1)
    last = tf.shape(count)[-1] - 1
    i = tf.range(t_len)
    upto = tf.gather(count, tf.minimum(i, last), axis=-1)  # keys <= i
    if window is not None:
        before = tf.gather(
            count, tf.clip_by_value(i - window, 0, last), axis=-1
        )
        upto = upto - tf.where(i - window >= 0, before, 0)
    return upto > 0


def block_scores(q_blk, k_blk, block_mask, scale, soft_cap=None, groups=1):
    s = qk(q_blk, k_blk, groups)
    s = tf.cast(s, tf.float32) * scale
    if soft_cap is not None:  # Gemma 2: cap * tanh(s / cap), then the mask
        s = soft_cap * tf.tanh(s / soft_cap)
    if block_mask is not None:
        s = tf.where(block_mask, s, large_negative(s.dtype))
    return s


def through_soft_cap(ds, s, soft_cap):
    """The gradient `ds` of capped scores `s` taken back through the cap:
    times `1 - tanh^2 = 1 - (s / cap)^2`. Masked and padded scores (a large
    negative number, -inf) are outside (-cap, cap): clipped to a factor of
    0, never inf * 0."""
    if soft_cap is None:
        return ds
    t = tf.clip_by_value(s / soft_cap, -1.0, 1.0)
    return ds * (1.0 - tf.square(t))


def block_loop(n, body, loop_vars, invariants, start=None):
    return tf.while_loop(
        lambda i, *_: i < n,
        body,
        [tf.constant(0) if start is None else start, *loop_vars],
        shape_invariants=[tf.TensorShape([]), *invariants],
        parallel_iterations=1,
    )[1:]


def softmax_start(lead, value) -> list:
    """The running maximum, sum and output of a query block before its
    first key block (`lead`: its `[B, N, rows]`), for `softmax_step`."""
    return [
        tf.fill(lead, tf.constant(-float("inf"))),
        tf.zeros(lead),
        tf.zeros(tf.concat([lead, tf.shape(value)[3:]], 0)),
    ]


def softmax_step(s, v_blk, groups, m, total, acc):
    """One key block's scores `s` and values into a query block's running
    (online) softmax: the new maximum, sum of exponentials and float32
    output sum."""
    m_new = tf.maximum(m, tf.reduce_max(s, axis=-1))
    alpha = tf.exp(m - m_new)
    p = tf.exp(s - m_new[..., None])
    total = total * alpha + tf.reduce_sum(p, axis=-1)
    o = pv(tf.cast(p, v_blk.dtype), v_blk, groups)
    return m_new, total, acc * alpha[..., None] + tf.cast(o, tf.float32)
