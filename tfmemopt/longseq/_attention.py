"""Exact dot-product attention over query and key blocks, in linear memory.

Keras 3 on TensorFlow builds the whole `(B, N, T, S)` score tensor (and a
boolean mask of the same size), keeps the softmax for the backward pass,
and refuses `flash_attention=True`. Here the scores are cut into blocks of
`B x N x rows x cols` elements (sized in elements, not tokens). The forward
pass runs over the key blocks of each query block with an online softmax
(a running maximum, sum and output, as in FlashAttention and Rabe & Staats
2021) and keeps only the output and each query's maximum and log-sum; the custom
gradient recomputes one block at a time from them, so no score tensor
survives between the passes. Blocks take whole key rows while at least
`MIN_ROWS` query rows fit (one key block, the cheapest shape); only longer
keys are cut.

Blocks that the mask hides entirely are skipped in both passes: each query
block runs over the key blocks from its first to its last unmasked key
(under a causal mask, about half the blocks at long lengths), and each key
block over the query blocks that see it. A score hidden by the mask adds
exactly zero to the softmax of a row that sees some key (its exponential
underflows to 0.0), so the skip changes no bit; a query block that has a
fully masked row (which attends uniformly to every key, as in Keras) runs
over every block.

The arithmetic follows Keras's TensorFlow `dot_product_attention`:
scores in float32 times `scale`, masked positions set to the same large
negative number (so a fully masked query row attends uniformly, as there),
softmax in float32, probabilities cast to the value dtype. The gradient is
zero at masked scores, as `tf.where` makes it in Keras's path.
"""

from __future__ import annotations

import tensorflow as tf

from tfmemopt import _compat
from tfmemopt.longseq._attention_blocks import DEFAULT_BLOCK_ELEMENTS
from tfmemopt.longseq._attention_blocks import block_loop
from tfmemopt.longseq._attention_blocks import block_scores
from tfmemopt.longseq._attention_blocks import block_shape
from tfmemopt.longseq._attention_blocks import causal_mask
from tfmemopt.longseq._attention_blocks import pk
from tfmemopt.longseq._attention_blocks import pq
from tfmemopt.longseq._attention_blocks import qk
from tfmemopt.longseq._attention_blocks import softmax_start
from tfmemopt.longseq._attention_blocks import softmax_step
from tfmemopt.longseq._attention_blocks import through_soft_cap
from tfmemopt.longseq._attention_xla import attend_xla


def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    scale=None,
    is_causal: bool = False,
    *,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
    soft_cap: float | None = None,
    window: int | None = None,
):
    """`keras.ops.dot_product_attention`, computed in query and key blocks.

    Takes `keras.ops.dot_product_attention`'s arguments (`bias` must be
    `None`; no `flash_attention`, no soft-cap) plus the block size, and
    gives the same output and gradients within float32 rounding, holding
    one block of scores at a time in both passes.

    Args:
        query: `(B, T, N, H)`.
        key: `(B, S, K, H)`, `K` dividing `N`: query head `n` reads key
            head `n // (N // K)` (grouped-query attention in keras-hub's
            order). The shared heads are never repeated to `N`.
        value: `(B, S, K, H_v)`.
        bias: Must be `None`.
        mask: Boolean, broadcastable to `(B, N, T, S)`, or `None`.
        scale: Float; defaults to `1 / sqrt(H)`.
        is_causal: Bool, query `i` sees keys `<= i`.
        window: Int or `None`, with `is_causal`: query `i` sees keys `j`
            with `i - window < j <= i` only (a sliding window, Mistral's,
            Qwen2's and Gemma 2's), made per block, never `(T, S)`.
        block_elements: Int, score elements per block.

    Returns:
        `(B, T, N, H_v)` in the value's dtype.
    """
    if bias is not None:
        raise ValueError(
            "Chunked attention takes no `bias`. Received: bias of shape "
            f"{bias.shape}. Fold an additive bias into `mask`, or use "
            "keras.ops.dot_product_attention for this layer."
        )
    query = tf.convert_to_tensor(query)
    key = tf.convert_to_tensor(key)
    value = tf.convert_to_tensor(value)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.shape.rank != 4:
            raise ValueError(
                f"Chunked attention expects 4-D (B, T, N, H) tensors. "
                f"Received: {name} of shape {t.shape}."
            )
    n_q, n_kv = query.shape[2], key.shape[2]
    if (
        n_q is None
        or n_kv is None
        or value.shape[2] != n_kv
        or not n_kv
        or n_q % n_kv
    ):
        raise ValueError(
            "Chunked attention needs static head counts, the query's a "
            "multiple of the keys' and values' (grouped-query attention). "
            f"Received: query {query.shape}, key {key.shape}, value "
            f"{value.shape}."
        )
    if window is not None and (not is_causal or int(window) < 1):
        raise ValueError(
            "Chunked attention's `window` is a causal sliding window: it "
            f"needs is_causal=True and window >= 1. Received: window="
            f"{window!r}, is_causal={is_causal!r}."
        )
    if scale is None:
        scale = 1.0 / float(query.shape[-1]) ** 0.5
    if mask is not None:
        mask = tf.cast(mask, tf.bool)
        while mask.shape.rank < 4:
            mask = tf.expand_dims(mask, 0)
    attend = attend_xla if _compat.in_xla_function() else _attend
    return attend(
        query,
        key,
        value,
        mask,
        float(scale),
        bool(is_causal),
        block_elements,
        None if soft_cap is None else float(soft_cap),
        None if window is None else int(window),
    )


def _block_mask(mask, is_causal, q0, rows, k0, cols, window=None):
    """The block's mask, broadcastable to (B, N, rows, cols), or None."""
    block = None
    if mask is not None:
        block = mask
        if mask.shape[2] != 1:
            block = block[:, :, q0 : q0 + rows]
        if mask.shape[3] != 1:
            block = block[:, :, :, k0 : k0 + cols]
    if is_causal:
        causal = causal_mask(
            tf.range(q0, q0 + rows), tf.range(k0, k0 + cols), window
        )
        block = causal if block is None else tf.logical_and(block, causal)
    return block


def _key_range(mask, is_causal, q0, rows, s_len, cols, k_blocks, window=None):
    """Key blocks `[lo, hi)` holding every unmasked key of query rows
    `[q0, q0 + rows)`; every block if one of those rows is fully masked."""
    everything = (tf.constant(0), k_blocks)
    if mask is None:
        if not is_causal:
            return everything
        # Row q sees keys 0..q (from q - window + 1 under a window): its
        # last block holds key q0 + rows - 1.
        hi = tf.minimum((q0 + rows - 1) // cols + 1, k_blocks)
        if window is None:
            return tf.constant(0), hi
        # With more queries than keys, row r sees no key once r - window + 1
        # passes the last key: a fully masked row attends to every key.
        seen = q0 + rows - 1 <= s_len + window - 2
        lo = tf.maximum(q0 - window + 1, 0) // cols
        return tf.where(seen, lo, 0), tf.where(seen, hi, k_blocks)
    if mask.shape[3] == 1:  # broadcast over keys: nothing to locate
        return everything
    block = _block_mask(mask, is_causal, q0, rows, 0, s_len, window)
    first, last, seen = _span(tf.reduce_any(block, axis=[0, 1, 2]))
    exact = tf.logical_and(tf.reduce_all(tf.reduce_any(block, axis=-1)), seen)
    return (
        tf.where(exact, first // cols, 0),
        tf.where(exact, last // cols + 1, k_blocks),
    )


def _query_range(j, lo, hi):
    """Query blocks `[first, stop)` whose key range `[lo_i, hi_i)` holds key
    block `j` (at least one block, so the loops never run empty)."""
    first, last, seen = _span(tf.logical_and(lo <= j, j < hi))
    return tf.where(seen, first, 0), tf.where(seen, last + 1, 1)


def _span(flags):
    """`(first, last, any)`: the first and last index where the 1-D bool
    `flags` is true (int32; meaningless when `any` is false)."""
    where = tf.where(flags)[:, 0]
    first = tf.cast(tf.reduce_min(where), tf.int32)
    last = tf.cast(tf.reduce_max(where), tf.int32)
    return first, last, tf.size(where) > 0


def _array(dtype, size):
    return tf.TensorArray(
        dtype, size=size, element_shape=tf.TensorShape(None), infer_shape=False
    )


def _attend(
    query,
    key,
    value,
    mask,
    scale,
    is_causal,
    block_elements,
    soft_cap=None,
    window=None,
):
    @tf.custom_gradient
    def forward(q, k, v):
        blocks = _Blocks(
            q, k, v, mask, scale, is_causal, block_elements, soft_cap, window
        )
        return blocks.forward(), blocks.backward

    return forward(query, key, value)


_ANY_SHAPE = tf.TensorShape(None)


class _Blocks:
    """One call's attention in blocks of queries and keys (the forward pass
    and its gradient, FlashAttention's order): what the blocks share, and
    what the forward pass keeps for the backward one (the output, each
    row's maximum and log-sum, each query block's key range)."""

    def __init__(
        self, q, k, v, mask, scale, is_causal, block_elements, soft_cap,
        window,
    ):  # fmt: skip
        self.q, self.k, self.v = q, k, v
        self.mask, self.scale, self.is_causal = mask, scale, is_causal
        self.soft_cap, self.window = soft_cap, window
        self.groups = q.shape[2] // k.shape[2]
        self.t_len = tf.shape(q)[1]
        self.s_len = tf.shape(k)[1]
        self.rows, self.cols = block_shape(q, k, block_elements)
        self.q_blocks = (self.t_len + self.rows - 1) // self.rows
        self.k_blocks = (self.s_len + self.cols - 1) // self.cols

    def _mask(self, q0, rows, k0, cols):
        return _block_mask(
            self.mask, self.is_causal, q0, rows, k0, cols, self.window
        )

    def _scores(self, q_blk, k_blk, mask_blk):
        return block_scores(
            q_blk, k_blk, mask_blk, self.scale, self.soft_cap, self.groups
        )

    # -- forward -----------------------------------------------------------
    def forward(self):
        """The output (B, T, N, H); keeps what `backward` needs."""
        q, v = self.q, self.v
        out_ta, max_ta, log_ta, lo_ta, hi_ta = block_loop(
            self.q_blocks,
            self._query_block,
            [_array(v.dtype, self.q_blocks)]
            + [_array(tf.float32, self.q_blocks) for _ in range(2)]
            + [
                tf.TensorArray(tf.int32, size=self.q_blocks, element_shape=[])
                for _ in range(2)
            ],
            [_ANY_SHAPE] * 5,
        )
        # Each query block's key blocks [lo, hi), for the backward pass.
        self.key_lo, self.key_hi = lo_ta.stack(), hi_ta.stack()
        # (T, B, N, H) -> (B, T, N, H); (T, B, N) -> (B, N, T).
        out = tf.transpose(out_ta.concat(), [1, 0, 2, 3])
        self.out = tf.ensure_shape(out, q.shape[:-1] + v.shape[-1:])
        self.row_max = tf.transpose(max_ta.concat(), [1, 2, 0])
        self.log_sum = tf.transpose(log_ta.concat(), [1, 2, 0])
        return self.out

    def _query_block(self, i, out_ta, max_ta, log_ta, lo_ta, hi_ta):
        """One block of queries against its key blocks, online softmax."""
        q, v = self.q, self.v
        q0 = i * self.rows
        q_blk = q[:, q0 : q0 + self.rows]
        r = tf.shape(q_blk)[1:2]
        lo, hi = _key_range(
            self.mask, self.is_causal, q0, r[0], self.s_len, self.cols,
            self.k_blocks, self.window,
        )  # fmt: skip

        def k_body(j, m, total, acc):
            k0 = j * self.cols
            k_blk = self.k[:, k0 : k0 + self.cols]
            c = tf.shape(k_blk)[1]
            s = self._scores(q_blk, k_blk, self._mask(q0, r[0], k0, c))
            v_blk = v[:, k0 : k0 + self.cols]
            return (j + 1, *softmax_step(s, v_blk, self.groups, m, total, acc))

        lead = tf.concat([tf.stack([tf.shape(q)[0], tf.shape(q)[2]]), r], 0)
        m, total, acc = block_loop(
            hi,
            k_body,
            softmax_start(lead, v),
            [_ANY_SHAPE] * 3,
            start=lo,
        )
        o = tf.cast(acc / total[..., None], v.dtype)
        out_ta = out_ta.write(i, tf.transpose(o, [2, 0, 1, 3]))
        # The row maximum and the log of the sum, kept apart: in a fully
        # masked row the maximum is -0.7 x the largest float, which would
        # absorb the log of the sum in a single log-sum-exp.
        max_ta = max_ta.write(i, tf.transpose(m, [2, 0, 1]))
        log_ta = log_ta.write(i, tf.transpose(tf.math.log(total), [2, 0, 1]))
        return (
            i + 1, out_ta, max_ta, log_ta, lo_ta.write(i, lo),
            hi_ta.write(i, hi),
        )  # fmt: skip

    # -- backward ----------------------------------------------------------
    def backward(self, d_out):
        """`(dq, dk, dv)`: a pass over the key blocks, each over the query
        blocks that reached it."""
        q, k, v = self.q, self.k, self.v
        # The row term of the softmax's gradient, sum_s p * dp, equals
        # sum_h d_out * out: one (B, N, T) tensor instead of a row pass.
        delta = tf.einsum(
            "BTNH,BTNH->BNT",
            tf.cast(d_out, tf.float32),
            tf.cast(self.out, tf.float32),
        )

        def k_body(j, dq, dk_ta, dv_ta):
            return self._key_block_grad(j, dq, dk_ta, dv_ta, d_out, delta)

        dq, dk_ta, dv_ta = block_loop(
            self.k_blocks,
            k_body,
            [
                tf.zeros(tf.shape(q), tf.float32),
                _array(tf.float32, self.k_blocks),
                _array(tf.float32, self.k_blocks),
            ],
            [q.shape, _ANY_SHAPE, _ANY_SHAPE],
        )
        dk = tf.transpose(dk_ta.concat(), [1, 0, 2, 3])
        dv = tf.transpose(dv_ta.concat(), [1, 0, 2, 3])
        return (
            tf.ensure_shape(tf.cast(dq, q.dtype), q.shape),
            tf.ensure_shape(tf.cast(dk, k.dtype), k.shape),
            tf.ensure_shape(tf.cast(dv, v.dtype), v.shape),
        )

    def _key_block_grad(self, j, dq, dk_ta, dv_ta, d_out, delta):
        """One key block's dk and dv, and its share of dq."""
        q, rows = self.q, self.rows
        k0 = j * self.cols
        k_blk = self.k[:, k0 : k0 + self.cols]
        v_blk = self.v[:, k0 : k0 + self.cols]
        first, stop = _query_range(j, self.key_lo, self.key_hi)

        def q_body(i, dq_ta, dk_blk, dv_blk):
            return self._query_block_grad(
                i, first, k0, k_blk, v_blk, d_out, delta, dq_ta, dk_blk,
                dv_blk,
            )  # fmt: skip

        dq_ta, dk_blk, dv_blk = block_loop(
            stop,
            q_body,
            [
                _array(q.dtype, stop - first),
                tf.zeros(tf.shape(k_blk), tf.float32),
                tf.zeros(tf.shape(v_blk), tf.float32),
            ],
            [_ANY_SHAPE] * 3,
            start=first,
        )
        # The query rows [first * rows, end) this key block reached, placed
        # in a zero (B, T, N, H); pinned to q's static shape: the concat's
        # batch is None, and the loop variable must keep one shape (batch 1
        # included).
        dq_part = tf.transpose(dq_ta.concat(), [1, 0, 2, 3])
        q_start = first * rows
        q_end = tf.minimum(stop * rows, self.t_len)
        dq_part = tf.pad(
            dq_part, [[0, 0], [q_start, self.t_len - q_end], [0, 0], [0, 0]]
        )
        dq = dq + tf.cast(tf.ensure_shape(dq_part, q.shape), tf.float32)
        dk_ta = dk_ta.write(j, tf.transpose(dk_blk, [1, 0, 2, 3]))
        dv_ta = dv_ta.write(j, tf.transpose(dv_blk, [1, 0, 2, 3]))
        return j + 1, dq, dk_ta, dv_ta

    def _query_block_grad(
        self, i, first, k0, k_blk, v_blk, d_out, delta, dq_ta, dk_blk,
        dv_blk,
    ):  # fmt: skip
        """One (query block, key block) pair of the backward pass."""
        q, groups, rows = self.q, self.groups, self.rows
        q0 = i * rows
        q_blk = q[:, q0 : q0 + rows]
        do_blk = d_out[:, q0 : q0 + rows]
        r = tf.shape(q_blk)[1]
        m = self._mask(q0, r, k0, tf.shape(k_blk)[1])
        s = self._scores(q_blk, k_blk, m)
        p = tf.exp(
            (s - self.row_max[:, :, q0 : q0 + rows, None])
            - self.log_sum[:, :, q0 : q0 + rows, None]
        )
        p_c = tf.cast(p, self.v.dtype)
        dv_blk = dv_blk + tf.cast(pq(p_c, do_blk, groups), tf.float32)
        dp = tf.cast(qk(do_blk, v_blk, groups), tf.float32)
        ds = p * (dp - delta[:, :, q0 : q0 + rows, None])
        if m is not None:
            ds = tf.where(m, ds, tf.zeros((), ds.dtype))
        ds = through_soft_cap(ds, s, self.soft_cap)
        ds = tf.cast(ds * self.scale, q.dtype)
        dq_blk = pk(ds, k_blk, groups)
        dk_blk = dk_blk + tf.cast(pq(ds, q_blk, groups), tf.float32)
        dq_ta = dq_ta.write(i - first, tf.transpose(dq_blk, [1, 0, 2, 3]))
        return i + 1, dq_ta, dk_blk, dv_blk
