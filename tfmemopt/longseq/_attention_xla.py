"""Chunked attention for a step XLA compiles (#46): `_attention`'s
arithmetic in whole blocks, written into whole buffers in place."""

from __future__ import annotations

import tensorflow as tf

from tfmemopt import _compat
from tfmemopt.longseq._attention_blocks import block_loop
from tfmemopt.longseq._attention_blocks import block_scores
from tfmemopt.longseq._attention_blocks import block_shape
from tfmemopt.longseq._attention_blocks import causal_mask
from tfmemopt.longseq._attention_blocks import pk
from tfmemopt.longseq._attention_blocks import pq
from tfmemopt.longseq._attention_blocks import pv
from tfmemopt.longseq._attention_blocks import qk
from tfmemopt.longseq._attention_blocks import rows_seen
from tfmemopt.longseq._attention_blocks import through_soft_cap


def attend_xla(
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
    """`_attend` for a step XLA compiles (#46).

    XLA needs every slice's size at compile time; `_attend`'s last blocks
    are cut short where the sequence ends, its mask-derived block ranges
    come from `tf.where` (a data-dependent shape) and its `TensorArray`s
    hold blocks of varying sizes. Here the query and key sequences are
    padded to whole blocks (the blocks' shape, from the tensors' shapes, is
    known when XLA compiles): padded keys score `-inf` (nothing, even in a
    fully masked row, which attends uniformly to the real keys as in Keras),
    padded query rows are dropped. Blocks are written into whole buffers in
    place (XLA's DynamicUpdateSlice). Under a causal mask, alone or with
    a mask over keys only (`[B, 1 or N, 1, S]`: keras-hub's key padding),
    the blocks above the diagonal are skipped, as in `_attend`, by every
    query block whose rows all see a key (a fully masked row attends to
    every key, as in Keras: its block runs them all); with a mask over
    queries every block runs. Running a block a row cannot see adds an
    exact 0, so only the skipping needs that check.
    """
    update = _compat.dynamic_update_slice
    groups = query.shape[2] // key.shape[2]

    @tf.custom_gradient
    def forward(q, k, v):
        t_len = tf.shape(q)[1]
        s_len = tf.shape(k)[1]
        rows, cols = block_shape(q, k, block_elements)
        q_blocks = (t_len + rows - 1) // rows
        k_blocks = (s_len + cols - 1) // cols
        t_pad, s_pad = q_blocks * rows, k_blocks * cols
        qp = _pad_axis(q, 1, t_pad - t_len)
        kp = _pad_axis(k, 1, s_pad - s_len)
        vp = _pad_axis(v, 1, s_pad - s_len)
        maskp = mask
        if mask is not None:
            if mask.shape[2] != 1:
                maskp = _pad_axis(maskp, 2, t_pad - t_len, True)
            if mask.shape[3] != 1:
                maskp = _pad_axis(maskp, 3, s_pad - s_len, False)
        skip = is_causal and (mask is None or mask.shape[2] == 1)
        b, n = tf.shape(q)[0], tf.shape(q)[2]
        zero = tf.constant(0)
        # Per query block: whether its rows all see a key (True without a
        # mask); the first block where one does not.
        whole = tf.ones(tf.stack([q_blocks]), tf.bool)
        if skip and mask is not None:
            # every batch row and head ([B, 1 or N, 1, S] over keys only)
            seen = tf.reduce_all(
                rows_seen(mask[:, :, 0, :], t_len, window), axis=[0, 1]
            )
            seen = _pad_axis(seen, 0, t_pad - t_len, True)
            whole = tf.reduce_all(
                tf.reshape(seen, tf.stack([q_blocks, rows])), 1
            )
        first_partial = tf.reduce_min(
            tf.where(whole, q_blocks, tf.range(q_blocks))
        )

        def scores(q_blk, q0, k0):
            k_blk = _cut(kp, 1, k0, cols)
            s = block_scores(
                q_blk,
                k_blk,
                _block_mask_xla(maskp, is_causal, q0, rows, k0, cols, window),
                scale,
                soft_cap,
                groups,
            )
            real = (k0 + tf.range(cols)) < s_len
            return tf.where(real, s, -float("inf")), k_blk

        def q_body(i, out, row_max, log_sum):
            q0 = i * rows
            q_blk = _cut(qp, 1, q0, rows)
            hi = k_blocks
            if skip:
                hi = tf.where(
                    whole[i],
                    tf.minimum((q0 + rows - 1) // cols + 1, k_blocks),
                    k_blocks,
                )

            def k_body(j, m, total, acc):
                k0 = j * cols
                s, _ = scores(q_blk, q0, k0)
                m_new = tf.maximum(m, tf.reduce_max(s, axis=-1))
                alpha = tf.exp(m - m_new)
                p = tf.exp(s - m_new[..., None])
                total = total * alpha + tf.reduce_sum(p, axis=-1)
                v_blk = _cut(vp, 1, k0, cols)
                o = pv(tf.cast(p, v.dtype), v_blk, groups)
                acc = acc * alpha[..., None] + tf.cast(o, tf.float32)
                return j + 1, m_new, total, acc

            lead = tf.stack([b, n, rows])
            m, total, acc = block_loop(
                hi,
                k_body,
                [
                    tf.fill(lead, tf.constant(-float("inf"))),
                    tf.zeros(lead),
                    tf.zeros(tf.concat([lead, tf.shape(v)[3:]], 0)),
                ],
                [tf.TensorShape(None)] * 3,
            )
            o = tf.cast(acc / total[..., None], v.dtype)
            out = update(
                out, tf.transpose(o, [0, 2, 1, 3]), [zero, q0, zero, zero]
            )
            # Kept apart, as in `_attend` (a fully masked row's maximum).
            row_max = update(row_max, m, [zero, zero, q0])
            log_sum = update(log_sum, tf.math.log(total), [zero, zero, q0])
            return i + 1, out, row_max, log_sum

        out_p, row_max, log_sum = block_loop(
            q_blocks,
            q_body,
            [
                tf.zeros(
                    tf.concat([tf.shape(qp)[:3], tf.shape(v)[3:]], 0), v.dtype
                ),
                tf.zeros(tf.stack([b, n, t_pad])),
                tf.zeros(tf.stack([b, n, t_pad])),
            ],
            [tf.TensorShape(None)] * 3,
        )
        out = tf.ensure_shape(out_p[:, :t_len], q.shape[:-1] + v.shape[-1:])

        def grad(d_out):
            delta = tf.einsum(
                "BTNH,BTNH->BNT",
                tf.cast(d_out, tf.float32),
                tf.cast(out, tf.float32),
            )
            delta = _pad_axis(delta, 2, t_pad - t_len)
            # Padded query rows have no upstream gradient: they add nothing.
            dop = _pad_axis(d_out, 1, t_pad - t_len)

            def k_body(j, dq, dk, dv):
                k0 = j * cols
                v_blk = _cut(vp, 1, k0, cols)
                # from the first query block that sees key block j (or
                # the first with a fully masked row, which sees them all)
                first = tf.minimum(k0 // rows, first_partial) if skip else zero

                def q_body(i, dq, dk_blk, dv_blk):
                    q0 = i * rows
                    q_blk = _cut(qp, 1, q0, rows)
                    do_blk = _cut(dop, 1, q0, rows)
                    s, k_blk = scores(q_blk, q0, k0)
                    m_blk = _cut(row_max, 2, q0, rows)
                    l_blk = _cut(log_sum, 2, q0, rows)
                    p = tf.exp((s - m_blk[..., None]) - l_blk[..., None])
                    dv_blk = dv_blk + tf.cast(
                        pq(tf.cast(p, v.dtype), do_blk, groups), tf.float32
                    )
                    dp = tf.cast(qk(do_blk, v_blk, groups), tf.float32)
                    d_blk = _cut(delta, 2, q0, rows)
                    ds = p * (dp - d_blk[..., None])
                    mask_blk = _block_mask_xla(
                        maskp, is_causal, q0, rows, k0, cols, window
                    )
                    if mask_blk is not None:
                        ds = tf.where(mask_blk, ds, tf.zeros((), ds.dtype))
                    ds = through_soft_cap(ds, s, soft_cap)
                    ds = tf.cast(ds * scale, q.dtype)
                    dq_blk = pk(ds, k_blk, groups)
                    at = [zero, q0, zero, zero]
                    dq = update(
                        dq,
                        _cut(dq, 1, q0, rows) + tf.cast(dq_blk, tf.float32),
                        at,
                    )
                    dk_blk = dk_blk + tf.cast(pq(ds, q_blk, groups), tf.float32)
                    return i + 1, dq, dk_blk, dv_blk

                dq, dk_blk, dv_blk = block_loop(
                    q_blocks,
                    q_body,
                    [
                        dq,
                        tf.zeros(
                            tf.concat([tf.shape(v_blk)[:3], tf.shape(k)[3:]], 0)
                        ),
                        tf.zeros(tf.shape(v_blk), tf.float32),
                    ],
                    [tf.TensorShape(None)] * 3,
                    start=first,
                )
                at = [zero, k0, zero, zero]
                return j + 1, dq, update(dk, dk_blk, at), update(dv, dv_blk, at)

            dq, dk, dv = block_loop(
                k_blocks,
                k_body,
                [
                    tf.zeros(tf.shape(qp), tf.float32),
                    tf.zeros(tf.shape(kp), tf.float32),
                    tf.zeros(tf.shape(vp), tf.float32),
                ],
                [tf.TensorShape(None)] * 3,
            )
            return (
                tf.ensure_shape(tf.cast(dq[:, :t_len], q.dtype), q.shape),
                tf.ensure_shape(tf.cast(dk[:, :s_len], k.dtype), k.shape),
                tf.ensure_shape(tf.cast(dv[:, :s_len], v.dtype), v.shape),
            )

        return out, grad

    return forward(query, key, value)


def _block_mask_xla(mask, is_causal, q0, rows, k0, cols, window=None):
    """`_block_mask` of whole blocks, in slices whose sizes XLA knows."""
    block = None
    if mask is not None:
        block = mask
        if mask.shape[2] != 1:
            block = _cut(block, 2, q0, rows)
        if mask.shape[3] != 1:
            block = _cut(block, 3, k0, cols)
    if is_causal:
        causal = causal_mask(q0 + tf.range(rows), k0 + tf.range(cols), window)
        block = causal if block is None else tf.logical_and(block, causal)
    return block


def _cut(x, axis: int, start, size):
    """`size` entries of `x` from `start` along `axis`, the other axes
    whole. Every size is given (from the shape, which XLA knows): a `-1`
    in a slice with a computed start makes XLA pad the input to twice its
    size in every dimension (measured: 8 x 1024 x 24 x 32 for a block of
    4 x 512 x 12 x 16, 123 MiB more at GPT-2's 4 x 512 tokens)."""
    shape = tf.shape(x)
    at = [[axis]]
    sizes = tf.tensor_scatter_nd_update(shape, at, [size])
    begin = tf.scatter_nd(at, [start], tf.shape(shape))
    return tf.slice(x, begin, sizes)


def _pad_axis(x, axis: int, amount, value=0):
    """`x` with `amount` entries of `value` after the end of `axis`."""
    paddings = [[0, 0]] * x.shape.rank
    paddings[axis] = [0, amount]
    return tf.pad(x, paddings, constant_values=value)
