"""ShardedOptimizer on one device, its config, and its errors (in process)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfmemopt
from tfmemopt.distribute import ShardedOptimizer


def _model():
    keras.utils.set_random_seed(0)
    inp = keras.Input((7,))
    h = keras.layers.Dense(9, activation="tanh")(inp)
    return keras.Model(inp, keras.layers.Dense(3)(h))


def _data():
    rng = np.random.default_rng(0)
    return (
        rng.normal(size=(48, 7)).astype("float32"),
        rng.normal(size=(48, 3)).astype("float32"),
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.AdamW(1e-2, global_clipnorm=0.1),
        lambda: keras.optimizers.Nadam(1e-2, use_ema=True),
    ],
)
def test_one_device_is_the_inner_optimizer(make):
    x, y = _data()
    weights = []
    for sharded in (True, False):
        m = _model()
        opt = make()
        m.compile(
            optimizer=ShardedOptimizer(opt) if sharded else opt, loss="mse"
        )
        m.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        weights.append([w.numpy() for w in m.weights])
        if sharded:
            assert m.optimizer.replicas == 1
            assert m.optimizer.iterations.numpy() == 6
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


def test_config_round_trip_and_keras_file(tmp_path):
    x, y = _data()
    m = _model()
    opt = ShardedOptimizer(keras.optimizers.Adam(3e-3), stage=2, name="zero")
    m.compile(optimizer=opt, loss="mse")
    m.fit(x, y, batch_size=16, epochs=1, verbose=0)
    config = opt.get_config()
    assert config["stage"] == 2 and config["name"] == "zero"
    again = ShardedOptimizer.from_config(config)
    assert isinstance(again.inner_optimizer, keras.optimizers.Adam)
    assert again.inner_optimizer.learning_rate.numpy() == pytest.approx(3e-3)
    m.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer, ShardedOptimizer)
    assert loaded.optimizer.stage == 2
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), m.predict(x, verbose=0), atol=1e-6
    )
    for a, b in zip(
        loaded.optimizer.state_variables, m.optimizer.state_variables
    ):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # Training continues from the restored state identically.
    m.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    loaded.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(loaded.weights, m.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6)


def test_exported():
    assert tfmemopt.ShardedOptimizer is ShardedOptimizer
    assert "ShardedOptimizer" in tfmemopt.__all__
    assert "ShardedOptimizer" in tfmemopt.distribute.__all__


def test_not_an_optimizer():
    with pytest.raises(TypeError, match="must be a keras.optimizers.Optimizer"):
        ShardedOptimizer("adam")


@pytest.mark.parametrize("stage", [0, 3, "1", True])
def test_bad_stage(stage):
    with pytest.raises(ValueError, match="`stage` must be 1 .* or 2"):
        ShardedOptimizer(keras.optimizers.Adam(), stage=stage)


def test_wrapping_twice():
    once = ShardedOptimizer(keras.optimizers.Adam())
    with pytest.raises(TypeError, match="wrap the inner optimizer only once"):
        ShardedOptimizer(once)


def test_loss_scale_inside():
    inner = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    with pytest.raises(TypeError, match="Wrap the other way round"):
        ShardedOptimizer(inner)


def test_accumulating_optimizer_inside():
    # It failed at the first step in TensorFlow's colocate_vars_with.
    import tfmemopt

    inner = tfmemopt.AccumulatingOptimizer(keras.optimizers.Adam(), 2)
    with pytest.raises(TypeError, match="accumulation_steps=N"):
        ShardedOptimizer(inner)


@pytest.mark.parametrize("name", ["Adafactor", "Lamb", "Muon"])
def test_not_elementwise(name):
    with pytest.raises(
        ValueError, match="cannot partition .*Use an elementwise"
    ):
        ShardedOptimizer(getattr(keras.optimizers, name)())


def test_tfmemopt_adafactor_not_elementwise():
    with pytest.raises(ValueError, match="cannot partition Adafactor"):
        ShardedOptimizer(tfmemopt.optimizers.Adafactor())


def test_base_arguments_belong_on_the_inner_optimizer():
    with pytest.raises(ValueError, match="set it on the inner optimizer"):
        ShardedOptimizer(keras.optimizers.Adam(), global_clipnorm=1.0)
    with pytest.raises(ValueError, match="unknown arguments: \\['foo'\\]"):
        ShardedOptimizer(keras.optimizers.Adam(), foo=1)


def test_keras_accumulation_refused():
    inner = keras.optimizers.Adam(gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="accumulation_steps=N"):
        ShardedOptimizer(inner)


def test_inner_created_outside_the_strategy_scope():
    inner = keras.optimizers.Adam()
    strategy = tf.distribute.MirroredStrategy(["CPU:0"])
    with strategy.scope():
        opt = ShardedOptimizer(inner)
        v = keras.Variable(np.zeros((3,), "float32"))
        with pytest.raises(ValueError, match="inside `with strategy.scope"):
            opt.build([v])


def test_inner_already_built():
    inner = keras.optimizers.Adam()
    v = keras.Variable(np.zeros((3,), "float32"))
    inner.build([v])
    with pytest.raises(ValueError, match="already built"):
        ShardedOptimizer(inner).build([v])


def test_estimate_memory_counts_one_replicas_share_of_the_state():
    model = _model()
    plain = tfmemopt.estimate_memory(
        model, batch_size=32, optimizer=keras.optimizers.Adam(), replicas=4
    )
    sharded = tfmemopt.estimate_memory(
        model,
        batch_size=32,
        optimizer=ShardedOptimizer(keras.optimizers.Adam()),
        replicas=4,
    )
    # 7*9 + 9 + 9*3 + 3 = 102 weights; each replica keeps ceil(n/4) of
    # every variable's two slots: (16 + 3 + 7 + 1) * 2 * 4 bytes.
    assert plain.optimizer_state == 102 * 2 * 4
    assert sharded.optimizer_state == (16 + 3 + 7 + 1) * 2 * 4
    assert any("1/4 of it per replica" in n for n in sharded.notes)
    one = tfmemopt.estimate_memory(
        model,
        batch_size=32,
        optimizer=ShardedOptimizer(keras.optimizers.Adam()),
    )
    assert one.optimizer_state >= plain.optimizer_state
