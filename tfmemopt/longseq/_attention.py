"""Exact dot-product attention over query blocks, in linear memory.

Keras 3 on TensorFlow builds the whole `(B, N, T, S)` score tensor (and a
boolean mask of the same size), keeps the softmax for the backward pass,
and refuses `flash_attention=True`. Here the queries are cut into blocks
sized in elements (`B x N x rows x S` scores per block); a block's scores
are computed, soft-maxed and multiplied by the values, then dropped. The
custom gradient recomputes one block at a time in the backward pass, so
only the inputs and the output are kept between the passes (the
recompute-in-backward idea of FlashAttention and Rabe & Staats 2021; the
softmax of a block is taken over whole key rows, which needs no running
maximum and is exact).

The arithmetic follows Keras's TensorFlow `dot_product_attention`:
scores in float32 times `scale`, masked positions set to the same large
negative number (so a fully masked query row attends uniformly, as there),
softmax in float32, probabilities cast to the value dtype. The gradient is
zero at masked scores, as `tf.where` makes it in Keras's path.
"""

from __future__ import annotations

import tensorflow as tf

# Scores (batch x heads x query rows x keys) per block: 4 Mi floats, 16 MiB.
DEFAULT_BLOCK_ELEMENTS = 1 << 22


def _large_negative(dtype) -> float:
    # Keras's value (keras/src/backend/tensorflow/nn.py, the score dtype is
    # float32 here): -0.7 times the largest float.
    return -0.7 * 3.38953e38


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
):
    """`keras.ops.dot_product_attention`, computed in query blocks.

    Takes `keras.ops.dot_product_attention`'s arguments (`bias` must be
    `None`; no `flash_attention`, no soft-cap) plus the block size, and
    gives the same output and gradients within float32 rounding, holding
    one block of scores at a time in both passes.

    Args:
        query: `(B, T, N, H)`.
        key: `(B, S, N, H)` (`N` may divide the query heads: grouped).
        value: `(B, S, N, H_v)`.
        bias: Must be `None`.
        mask: Boolean, broadcastable to `(B, N, T, S)`, or `None`.
        scale: Float; defaults to `1 / sqrt(H)`.
        is_causal: Bool, query `i` sees keys `<= i`.
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
    if n_q is not None and n_kv is not None and n_q > n_kv and n_kv > 1:
        key = tf.repeat(key, n_q // n_kv, axis=2)
        value = tf.repeat(value, n_q // n_kv, axis=2)
    if scale is None:
        scale = 1.0 / float(query.shape[-1]) ** 0.5
    if mask is not None:
        mask = tf.cast(mask, tf.bool)
        while mask.shape.rank < 4:
            mask = tf.expand_dims(mask, 0)
    return _attend(
        query, key, value, mask, float(scale), bool(is_causal), block_elements
    )


def _block_rows(query, key, block_elements):
    shape_q = tf.shape(query)
    per_row = shape_q[0] * shape_q[2] * tf.shape(key)[1]
    return tf.maximum(1, block_elements // tf.maximum(per_row, 1))


def _block_mask(mask, is_causal, start, rows, t_len, s_len):
    """The block's mask, broadcastable to (B, N, rows, S), or None."""
    block = None
    if mask is not None:
        if mask.shape[2] == 1:
            block = mask
        else:
            block = mask[:, :, start : start + rows, :]
    if is_causal:
        q_idx = tf.range(start, tf.minimum(start + rows, t_len))
        causal = q_idx[:, None] >= tf.range(s_len)[None, :]
        causal = causal[None, None]
        block = causal if block is None else tf.logical_and(block, causal)
    return block


def _scores(q_blk, key, block_mask, scale):
    s = tf.einsum("BTNH,BSNH->BNTS", q_blk, key)
    s = tf.cast(s, tf.float32) * scale
    if block_mask is not None:
        s = tf.where(block_mask, s, _large_negative(s.dtype))
    return s


def _attend(query, key, value, mask, scale, is_causal, block_elements):
    @tf.custom_gradient
    def forward(q, k, v):
        t_len = tf.shape(q)[1]
        s_len = tf.shape(k)[1]
        rows = _block_rows(q, k, block_elements)
        blocks = (t_len + rows - 1) // rows

        def body(i, out_ta):
            start = i * rows
            q_blk = q[:, start : start + rows]
            m = _block_mask(mask, is_causal, start, rows, t_len, s_len)
            p = tf.nn.softmax(_scores(q_blk, k, m, scale), axis=-1)
            o = tf.einsum("BNTS,BSNH->BTNH", tf.cast(p, v.dtype), v)
            return i + 1, out_ta.write(i, tf.transpose(o, [1, 0, 2, 3]))

        out_ta = tf.TensorArray(
            v.dtype,
            size=blocks,
            element_shape=tf.TensorShape([None] + v.shape[:1] + v.shape[2:]),
            infer_shape=False,
        )
        _, out_ta = tf.while_loop(
            lambda i, *_: i < blocks,
            body,
            [tf.constant(0), out_ta],
            parallel_iterations=1,
        )
        out = tf.transpose(out_ta.concat(), [1, 0, 2, 3])

        def grad(d_out):
            def gbody(i, dq_ta, dk, dv):
                start = i * rows
                q_blk = q[:, start : start + rows]
                do_blk = d_out[:, start : start + rows]
                m = _block_mask(mask, is_causal, start, rows, t_len, s_len)
                p = tf.nn.softmax(_scores(q_blk, k, m, scale), axis=-1)
                p_c = tf.cast(p, v.dtype)
                dv = dv + tf.cast(
                    tf.einsum("BNTS,BTNH->BSNH", p_c, do_blk), tf.float32
                )
                dp = tf.cast(
                    tf.einsum("BTNH,BSNH->BNTS", do_blk, v), tf.float32
                )
                ds = p * (dp - tf.reduce_sum(dp * p, axis=-1, keepdims=True))
                if m is not None:
                    ds = tf.where(m, ds, tf.zeros((), ds.dtype))
                ds = tf.cast(ds * scale, q.dtype)
                dq_blk = tf.einsum("BNTS,BSNH->BTNH", ds, k)
                dk = dk + tf.cast(
                    tf.einsum("BNTS,BTNH->BSNH", ds, q_blk), tf.float32
                )
                dq_ta = dq_ta.write(i, tf.transpose(dq_blk, [1, 0, 2, 3]))
                return i + 1, dq_ta, dk, dv

            dq_ta = tf.TensorArray(
                q.dtype,
                size=blocks,
                element_shape=tf.TensorShape(
                    [None] + q.shape[:1] + q.shape[2:]
                ),
                infer_shape=False,
            )
            _, dq_ta, dk, dv = tf.while_loop(
                lambda i, *_: i < blocks,
                gbody,
                [
                    tf.constant(0),
                    dq_ta,
                    tf.zeros(tf.shape(k), tf.float32),
                    tf.zeros(tf.shape(v), tf.float32),
                ],
                shape_invariants=[
                    tf.TensorShape([]),
                    tf.TensorShape(None),
                    k.shape,
                    v.shape,
                ],
                parallel_iterations=1,
            )
            dq = tf.transpose(dq_ta.concat(), [1, 0, 2, 3])
            return dq, tf.cast(dk, k.dtype), tf.cast(dv, v.dtype)

        return out, grad

    return forward(query, key, value)
