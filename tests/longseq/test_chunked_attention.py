"""attention="chunked": exact attention in query and key blocks."""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfmemopt
from tfmemopt.longseq import _attention
from tfmemopt.longseq import _attention_blocks
from tfmemopt.longseq import dot_product_attention

B, T, N, H = 2, 11, 3, 4


def _diff(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


# (MIN_ROWS, block elements / (B x N)): whole key rows in query blocks of 3;
# query blocks of 4 x key blocks of 3, and of 3 x 5 (the last ones short);
# everything in one block.
BLOCKS = [(64, T * 3), (4, 4 * 3), (3, 3 * 5), (64, T * T)]


def _out_and_grads(attend, q, k, v, d_out):
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = attend(q, k, v)
        s = tf.reduce_sum(out * d_out)
    return [out, *tape.gradient(s, [q, k, v])]


# Under XLA (#46): the block shapes whose last blocks are short (padded
# there), with the batch and the length unknown when traced, as in Keras's
# step.
REGIMES = [(*b, False) for b in BLOCKS] + [(*b, True) for b in BLOCKS[1:3]]


@pytest.mark.parametrize("min_rows, per_head, jit_compile", REGIMES)
def test_equals_keras_dot_product_attention_and_its_gradient(
    monkeypatch, min_rows, per_head, jit_compile
):
    monkeypatch.setattr(_attention_blocks, "MIN_ROWS", min_rows)
    if jit_compile:  # the XLA path, not the other one compiled
        monkeypatch.setattr(_attention, "_attend", None)
    rng = np.random.default_rng(0)
    q, k, v, d_out = (
        tf.constant(rng.normal(size=(B, T, N, H)), tf.float32) for _ in range(4)
    )
    mask = rng.random((B, 1, T, T)) > 0.3
    mask[0, 0, 0] = False  # a fully masked query row: uniform in Keras too
    mask = tf.constant(mask)
    keys = np.ones((B, 1, 1, T), bool)
    keys[1, :, :, -3:] = False  # key padding, broadcast over the queries
    keys = tf.constant(keys)
    cases = [
        (mask, False),
        (None, True),
        (mask, True),
        (None, False),
        (keys, True),
    ]
    for m, causal in cases:

        def chunked(q, k, v, m=m, causal=causal):
            return dot_product_attention(
                q,
                k,
                v,
                mask=m,
                is_causal=causal,
                block_elements=B * N * per_head,
            )

        run = functools.partial(_out_and_grads, chunked)
        if jit_compile:
            spec = tf.TensorSpec([None, None, N, H])
            run = tf.function(run, jit_compile=True, input_signature=[spec] * 4)
        got = run(q, k, v, d_out)
        want = _out_and_grads(
            lambda q, k, v: keras.ops.dot_product_attention(
                q, k, v, mask=m, is_causal=causal
            ),
            q,
            k,
            v,
            d_out,
        )
        assert _diff(got, want) < 2e-6, (m is None, causal)


def _skippable_masks():
    """Masks that hide whole blocks: GPT-2's causal + key padding, a band
    (sliding window: blocks hidden on both sides), trailing key padding
    alone, and a causal mask with one fully masked row."""
    rows, cols = np.arange(T)[:, None], np.arange(T)[None, :]
    causal = np.broadcast_to(rows >= cols, (B, 1, T, T)).copy()
    padded = causal.copy()
    padded[1, :, :, -3:] = False  # batch 1's last 3 tokens are padding
    band = np.broadcast_to((rows >= cols) & (rows - cols < 4), (B, 1, T, T))
    keys = np.ones((B, 1, 1, T), bool)
    keys[:, :, :, -4:] = False
    one_row = causal.copy()
    one_row[0, 0, 5] = False
    return [padded, band.copy(), keys, one_row]


@pytest.mark.parametrize("min_rows, per_head", BLOCKS[1:3])
def test_skipping_hidden_blocks_changes_no_bit(monkeypatch, min_rows, per_head):
    monkeypatch.setattr(_attention_blocks, "MIN_ROWS", min_rows)
    rng = np.random.default_rng(4)
    q, k, v, d_out = (
        tf.constant(rng.normal(size=(B, T, N, H)), tf.float32) for _ in range(4)
    )
    block_elements = B * N * per_head

    def run(attend, m, causal, **kwargs):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = attend(q, k, v, mask=m, is_causal=causal, **kwargs)
            s = tf.reduce_sum(out * d_out)
        return [out, *tape.gradient(s, [q, k, v])]

    def chunked(*args, **kwargs):
        return dot_product_attention(
            *args, **kwargs, block_elements=block_elements
        )

    cases = [(tf.constant(m), False, None) for m in _skippable_masks()]
    cases.append((None, True, None))
    # a sliding window of 4 keys, made per block: blocks hidden before it
    rows, cols = np.arange(T)[:, None], np.arange(T)[None, :]
    cases.append((None, True, 4))
    band = tf.constant(
        np.broadcast_to((rows >= cols) & (rows - cols < 4), (B, 1, T, T))
    )
    skipped = []
    for m, causal, window in cases:
        got = run(chunked, m, causal, window=window)
        if window is None:
            want = run(keras.ops.dot_product_attention, m, causal)
        else:
            want = run(keras.ops.dot_product_attention, band, False)
        assert _diff(got, want) < 2e-6, (m is None, causal, window)
        # Against the same blocks computed in full (no skipping): equal
        # to the bit, in the output and the three gradients.
        with monkeypatch.context() as patch:
            patch.setattr(
                _attention,
                "_key_range",
                lambda *a: (tf.constant(0), a[6]),
            )
            full = run(chunked, m, causal, window=window)
        for a, b in zip(got, full):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        rows, cols = _attention.block_shape(q, k, block_elements)
        k_blocks = (T + cols - 1) // cols
        ranges = [
            _attention._key_range(
                m, causal, q0, min(int(rows), T - q0), T, cols, k_blocks, window
            )
            for q0 in range(0, T, int(rows))
        ]
        skipped.append(
            sum(int(k_blocks) - int(hi) + int(lo) for lo, hi in ranges)
        )
        if window is not None:  # blocks skipped before the window too
            assert any(int(lo) > 0 for lo, _ in ranges), ranges
    # Every mask hides whole blocks somewhere: the padded and causal ones
    # at the end of the first query blocks' keys, the band before and
    # after, the key padding at the end.
    assert all(n > 0 for n in skipped), skipped


def test_static_batch_of_one_in_graph_mode():
    # A micro-batch of 1 (accumulation) traces with a static batch of 1:
    # the gradient's loop variables keep that shape over key blocks.
    rng = np.random.default_rng(3)
    q, k, v = (
        tf.constant(rng.normal(size=(1, T, N, H)), tf.float32) for _ in range(3)
    )

    @tf.function
    def grads(attend):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            s = tf.reduce_sum(attend() ** 2)
        return tape.gradient(s, [q, k, v])

    got = grads(
        lambda: dot_product_attention(
            q, k, v, is_causal=True, block_elements=N * T * 4
        )
    )
    want = grads(
        lambda: keras.ops.dot_product_attention(q, k, v, is_causal=True)
    )
    assert _diff(got, want) < 2e-6


def _stack(dropout=0.0):
    keras.utils.set_random_seed(2)
    inputs = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(29, 8, mask_zero=True)(inputs)
    for _ in range(2):
        a = keras.layers.MultiHeadAttention(2, 4, dropout=dropout)(
            h, h, use_causal_mask=True
        )
        h = keras.layers.LayerNormalization()(h + a)
    outputs = keras.layers.Dense(29)(h)
    return keras.Model(inputs, outputs)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_a_users_attention_stack_trains_as_keras(jit_compile):
    """Against plain Keras in the same regime (with XLA: #46; the layers'
    EnsureShape failed there, `[4, 4096, ...]` against `[4, 512, ...]` on
    keras-hub's GPT-2)."""
    rng = np.random.default_rng(1)
    x = rng.integers(1, 29, size=(4, T))
    x[1, -3:] = 0  # query and key padding, merged with the causal mask
    y = rng.integers(0, 29, size=(4, T))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def update(model, perm):
        model.compile(keras.optimizers.SGD(0.5), loss, jit_compile=jit_compile)
        model.train_on_batch(x[perm], y[perm])
        return [w.numpy() for w in model.trainable_variables]

    ident, perm = np.arange(4), np.array([2, 0, 3, 1])
    plain = _stack()
    before = [w.numpy() for w in plain.trainable_variables]
    want = update(plain, ident)
    floor = _diff(want, update(_stack(), perm))
    model = tfmemopt.Model.wrap(_stack(), attention="chunked")
    # Fewer than MIN_ROWS rows of whole keys fit: all 11 query rows, key
    # blocks of 3 (online softmax over 4 blocks).
    model.long_sequences.block_elements = 4 * 2 * T * 3
    assert len(model.long_sequences.attention_layers) == 2
    got = update(model, ident)
    update_size = _diff(want, before)
    assert update_size > 1e-3
    assert _diff(want, got) <= max(4 * floor, 2**-20 * update_size)
    np.testing.assert_allclose(
        model.predict(x, verbose=0), plain.predict(x, verbose=0), atol=2e-6
    )


def test_refuses_attention_dropout():
    with pytest.raises(ValueError, match="dropout=0.1"):
        tfmemopt.Model.wrap(_stack(dropout=0.1), attention="chunked")


class OwnAttention(keras.layers.Layer):
    """Attention in a layer's own code (as keras-hub's Llama, Gemma...)."""

    def build(self, input_shape):
        self.proj = keras.layers.Dense(input_shape[-1])
        self.proj.build(input_shape)

    def call(self, x):
        scores = keras.ops.einsum("btd,bsd->bts", x, self.proj(x))
        return keras.ops.einsum(
            "bts,bsd->btd", keras.ops.softmax(scores, axis=-1), x
        )


def test_refuses_attention_it_cannot_take_over():
    # keras-hub's Llama/Gemma/Mistral/Qwen/Bloom/GPT-NeoX attention classes
    # are not MultiHeadAttention: their scores would stay whole, so asking
    # for chunked attention there is refused (it was silently ignored),
    # and a model with no attention at all too.
    inputs = keras.Input((T, H))
    own = keras.Model(inputs, keras.layers.Dense(5)(OwnAttention()(inputs)))
    with pytest.raises(ValueError, match="computes attention in OwnAttention"):
        tfmemopt.Model.wrap(own, attention="chunked")
    assert tfmemopt.Model.wrap(own, chunked_loss=True).long_sequences
    mlp = keras.Sequential([keras.Input((H,)), keras.layers.Dense(5)])
    with pytest.raises(ValueError, match="found no attention layer"):
        tfmemopt.Model.wrap(mlp, attention="chunked")


def _soft_capped_reference(q, k, v, mask, cap):
    """Gemma 2's attention written out: scores scaled, `cap * tanh(s /
    cap)`, masked, softmax in float32."""
    s = tf.einsum("BTNH,BSNH->BNTS", q, k) / float(H) ** 0.5
    s = cap * tf.tanh(s / cap)
    s = tf.where(mask, s, -0.7 * 3.38953e38)
    return tf.einsum("BNTS,BSNH->BTNH", tf.nn.softmax(s, axis=-1), v)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_soft_cap_equals_the_capped_scores_and_their_gradient(jit_compile):
    """`soft_cap` (Gemma 2's attention logit soft cap) in blocks of 3 keys:
    output and gradients equal the written-out attention; the masked and
    padded scores' gradient is 0, not inf * 0."""
    rng = np.random.default_rng(1)
    q, k, v, d_out = (
        tf.constant(3 * rng.normal(size=(B, T, N, H)), tf.float32)
        for _ in range(4)
    )
    rows, cols = np.arange(T)[:, None], np.arange(T)[None, :]
    mask = np.broadcast_to(rows >= cols, (B, 1, T, T)).copy()
    mask[1, :, :, -3:] = False
    mask = tf.constant(mask)

    def chunked(q, k, v):
        return dot_product_attention(
            q, k, v, mask=mask, soft_cap=2.0, block_elements=B * N * 3 * 3
        )

    run = functools.partial(_out_and_grads, chunked)
    if jit_compile:
        spec = tf.TensorSpec([B, T, N, H])
        run = tf.function(run, jit_compile=True, input_signature=[spec] * 4)
    got = run(q, k, v, d_out)
    want = _out_and_grads(
        lambda q, k, v: _soft_capped_reference(q, k, v, mask, 2.0),
        q,
        k,
        v,
        d_out,
    )
    assert all(np.isfinite(np.asarray(g)).all() for g in got)
    scale = max(float(np.abs(np.asarray(w)).max()) for w in want)
    assert _diff(got, want) < 2e-6 * scale, (_diff(got, want), scale)
    uncapped = _out_and_grads(
        lambda q, k, v: _soft_capped_reference(q, k, v, mask, 1e6),
        q,
        k,
        v,
        d_out,
    )
    assert _diff(uncapped, want) > 1e-2 * scale  # the cap matters here


@pytest.mark.parametrize(
    "kv_heads, jit_compile",
    [(2, False), (1, False), (2, True)],
    ids=["gqa-graph", "mqa-graph", "gqa-xla"],
)
def test_grouped_heads_equal_the_repeated_ones_without_repeating(
    kv_heads, jit_compile
):
    """Grouped-query attention (4 query heads reading 2 or 1 shared
    key/value heads, query head n reading head n // groups as keras-hub
    repeats them): output and gradients equal Keras's attention of the
    repeated keys and values (its gradient summed back over each group),
    in blocks of 3 keys; no tensor the size of the repeated keys is made
    (the step's graph has no op of that shape)."""
    n_q, t, h = 4, 10, 4
    rng = np.random.default_rng(2)
    q, d_out = (
        tf.constant(rng.normal(size=(B, t, n_q, h)), tf.float32)
        for _ in range(2)
    )
    k, v = (
        tf.constant(rng.normal(size=(B, t, kv_heads, h)), tf.float32)
        for _ in range(2)
    )
    rows, cols = np.arange(t)[:, None], np.arange(t)[None, :]
    mask = np.broadcast_to(rows >= cols, (B, 1, t, t)).copy()
    mask[1, :, :, -3:] = False
    mask = tf.constant(mask)

    def chunked(q, k, v):
        return dot_product_attention(
            q, k, v, mask=mask, block_elements=B * n_q * 3 * 3
        )

    run = functools.partial(_out_and_grads, chunked)
    spec = [tf.TensorSpec([B, t, n_q, h]), tf.TensorSpec([B, t, kv_heads, h])]
    run = tf.function(
        run,
        jit_compile=jit_compile,
        input_signature=[spec[0], spec[1], spec[1], spec[0]],
    )
    got = run(q, k, v, d_out)
    groups = n_q // kv_heads
    want = _out_and_grads(
        lambda q, k, v: keras.ops.dot_product_attention(
            q,
            tf.repeat(k, groups, axis=2),
            tf.repeat(v, groups, axis=2),
            mask=mask,
        ),
        q,
        k,
        v,
        d_out,
    )
    assert [g.shape for g in got] == [g.shape for g in want]
    assert _diff(got, want) < 2e-6, _diff(got, want)
    if not jit_compile:
        graph = run.get_concrete_function().graph
        repeated = [B, t, n_q, h]
        made = [
            (op.type, op.name)
            for op in graph.get_operations()
            for out in op.outputs
            if out.shape.rank == 4
            and out.shape.as_list() == repeated
            and op.type in ("Tile", "Reshape", "BroadcastTo", "GatherV2")
            # the test's own `reduce_sum(out * d_out)` has a gradient Tile
            and not op.name.startswith("gradient_tape/")
        ]
        assert not made, made


def test_heads_that_do_not_group_are_refused():
    q = tf.zeros((1, 4, 3, 2))
    kv = tf.zeros((1, 4, 2, 2))
    with pytest.raises(ValueError, match="multiple of the keys"):
        dot_product_attention(q, kv, kv)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_sliding_window_equals_the_banded_mask(monkeypatch, jit_compile):
    """`window` (keras-hub's decoders' sliding window, made per block):
    output and gradients equal Keras's attention under the whole banded
    mask (causal, keys `i - 4 < j <= i`, key padding), in blocks of 3
    keys; a window wider than the sequence is the causal mask."""
    # query blocks of 3 rows: the first has rows that see no key (left
    # padding), which must run every key block, the others skip
    monkeypatch.setattr(_attention_blocks, "MIN_ROWS", 3)
    rng = np.random.default_rng(3)
    q, k, v, d_out = (
        tf.constant(rng.normal(size=(B, T, N, H)), tf.float32) for _ in range(4)
    )
    keys = np.ones((B, 1, 1, T), bool)
    keys[1, :, :, :2] = False  # left padding: rows that see no key
    keys[0, :, :, -3:] = False
    rows, cols = np.arange(T)[:, None], np.arange(T)[None, :]
    for window in (4, T + 5):
        band = (rows >= cols) & (rows - cols < window)
        whole = tf.constant(keys & band[None, None])

        def chunked(q, k, v, window=window):
            return dot_product_attention(
                q,
                k,
                v,
                mask=tf.constant(keys),
                is_causal=True,
                window=window,
                block_elements=B * N * 3 * 3,
            )

        run = functools.partial(_out_and_grads, chunked)
        if jit_compile:
            spec = tf.TensorSpec([B, T, N, H])
            run = tf.function(run, jit_compile=True, input_signature=[spec] * 4)
        got = run(q, k, v, d_out)
        want = _out_and_grads(
            lambda q, k, v: keras.ops.dot_product_attention(
                q, k, v, mask=whole
            ),
            q,
            k,
            v,
            d_out,
        )
        assert _diff(got, want) < 2e-6, (window, _diff(got, want))
    # More queries than keys: rows past the last key + window see none
    # and attend to every key, as in Keras (the skipped ranges must not
    # leave them empty).
    s_len, window = 4, 2
    k_few, v_few = k[:, :s_len], v[:, :s_len]
    band = (rows >= cols[:, :s_len]) & (rows - cols[:, :s_len] < window)
    got = dot_product_attention(
        q, k_few, v_few, is_causal=True, window=window, block_elements=B * N * 3
    )
    want = keras.ops.dot_product_attention(
        q, k_few, v_few, mask=tf.constant(band[None, None])
    )
    assert _diff([got], [want]) < 2e-6
    with pytest.raises(ValueError, match="is_causal=True"):
        dot_product_attention(q, k, v, window=4)
