"""Checkpointing leaves the saved model alone: config, `.keras`, estimate.

`enable_checkpointing` builds its segments from the model's own tensors;
the model's graph (what `get_config`, `save` and `clone_model` read) must
be the same before, during and after.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfmemopt
from tfmemopt.checkpointing._recompute import _after
from tfmemopt.memory import measure_peak

SEQ, WIDTH, VOCAB = 8, 16, 20


def _transformer(blocks=3):
    """Token ids and a padding mask in; every block reads the mask."""
    ids = keras.Input((SEQ,), dtype="int32", name="token_ids")
    pad = keras.Input((SEQ,), dtype="int32", name="padding_mask")
    h = keras.layers.Embedding(VOCAB, WIDTH)(ids)
    for _ in range(blocks):
        mask = keras.ops.cast(keras.ops.expand_dims(pad, 1), "bool")
        n = keras.layers.LayerNormalization()(h)
        a = keras.layers.MultiHeadAttention(2, WIDTH // 2, dropout=0.1)(
            n, n, attention_mask=mask
        )
        h = h + a
        f = keras.layers.Dense(2 * WIDTH, activation="gelu")(
            keras.layers.LayerNormalization()(h)
        )
        h = h + keras.layers.Dense(WIDTH)(f)
    out = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model([ids, pad], out)


def _transformer_data():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, size=(4, SEQ)).astype("int32")
    pad = np.ones((4, SEQ), "int32")
    pad[:, -3:] = 0
    return [ids, pad]


def _sequential():
    def block():
        return keras.Sequential(
            [
                keras.layers.Dense(32, activation="gelu"),
                keras.layers.Dropout(0.1),
                keras.layers.Dense(16),
            ]
        )

    return keras.Sequential(
        [keras.Input((16,))]
        + [block() for _ in range(3)]
        + [keras.layers.Dense(16) for _ in range(6)]
        + [keras.layers.Dense(1)]
    )


def _sequential_data():
    return np.random.default_rng(0).normal(size=(4, 16)).astype("float32")


def _graph(model):
    """The node lists and tensor histories a config is made from."""
    ops = getattr(model, "operations", None) or model.layers
    nodes = [(len(op._inbound_nodes), len(op._outbound_nodes)) for op in ops]
    inputs = [t._keras_history for t in model.inputs]
    return nodes, inputs


CASES = [
    (_transformer, _transformer_data, "auto"),
    (_transformer, _transformer_data, "blocks"),
    (_sequential, _sequential_data, "auto"),
    (_sequential, _sequential_data, "blocks"),
]


@pytest.mark.parametrize(
    "build,data,policy",
    CASES,
    ids=["transformer-auto", "transformer-blocks", "seq-auto", "seq-blocks"],
)
def test_enabled_model_config_save_load_estimate(build, data, policy, tmp_path):
    keras.utils.set_random_seed(1)
    model = build()
    x = data()
    expected = np.asarray(model(x))
    config = model.get_config()
    graph = _graph(model)
    report = tfmemopt.enable_checkpointing(model, policy)
    assert len(report.segments) >= 2
    # The graph the config is read from is untouched.
    assert _graph(model) == graph
    assert model.get_config() == config
    rebuilt = model.__class__.from_config(model.get_config())
    rebuilt.set_weights(model.get_weights())
    np.testing.assert_allclose(np.asarray(rebuilt(x)), expected, atol=1e-6)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(np.asarray(loaded(x)), expected, atol=1e-6)
    np.testing.assert_allclose(np.asarray(model(x)), expected, atol=1e-6)
    estimate = tfmemopt.estimate_memory(model, 4)
    assert estimate.total > estimate.parameters > 0
    # Checkpointing still runs after all that, and training works.
    model.compile("sgd", "mse")
    y = np.zeros((4, 1), "float32")
    assert np.isfinite(model.train_on_batch(x, y))
    tfmemopt.disable_checkpointing(model)
    assert tfmemopt.checkpointing.checkpointing_report(model) is None
    assert "call" not in model.__dict__
    assert _graph(model) == graph
    assert model.get_config() == config
    # And it can be enabled again (a second policy, same model).
    tfmemopt.enable_checkpointing(model, policy)
    assert model.get_config() == config


def test_recompute_input_is_not_copied():
    """The recompute waits on the gradient without copying its input."""
    x = tf.random.normal([2**20])  # 4 MiB, above oneDNN's 256 KiB floor
    mask = tf.ones([8, 4], "int32")

    @tf.function
    def run(x, mask, g):
        y, m = _after([x, mask], [g])
        # `y` and `x` both alive at the end: a copy would add 4 MiB.
        return tf.reduce_sum(y) + tf.reduce_max(x), m

    g = tf.ones([3])
    run(x, mask, g)
    peak, (_, m) = measure_peak(lambda: run(x, mask, g))
    assert peak < 2**20
    np.testing.assert_array_equal(m.numpy(), mask.numpy())
    nan = tf.fill([3], float("nan"))  # a NaN gradient still passes through
    np.testing.assert_array_equal(run(x, mask, nan)[1].numpy(), mask.numpy())
