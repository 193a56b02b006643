"""chunked_loss=True: the head and the cross-entropy in chunks of tokens.

Exactness is judged against the float32 floor measured in the same test:
plain Keras on the same batch in another order.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfmemopt
from tfmemopt.longseq import linear_cross_entropy

V, T, D, B = 53, 9, 16, 6


def _diff(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


def _weights(model):
    return [v.numpy() for v in model.trainable_variables]


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("transpose", [False, True])
def test_linear_cross_entropy_equals_materialised_logits(
    transpose, with_bias, jit_compile
):
    rng = np.random.default_rng(0)
    h = tf.constant(rng.normal(size=(3, 7, D)), tf.float32)
    w = tf.Variable(rng.normal(size=(V, D) if transpose else (D, V)) * 0.3)
    w = tf.Variable(tf.cast(w, tf.float32))
    b = tf.Variable(rng.normal(size=(V,)), dtype=tf.float32)
    bias = b if with_bias else None
    y = tf.constant(rng.integers(0, V, size=(3, 7)))
    up = tf.constant(rng.normal(size=(3, 7)), tf.float32)

    def chunked_and_grads(h, y, up, rows):
        with tf.GradientTape() as tape:
            tape.watch(h)
            chunked = linear_cross_entropy(
                h,
                tf.convert_to_tensor(w),
                y,
                None if bias is None else tf.convert_to_tensor(bias),
                transpose_kernel=transpose,
                chunk_elements=V * rows,
            )
            s = tf.reduce_sum(chunked * up)
        return chunked, tape.gradient(s, [h, w, b])

    with tf.GradientTape() as tape:
        tape.watch(h)
        kernel = tf.transpose(w) if transpose else w
        logits = tf.matmul(h, kernel) + (b if with_bias else 0.0)
        plain = keras.losses.sparse_categorical_crossentropy(
            y, logits, from_logits=True
        )
        s = tf.reduce_sum(plain * up)
    want = tape.gradient(s, [h, w, b])
    # 21 tokens in blocks of the vocabulary's columns: 4 and 5 rows a
    # chunk make blocks of 10 and 12 columns (a last block of 3 and 5 of
    # the 53), 21 rows one block of all 53 (the loop does not run).
    for rows in (4, 5, 21):
        run = functools.partial(chunked_and_grads, rows=rows)
        if jit_compile:
            # The token count unknown when traced, as in Keras's step.
            spec = [
                tf.TensorSpec([None, 7, D]),
                tf.TensorSpec([None, 7], y.dtype),
            ]
            run = tf.function(
                run,
                jit_compile=True,
                input_signature=spec + [tf.TensorSpec([None, 7])],
            )
        chunked, got = run(h, y, up)
        np.testing.assert_allclose(chunked, plain, atol=4e-6)
        if not with_bias:
            assert got[2] is None or not np.any(got[2]), rows
            got, want_ = got[:2], want[:2]
        else:
            want_ = want
        assert _diff(got, want_) < 4e-6, rows


def _functional():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(V, D, mask_zero=True)(inputs)
    h = keras.layers.Dense(D, activation="tanh")(h)
    outputs = keras.layers.Dense(V, name="head")(h)
    return keras.Model(inputs, outputs)


def _data():
    rng = np.random.default_rng(0)
    x = rng.integers(1, V, size=(B, T))
    x[:, -2:] = 0  # padding: the Embedding's mask reaches the loss
    y = rng.integers(0, V, size=(B, T))
    y[0, :3] = 7  # ignore_class
    sw = rng.uniform(0.2, 3.0, size=(B, T)).astype("float32")
    return x, y, sw


def _one_update(model, x, y, sw, loss, jit_compile=False):
    model.compile(keras.optimizers.SGD(0.5), loss, jit_compile=jit_compile)
    logged = model.train_on_batch(x, y, sample_weight=sw, return_dict=True)
    return logged["loss"], _weights(model)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_dense_head_update_equals_keras_within_the_floor(jit_compile):
    """Under XLA too (#46: `InplaceUpdate` has no XLA kernel, and the last
    vocabulary block's size depended on the loop's counter): against
    plain Keras under XLA, within its own floor there."""
    x, y, sw = _data()
    loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, ignore_class=7
    )
    plain = _functional()
    before = _weights(plain)
    want_loss, want = _one_update(plain, x, y, sw, loss, jit_compile)
    perm = np.array([3, 1, 2, 0, 5, 4])
    _, permuted = _one_update(
        _functional(), x[perm], y[perm], sw[perm], loss, jit_compile
    )
    floor = _diff(want, permuted)
    update = _diff(want, before)

    model = tfmemopt.Model.wrap(
        _functional(), chunked_loss=True, accumulation_steps=2
    )
    model.long_sequences.chunk_elements = V * 4  # 6 tokens: several chunks
    got_loss, got = _one_update(model, x, y, sw, loss, jit_compile)
    assert model.long_sequences.head == "head"
    assert update > 1e-3
    assert _diff(want, got) <= max(4 * floor, 2**-20 * update)
    assert abs(got_loss - want_loss) <= 2e-6 * abs(want_loss)
    # predict still gives the full logits, equal to the plain model's.
    np.testing.assert_allclose(
        model.predict(x, verbose=0), plain.predict(x, verbose=0), atol=1e-5
    )
    # The loss compiled by the user is kept as written.
    assert model.loss is loss


def test_chunk_sizes_are_checked_when_set():
    # 0, -5 and 1.5 trained silently before, and the report printed them.
    model = tfmemopt.Model.wrap(_functional(), chunked_loss=True)
    report = model.long_sequences
    for bad, error in ((0, ValueError), (-5, ValueError), (1.5, TypeError)):
        with pytest.raises(error, match="chunk_elements"):
            report.chunk_elements = bad
    with pytest.raises(TypeError, match="block_elements"):
        report.block_elements = "big"
    report.chunk_elements = V * 4
    assert report.chunk_elements == V * 4


def test_refuses_what_it_cannot_make_exact():
    x, y, sw = _data()
    model = tfmemopt.Model.wrap(_functional(), chunked_loss=True)
    model.compile("sgd", "sparse_categorical_crossentropy")  # probabilities
    with pytest.raises(ValueError, match="from_logits=True"):
        model.train_on_batch(x, y)
    model = tfmemopt.Model.wrap(_functional(), chunked_loss=True)
    model.compile(
        "sgd",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    with pytest.raises(ValueError, match="Compile without metrics"):
        model.fit(x, y, verbose=0)
    inputs = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(V, D)(inputs)
    outputs = keras.layers.Dense(V, activation="softmax")(h)
    model = tfmemopt.Model.wrap(keras.Model(inputs, outputs), chunked_loss=True)
    model.compile(
        "sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    with pytest.raises(ValueError, match="activation=None"):
        model.train_on_batch(x, y)
    with pytest.raises(ValueError, match="attention"):
        tfmemopt.Model.wrap(_functional(), attention="flash")
    with pytest.raises(TypeError, match="chunked_loss"):
        tfmemopt.Model.wrap(_functional(), chunked_loss="yes")


@pytest.mark.parametrize("variant", ["lora", "int8"])
def test_refuses_a_lora_or_quantized_head(variant):
    # keras-hub heads may carry LoRA or int8 weights: the chunked loss
    # would compute the float kernel's logits, so it refuses, naming it.
    x, y, _ = _data()
    model = _functional()
    head = model.get_layer("head")
    if variant == "lora":
        head.enable_lora(2)
    else:
        head.quantize("int8")
    wrapped = tfmemopt.Model.wrap(model, chunked_loss=True)
    wrapped.compile(
        "sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    match = "LoRA enabled" if variant == "lora" else "quantized"
    with pytest.raises(ValueError, match=match):
        wrapped.train_on_batch(x, y)


@pytest.mark.parametrize(
    "bad_label, ignore_class",
    [(-100, None), (V, None), (V + 5, -100), (-1, 7)],
)
def test_labels_outside_the_vocabulary_are_refused(bad_label, ignore_class):
    """Plain Keras raises on such a label; the chunked loss picked nothing
    and trained silently (#47): -100 without ignore_class, a token id >= the
    vocabulary."""
    x, y, _ = _data()
    y = y.copy()
    y[2, 4] = bad_label
    model = tfmemopt.Model.wrap(_functional(), chunked_loss=True)
    model.compile(
        keras.optimizers.SGD(0.5),
        keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=ignore_class
        ),
    )
    before = _weights(model)
    with pytest.raises(tf.errors.InvalidArgumentError, match="ignore_class"):
        model.train_on_batch(x, y)
    assert _diff(before, _weights(model)) == 0.0  # nothing was applied


@pytest.mark.parametrize("bad_label", [-100, V])
def test_labels_outside_the_vocabulary_make_the_loss_nan_under_xla(bad_label):
    """An XLA step cannot raise: the loss is NaN, as plain Keras's is under
    XLA on the same batch (it trained on with a finite loss before)."""
    x, y, _ = _data()
    y = y.copy()
    y[2, 4] = bad_label
    losses = {}
    for name, model in (
        ("plain", _functional()),
        ("chunked", tfmemopt.Model.wrap(_functional(), chunked_loss=True)),
    ):
        model.compile(
            keras.optimizers.SGD(0.5),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=True,
        )
        losses[name] = float(model.train_on_batch(x, y))
    assert np.isnan(losses["plain"]) and np.isnan(losses["chunked"]), losses


def test_the_ignore_class_label_trains():
    x, y, _ = _data()
    y = y.copy()
    y[2, 4:] = -100
    model = tfmemopt.Model.wrap(_functional(), chunked_loss=True)
    model.compile(
        keras.optimizers.SGD(0.5),
        keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=-100
        ),
    )
    loss = model.train_on_batch(x, y)
    assert np.isfinite(loss)
