"""estimate_memory and plan on wrapped models and variable-length inputs."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import tfmemopt


def text_model(seq=None):
    """keras-hub's input form: a dict of `token_ids` and `padding_mask`."""
    tokens = keras.Input((seq,), dtype="int32", name="token_ids")
    mask = keras.Input((seq,), dtype="int32", name="padding_mask")
    h = keras.layers.Embedding(100, 16)(tokens)
    h = keras.layers.Dense(32, activation="relu")(h)
    h = h * keras.ops.expand_dims(keras.ops.cast(mask, h.dtype), -1)
    logits = keras.layers.Dense(100)(h)
    model = keras.Model({"token_ids": tokens, "padding_mask": mask}, logits)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(True))
    return model


def test_trained_wrapped_model_is_estimated_as_the_model_it_wraps():
    inner = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(64), keras.layers.Dense(2)]
    )
    wrapped = tfmemopt.Model.wrap(inner, 2)
    wrapped.compile("adam", "mse")
    wrapped.fit(np.zeros((8, 16)), np.zeros((8, 2)), verbose=0)
    # It said "not built ... Fix: build it first" for a trained model.
    est = tfmemopt.estimate_memory(wrapped, 32, accumulation_steps=2)
    same = tfmemopt.estimate_memory(
        inner, 32, accumulation_steps=2, optimizer=wrapped.optimizer
    )
    assert est.total == same.total > 0
    p = tfmemopt.plan(wrapped, 32, "1GiB")
    assert p.global_batch_size == 32


def test_variable_length_inputs_take_a_sequence_length_or_shapes():
    model = text_model()
    with pytest.raises(ValueError, match="sequence_length=128"):
        tfmemopt.estimate_memory(model, 8)
    fixed = tfmemopt.estimate_memory(text_model(seq=64), 8)
    by_length = tfmemopt.estimate_memory(model, 8, sequence_length=64)
    by_shape = tfmemopt.estimate_memory(
        model, 8, input_shape={"token_ids": (64,), "padding_mask": (64,)}
    )
    assert by_length.total == by_shape.total == fixed.total
    # Activations grow with the length: the estimate is not a constant.
    longer = tfmemopt.estimate_memory(model, 8, sequence_length=256)
    assert longer.activations > 3 * by_length.activations
    p = tfmemopt.plan(model, 8, "1GiB", sequence_length=64)
    assert p.estimated_peak == by_length.total


@pytest.mark.parametrize(
    "input_shape, error, match",
    [
        ({"tokens": (64,)}, ValueError, "does not have"),
        ([(64,)], ValueError, "has 2 inputs"),
        ({"token_ids": (64, 2)}, ValueError, "does not match input"),
        ({"token_ids": (0,)}, ValueError, "positive ints"),
        ("64", TypeError, "one sample's shape"),
    ],
)
def test_bad_input_shapes_say_what_was_expected(input_shape, error, match):
    with pytest.raises(error, match=match):
        tfmemopt.estimate_memory(
            text_model(), 8, input_shape=input_shape, sequence_length=64
        )


def test_unbuilt_subclassed_model_takes_input_shape():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(8)

        def call(self, x):
            return self.dense(x)

    with pytest.raises(ValueError, match="pass `input_shape=`"):
        tfmemopt.estimate_memory(Net(), 4)
    est = tfmemopt.estimate_memory(Net(), 4, input_shape=(32,))
    assert est.parameters == (32 * 8 + 8) * 4
