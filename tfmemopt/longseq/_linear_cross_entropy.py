"""A linear projection and sparse cross-entropy, chunked over tokens.

The language-model head computes `tokens x vocabulary` logits; Keras keeps
them as `y_pred`, plus the softmax and the logits' gradient: three to four
copies of the largest tensor of the step. Here the projection and the loss
are one function with a custom gradient: the forward pass keeps only each
token's log-sum-exp, and the backward pass recomputes one chunk of logits
at a time, turns it into that chunk's gradient and drops it. Autodiff
through a plain loop would keep every chunk's logits; the custom gradient
is what makes the saving real (the pattern of Liger Kernel's fused linear
cross-entropy and of Cut Cross-Entropy, Wijmans et al. 2024).
"""

from __future__ import annotations

import tensorflow as tf

from tfmemopt import _compat

# Logits elements (tokens x vocabulary) per chunk: 4 Mi floats is 16 MiB a
# copy. Chunks are sized in elements, not tokens: a fixed token count is
# either too small for a small vocabulary (slow) or too large for a big one.
# 1 Mi made vocabulary blocks of 122 columns at 8192 tokens (412 blocks a
# pass): the head's forward and backward took 1.32x the plain head's, 1.11x
# with 4 Mi (8 Mi: 1.11x; 2048 tokens: 1.15x / 1.07x / 1.13x).
DEFAULT_CHUNK_ELEMENTS = 1 << 22


def chunk_rows(vocabulary: int, chunk_elements: int) -> int:
    """Tokens per chunk for `chunk_elements` logits (at least one)."""
    return max(1, int(chunk_elements) // max(1, int(vocabulary)))


def linear_cross_entropy(
    hidden,
    kernel,
    labels,
    bias=None,
    *,
    transpose_kernel: bool = False,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    compute_dtype=None,
):
    """Per-token `logsumexp(h @ W + b) - (h @ W + b)[label]`, in chunks.

    Equal, within float32 rounding, to Keras's
    `sparse_categorical_crossentropy(labels, h @ W + b, from_logits=True)`
    and to its gradient, without ever holding more than one chunk of
    logits. Masks, sample weights and reductions apply to the returned
    per-token values as Keras applies them to its own.

    Args:
        hidden: Float tensor `(..., D)`, the head's input.
        kernel: Float tensor `(D, V)`, or `(V, D)` with `transpose_kernel`
            (a tied embedding matrix). Pass a variable's value, not the
            variable: the custom gradient returns a tensor for it.
        labels: Integer tensor of shape `hidden.shape[:-1]`, in `[0, V)`.
        bias: Float tensor `(V,)` or `None`.
        transpose_kernel: Bool, defaults to `False`. `kernel` is `(V, D)`.
        chunk_elements: Int, logits elements (tokens x V) per chunk.
        compute_dtype: The dtype of the matmul (the layer's compute dtype,
            `"float16"` under mixed precision); logits are then cast to
            float32 for the softmax. Defaults to `hidden.dtype`.

    Returns:
        Float32 tensor of shape `hidden.shape[:-1]`.
    """
    dtype = tf.as_dtype(compute_dtype or hidden.dtype)
    lead_shape = tf.shape(hidden)[:-1]
    static_lead = hidden.shape[:-1]
    depth = hidden.shape[-1]
    h = tf.reshape(tf.cast(hidden, dtype), [-1, depth])
    w = tf.cast(kernel, dtype)
    vocab = int(w.shape[0] if transpose_kernel else w.shape[1])
    b = tf.zeros((vocab,), dtype) if bias is None else tf.cast(bias, dtype)
    y = tf.reshape(tf.cast(labels, tf.int32), [-1])
    rows = chunk_rows(vocab, chunk_elements)
    chunked = _chunked_xla if _compat.in_xla_function() else _chunked
    losses = chunked(h, w, b, y, rows, transpose_kernel, bias is not None)
    out = tf.reshape(losses, lead_shape)
    out.set_shape(static_lead)
    return out


def _online_lse(logits, start, y, top, total, target):
    """One vocabulary block (`logits`, columns from `start`) into the
    running maximum, sum of exponentials and label logit of each token."""
    width = tf.shape(logits)[1]
    new_top = tf.maximum(top, tf.reduce_max(logits, axis=-1))
    total = total * tf.exp(top - new_top) + tf.reduce_sum(
        tf.exp(logits - new_top[:, None]), axis=-1
    )
    inside = tf.logical_and(y >= start, y < start + width)
    local = tf.clip_by_value(y - start, 0, width - 1)
    picked = tf.gather(logits, local, axis=1, batch_dims=1)
    return new_top, total, tf.where(inside, picked, target)


def _chunked(h, w, b, y, rows, transpose, with_bias):
    @tf.custom_gradient
    def forward(h, w, b):
        blocks = _VocabBlocks(h, w, b, y, rows, transpose, with_bias)
        return blocks.forward(), blocks.backward

    return forward(h, w, b)


class _VocabBlocks:
    """One call's cross-entropy over blocks of the vocabulary, with a
    running log-sum-exp: each block reads its columns of the kernel once (a
    loop over token chunks read the whole kernel per chunk: 2x slower with
    small chunks), and a block is the same in the forward and backward
    loops. Keeps each token's log-sum-exp for the backward pass."""

    def __init__(self, h, w, b, y, rows, transpose, with_bias):
        self.h, self.w, self.b, self.y = h, w, b, y
        self.transpose, self.with_bias = transpose, with_bias
        self.n = tf.shape(h)[0]
        self.vocab = b.shape[0]
        self.cols = tf.maximum(1, (rows * self.vocab) // tf.maximum(self.n, 1))
        self.blocks = (self.vocab + self.cols - 1) // self.cols

    def _block(self, start):
        """The kernel's columns `start:start + cols` and their float32
        logits (the same block in the forward and backward loops)."""
        w, cols = self.w, self.cols
        if self.transpose:
            w_blk = w[start : start + cols]
        else:
            w_blk = w[:, start : start + cols]
        logits = tf.matmul(self.h, w_blk, transpose_b=self.transpose)
        if self.with_bias:
            logits = logits + self.b[start : start + cols]
        return w_blk, tf.cast(logits, tf.float32)

    def forward(self):
        """Each token's loss, `log-sum-exp - label logit`."""

        def body(j, top, total, target):
            start = j * self.cols
            _, logits = self._block(start)
            return (
                j + 1,
                *_online_lse(logits, start, self.y, top, total, target),
            )

        zeros = tf.zeros([self.n], tf.float32)
        _, top, total, target = tf.while_loop(
            lambda j, *_: j < self.blocks,
            body,
            [tf.constant(0), zeros - float("inf"), zeros, zeros],
            shape_invariants=[tf.TensorShape([])]
            + [tf.TensorShape([None])] * 3,
            parallel_iterations=1,
        )
        self.lse = top + tf.math.log(total)
        return self.lse - target

    def backward(self, upstream):
        """Over blocks of the vocabulary: each block's kernel gradient is
        final once computed (written out, never accumulated), and the
        hidden states' gradient is a small (tokens, D) sum."""
        h, w, b = self.h, self.w, self.b
        up = tf.cast(upstream, tf.float32)[:, None]
        _, dh, dw, db_ta = tf.while_loop(
            lambda j, *_: j < self.blocks,
            lambda j, dh, dw, db_ta: self._grad_block(j, dh, dw, db_ta, up),
            [
                tf.constant(0),
                tf.zeros(tf.shape(h), tf.float32),
                # A fresh (V, D) buffer tiled from a runtime tensor (a
                # tf.zeros of static shape is folded into a graph constant,
                # which the in-place update would overwrite). Its contents
                # do not matter: the blocks set every row.
                tf.tile(tf.cast(h[:1], w.dtype), [self.vocab, 1]),
                tf.TensorArray(
                    tf.float32,
                    size=self.blocks,
                    element_shape=tf.TensorShape([None]),
                    infer_shape=False,
                ),
            ],
            shape_invariants=[
                tf.TensorShape([]),
                h.shape,
                tf.TensorShape([self.vocab, h.shape[-1]]),
                tf.TensorShape(None),
            ],
            parallel_iterations=1,
        )
        if not self.transpose:
            dw = tf.transpose(dw)
        dw = tf.ensure_shape(dw, w.shape)
        if self.with_bias:
            db = tf.reshape(tf.cast(db_ta.concat(), b.dtype), b.shape)
        else:
            db = tf.zeros_like(b)
        return tf.cast(dh, h.dtype), dw, db

    def _grad_block(self, j, dh, dw, db_ta, up):
        y, h, w = self.y, self.h, self.w
        start = j * self.cols
        w_blk, logits = self._block(start)
        d = tf.exp(logits - self.lse[:, None]) * up
        width = tf.shape(d)[1]
        # Minus the upstream gradient at each label in this block.
        inside = tf.where(tf.logical_and(y >= start, y < start + width))
        inside = tf.cast(inside[:, 0], tf.int32)
        d = tf.tensor_scatter_nd_sub(
            d,
            tf.stack([inside, tf.gather(y, inside) - start], axis=1),
            tf.gather(up[:, 0], inside),
        )
        d_c = tf.cast(d, w.dtype)
        dh = dh + tf.cast(
            tf.matmul(d_c, w_blk, transpose_b=not self.transpose), tf.float32
        )
        # The block's (cols, D) rows of the kernel's gradient, written into
        # the (V, D) gradient's own buffer (InplaceUpdate aliases its input;
        # the buffer is this loop's alone). A TensorArray and its concat
        # held two copies of the gradient at the end.
        dw = tf.raw_ops.InplaceUpdate(
            x=dw,
            i=tf.range(start, start + width),
            v=tf.matmul(d_c, h, transpose_a=True),
        )
        if self.with_bias:
            db_ta = db_ta.write(j, tf.reduce_sum(d, axis=0))
        return j + 1, dh, dw, db_ta


def _chunked_xla(h, w, b, y, rows, transpose, with_bias):
    """`_chunked` for a step XLA compiles (#46).

    XLA needs every slice's size at compile time. The blocks' width comes
    from the token count, which XLA knows (it compiles for one shape), but
    `_chunked`'s last block is cut short where the vocabulary ends (a size
    that depends on the loop's counter), its backward pass finds the labels
    of a block with `tf.where` (a data-dependent shape) and writes the
    kernel's gradient with `InplaceUpdate` (no XLA kernel). Here the loops
    run over whole blocks and the last block (1 to a block's width) comes
    after them, the
    label's entry is subtracted through a one-hot of the block's width, and
    the gradients' rows are scattered into their buffers (in place: XLA
    updates a loop's buffer where it lives). Same arithmetic, same blocks.
    """

    @tf.custom_gradient
    def forward(h, w, b):
        n = tf.shape(h)[0]
        vocab = b.shape[0]
        depth = h.shape[-1]
        cols = tf.minimum(
            vocab, tf.maximum(1, (rows * vocab) // tf.maximum(n, 1))
        )
        # The loop's blocks, then the last one, 1 to `cols` wide (never
        # empty: XLA has no gather from a block without columns).
        full = (vocab - 1) // cols
        tail = vocab - full * cols

        def block(start, width):
            if transpose:
                w_blk = tf.slice(w, [start, 0], [width, depth])
            else:
                w_blk = tf.slice(w, [0, start], [depth, width])
            logits = tf.matmul(h, w_blk, transpose_b=transpose)
            if with_bias:
                logits = logits + tf.slice(b, [start], [width])
            return w_blk, tf.cast(logits, tf.float32)

        def update(start, width, top, total, target):
            _, logits = block(start, width)
            return _online_lse(logits, start, y, top, total, target)

        def body(j, top, total, target):
            return (j + 1, *update(j * cols, cols, top, total, target))

        zeros = tf.zeros([n], tf.float32)
        _, top, total, target = tf.while_loop(
            lambda j, *_: j < full,
            body,
            [tf.constant(0), zeros - float("inf"), zeros, zeros],
            parallel_iterations=1,
        )
        top, total, target = update(full * cols, tail, top, total, target)
        lse = top + tf.math.log(total)
        loss = lse - target

        def grad(upstream):
            up = tf.cast(upstream, tf.float32)[:, None]

            def block_grads(start, width, dh, dw, db):
                w_blk, logits = block(start, width)
                local = y - start
                inside = tf.logical_and(local >= 0, local < width)
                label = tf.one_hot(
                    tf.where(inside, local, -1), width, dtype=tf.float32
                )
                d = (tf.exp(logits - lse[:, None]) - label) * up
                d_c = tf.cast(d, w.dtype)
                dh = dh + tf.cast(
                    tf.matmul(d_c, w_blk, transpose_b=not transpose),
                    tf.float32,
                )
                at = (start + tf.range(width))[:, None]
                dw = tf.tensor_scatter_nd_update(
                    dw, at, tf.matmul(d_c, h, transpose_a=True)
                )
                if with_bias:
                    db = tf.tensor_scatter_nd_update(
                        db, at, tf.reduce_sum(d, axis=0)
                    )
                return dh, dw, db

            def gbody(j, dh, dw, db):
                return (j + 1, *block_grads(j * cols, cols, dh, dw, db))

            _, dh, dw, db = tf.while_loop(
                lambda j, *_: j < full,
                gbody,
                [
                    tf.constant(0),
                    tf.zeros(tf.shape(h), tf.float32),
                    tf.zeros([vocab, depth], w.dtype),
                    tf.zeros([vocab], tf.float32),
                ],
                parallel_iterations=1,
            )
            dh, dw, db = block_grads(full * cols, tail, dh, dw, db)
            if not transpose:
                dw = tf.transpose(dw)
            db = tf.cast(db, b.dtype) if with_bias else tf.zeros_like(b)
            return tf.cast(dh, h.dtype), dw, db

        return loss, grad

    return forward(h, w, b)
