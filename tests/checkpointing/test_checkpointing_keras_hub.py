"""Checkpointing keras-hub backbones the user did not write.

Tiny randomly initialised backbones (no download), dropout active: the
gradients of one training step equal those of the same backbone without
checkpointing, built from the same seed.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfmemopt

keras_hub = pytest.importorskip("keras_hub")
keras = pytest.importorskip("keras")

VOCAB, SEQ = 50, 8
TINY = dict(
    vocabulary_size=VOCAB,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    dropout=0.1,
    max_sequence_length=SEQ,
)


def _bert():
    keras.utils.set_random_seed(0)
    return keras_hub.models.BertBackbone(**TINY)


def _gpt2():
    keras.utils.set_random_seed(0)
    return keras_hub.models.GPT2Backbone(**TINY)


def _inputs(with_segments):
    rng = np.random.RandomState(0)
    tokens = rng.randint(1, VOCAB, (3, SEQ)).astype("int32")
    padding = np.ones((3, SEQ), "int32")
    padding[0, 5:] = 0  # the attention mask matters
    inputs = {"token_ids": tokens, "padding_mask": padding}
    if with_segments:
        inputs["segment_ids"] = np.zeros_like(tokens)
    return inputs


def _grads(model, inputs):
    @tf.function
    def step(inputs):
        with tf.GradientTape() as tape:
            outputs = tf.nest.flatten(model(inputs, training=True))
            loss = tf.add_n([tf.reduce_mean(tf.square(o)) for o in outputs])
        return tape.gradient(loss, model.trainable_variables)

    return [
        None if g is None else np.asarray(tf.convert_to_tensor(g))
        for g in step(inputs)
    ]


def _assert_equal_grads(ref, got):
    assert [g is None for g in got] == [g is None for g in ref]
    pairs = [(a, b) for a, b in zip(ref, got) if a is not None]
    scale = max(float(np.max(np.abs(a))) for a, _ in pairs)
    diff = max(float(np.max(np.abs(a - b))) for a, b in pairs)
    assert scale > 0
    assert diff <= 1e-6 * scale


@pytest.mark.parametrize(
    "build, with_segments", [(_bert, True), (_gpt2, False)]
)
def test_gradients_equal_on_keras_hub_backbone(build, with_segments):
    inputs = _inputs(with_segments)
    ref = _grads(build(), inputs)
    model = build()
    report = tfmemopt.enable_checkpointing(model, "blocks")
    assert report.segments == [["transformer_layer_0"], ["transformer_layer_1"]]
    _assert_equal_grads(ref, _grads(model, inputs))
    # 'auto' cuts between the transformer layers although every layer also
    # reads the padding mask (a model input), and BERT's last segment
    # returns both outputs (the sequence and the pooled one).
    model = build()
    report = tfmemopt.enable_checkpointing(model, "auto")
    assert len(report.segments) >= 2
    assert report.segments[0][-1] == "transformer_layer_0"
    _assert_equal_grads(ref, _grads(model, inputs))
