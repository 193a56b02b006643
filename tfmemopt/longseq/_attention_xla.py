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
from tfmemopt.longseq._attention_blocks import qk
from tfmemopt.longseq._attention_blocks import rows_seen
from tfmemopt.longseq._attention_blocks import softmax_start
from tfmemopt.longseq._attention_blocks import softmax_step
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

    @tf.custom_gradient
    def forward(q, k, v):
        blocks = _XlaBlocks(
            q, k, v, mask, scale, is_causal, block_elements, soft_cap, window
        )
        return blocks.forward(), blocks.backward

    return forward(query, key, value)


_ANY_SHAPE = tf.TensorShape(None)


def _update(x, piece, at):
    return _compat.dynamic_update_slice(x, piece, at)


class _XlaBlocks:
    """One call's blocked attention under XLA (`attend_xla`): the padded
    sequences, the blocks they share, and what the forward pass keeps for
    the backward one."""

    def __init__(
        self, q, k, v, mask, scale, is_causal, block_elements, soft_cap,
        window,
    ):  # fmt: skip
        self.q, self.k, self.v = q, k, v
        self.scale, self.is_causal = scale, is_causal
        self.soft_cap, self.window = soft_cap, window
        self.groups = q.shape[2] // k.shape[2]
        self.t_len = t_len = tf.shape(q)[1]
        self.s_len = s_len = tf.shape(k)[1]
        rows, cols = block_shape(q, k, block_elements)
        self.rows, self.cols = rows, cols
        self.q_blocks = (t_len + rows - 1) // rows
        self.k_blocks = (s_len + cols - 1) // cols
        self.t_pad = t_pad = self.q_blocks * rows
        s_pad = self.k_blocks * cols
        self.qp = _pad_axis(q, 1, t_pad - t_len)
        self.kp = _pad_axis(k, 1, s_pad - s_len)
        self.vp = _pad_axis(v, 1, s_pad - s_len)
        self.maskp = mask
        if mask is not None:
            if mask.shape[2] != 1:
                self.maskp = _pad_axis(self.maskp, 2, t_pad - t_len, True)
            if mask.shape[3] != 1:
                self.maskp = _pad_axis(self.maskp, 3, s_pad - s_len, False)
        self.skip = is_causal and (mask is None or mask.shape[2] == 1)
        self.zero = tf.constant(0)
        self._whole_blocks(mask)

    def _whole_blocks(self, mask):
        """Per query block, whether its rows all see a key (True without a
        mask; `whole`), and the first block where one does not
        (`first_partial`)."""
        q_blocks = self.q_blocks
        self.whole = tf.ones(tf.stack([q_blocks]), tf.bool)
        if self.skip and mask is not None:
            # every batch row and head ([B, 1 or N, 1, S] over keys only)
            seen = tf.reduce_all(
                rows_seen(mask[:, :, 0, :], self.t_len, self.window),
                axis=[0, 1],
            )
            seen = _pad_axis(seen, 0, self.t_pad - self.t_len, True)
            self.whole = tf.reduce_all(
                tf.reshape(seen, tf.stack([q_blocks, self.rows])), 1
            )
        self.first_partial = tf.reduce_min(
            tf.where(self.whole, q_blocks, tf.range(q_blocks))
        )

    def _mask(self, q0, k0):
        return _block_mask_xla(
            self.maskp, self.is_causal, q0, self.rows, k0, self.cols,
            self.window,
        )  # fmt: skip

    def _scores(self, q_blk, q0, k0):
        """A block's scores (padded keys at -inf) and its keys."""
        k_blk = _cut(self.kp, 1, k0, self.cols)
        s = block_scores(
            q_blk, k_blk, self._mask(q0, k0), self.scale, self.soft_cap,
            self.groups,
        )  # fmt: skip
        real = (k0 + tf.range(self.cols)) < self.s_len
        return tf.where(real, s, -float("inf")), k_blk

    # -- forward -----------------------------------------------------------
    def forward(self):
        q, v = self.q, self.v
        b, n = tf.shape(q)[0], tf.shape(q)[2]
        out_p, self.row_max, self.log_sum = block_loop(
            self.q_blocks,
            self._query_block,
            [
                tf.zeros(
                    tf.concat([tf.shape(self.qp)[:3], tf.shape(v)[3:]], 0),
                    v.dtype,
                ),
                tf.zeros(tf.stack([b, n, self.t_pad])),
                tf.zeros(tf.stack([b, n, self.t_pad])),
            ],
            [_ANY_SHAPE] * 3,
        )
        self.out = tf.ensure_shape(
            out_p[:, : self.t_len], q.shape[:-1] + v.shape[-1:]
        )
        return self.out

    def _query_block(self, i, out, row_max, log_sum):
        v, rows, cols, zero = self.v, self.rows, self.cols, self.zero
        q0 = i * rows
        q_blk = _cut(self.qp, 1, q0, rows)
        hi = self.k_blocks
        if self.skip:
            hi = tf.where(
                self.whole[i],
                tf.minimum((q0 + rows - 1) // cols + 1, self.k_blocks),
                self.k_blocks,
            )

        def k_body(j, m, total, acc):
            k0 = j * cols
            s, _ = self._scores(q_blk, q0, k0)
            v_blk = _cut(self.vp, 1, k0, cols)
            return (j + 1, *softmax_step(s, v_blk, self.groups, m, total, acc))

        lead = tf.stack([tf.shape(self.q)[0], tf.shape(self.q)[2], rows])
        m, total, acc = block_loop(
            hi,
            k_body,
            softmax_start(lead, v),
            [_ANY_SHAPE] * 3,
        )
        o = tf.cast(acc / total[..., None], v.dtype)
        at = [zero, q0, zero, zero]
        out = _update(out, tf.transpose(o, [0, 2, 1, 3]), at)
        # Kept apart, as in `_attend` (a fully masked row's maximum).
        row_max = _update(row_max, m, [zero, zero, q0])
        log_sum = _update(log_sum, tf.math.log(total), [zero, zero, q0])
        return i + 1, out, row_max, log_sum

    # -- backward ----------------------------------------------------------
    def backward(self, d_out):
        q, k, v = self.q, self.k, self.v
        t_len, s_len = self.t_len, self.s_len
        delta = tf.einsum(
            "BTNH,BTNH->BNT",
            tf.cast(d_out, tf.float32),
            tf.cast(self.out, tf.float32),
        )
        delta = _pad_axis(delta, 2, self.t_pad - t_len)
        # Padded query rows have no upstream gradient: they add nothing.
        dop = _pad_axis(d_out, 1, self.t_pad - t_len)

        def k_body(j, dq, dk, dv):
            return self._key_block_grad(j, dq, dk, dv, dop, delta)

        dq, dk, dv = block_loop(
            self.k_blocks,
            k_body,
            [
                tf.zeros(tf.shape(self.qp), tf.float32),
                tf.zeros(tf.shape(self.kp), tf.float32),
                tf.zeros(tf.shape(self.vp), tf.float32),
            ],
            [_ANY_SHAPE] * 3,
        )
        return (
            tf.ensure_shape(tf.cast(dq[:, :t_len], q.dtype), q.shape),
            tf.ensure_shape(tf.cast(dk[:, :s_len], k.dtype), k.shape),
            tf.ensure_shape(tf.cast(dv[:, :s_len], v.dtype), v.shape),
        )

    def _key_block_grad(self, j, dq, dk, dv, dop, delta):
        zero, rows = self.zero, self.rows
        k0 = j * self.cols
        v_blk = _cut(self.vp, 1, k0, self.cols)
        # from the first query block that sees key block j (or the first
        # with a fully masked row, which sees them all)
        first = (
            tf.minimum(k0 // rows, self.first_partial) if self.skip else zero
        )

        def q_body(i, dq, dk_blk, dv_blk):
            return self._query_block_grad(
                i, k0, v_blk, dop, delta, dq, dk_blk, dv_blk
            )

        dq, dk_blk, dv_blk = block_loop(
            self.q_blocks,
            q_body,
            [
                dq,
                tf.zeros(
                    tf.concat([tf.shape(v_blk)[:3], tf.shape(self.k)[3:]], 0)
                ),
                tf.zeros(tf.shape(v_blk), tf.float32),
            ],
            [_ANY_SHAPE] * 3,
            start=first,
        )
        at = [zero, k0, zero, zero]
        return j + 1, dq, _update(dk, dk_blk, at), _update(dv, dv_blk, at)

    def _query_block_grad(self, i, k0, v_blk, dop, delta, dq, dk_blk, dv_blk):
        q, groups, rows, zero = self.q, self.groups, self.rows, self.zero
        q0 = i * rows
        q_blk = _cut(self.qp, 1, q0, rows)
        do_blk = _cut(dop, 1, q0, rows)
        s, k_blk = self._scores(q_blk, q0, k0)
        m_blk = _cut(self.row_max, 2, q0, rows)
        l_blk = _cut(self.log_sum, 2, q0, rows)
        p = tf.exp((s - m_blk[..., None]) - l_blk[..., None])
        dv_blk = dv_blk + tf.cast(
            pq(tf.cast(p, self.v.dtype), do_blk, groups), tf.float32
        )
        dp = tf.cast(qk(do_blk, v_blk, groups), tf.float32)
        d_blk = _cut(delta, 2, q0, rows)
        ds = p * (dp - d_blk[..., None])
        mask_blk = self._mask(q0, k0)
        if mask_blk is not None:
            ds = tf.where(mask_blk, ds, tf.zeros((), ds.dtype))
        ds = through_soft_cap(ds, s, self.soft_cap)
        ds = tf.cast(ds * self.scale, q.dtype)
        dq_blk = pk(ds, k_blk, groups)
        at = [zero, q0, zero, zero]
        dq_rows = _cut(dq, 1, q0, rows) + tf.cast(dq_blk, tf.float32)
        dq = _update(dq, dq_rows, at)
        dk_blk = dk_blk + tf.cast(pq(ds, q_blk, groups), tf.float32)
        return i + 1, dq, dk_blk, dv_blk


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
