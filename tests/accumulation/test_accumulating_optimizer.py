"""Tests for `tfmemopt.AccumulatingOptimizer`.

References are full-batch training with the unwrapped inner optimizer, or
values worked out by hand. Multi-device and fresh-process runs are in
subprocesses (see conftest.run_in_subprocess).
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import run_in_subprocess

import tfmemopt
from tfmemopt import AccumulatingOptimizer

# For subprocesses that import this module: its folder, and tests/ (conftest).
_IMPORTABLE = os.pathsep.join(
    [os.path.dirname(__file__), os.path.dirname(os.path.dirname(__file__))]
)

N_MICRO = 4
MICRO = 8
RTOL = 1e-6


def _data(n=64, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(n, 4).astype("float32")
    y = rng.rand(n, 1).astype("float32")
    return x, y


def _model():
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(5, activation="tanh"),
            keras.layers.Dense(1),
        ]
    )


def _max_rel_diff(a_weights, b_weights):
    scale = max(np.abs(w).max() for w in a_weights)
    diff = max(np.abs(a - b).max() for a, b in zip(a_weights, b_weights))
    return diff / scale


def _fit_pair(make_inner, epochs=2, **compile_kwargs):
    """Full batch with `inner` against micro-batches with the wrapper."""
    x, y = _data()
    full = _model()
    full.compile(make_inner(), "mse", **compile_kwargs)
    full.fit(
        x,
        y,
        batch_size=N_MICRO * MICRO,
        epochs=epochs,
        shuffle=False,
        verbose=0,
    )
    acc = _model()
    acc.compile(
        AccumulatingOptimizer(make_inner(), N_MICRO), "mse", **compile_kwargs
    )
    acc.fit(x, y, batch_size=MICRO, epochs=epochs, shuffle=False, verbose=0)
    updates = epochs * len(x) // (N_MICRO * MICRO)
    return full, acc, updates


OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    "schedule": lambda: keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.5, 1, 0.5)
    ),
    "ema": lambda: keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.5),
    "clipnorm": lambda: keras.optimizers.SGD(0.5, clipnorm=0.01),
    "global_clipnorm": lambda: keras.optimizers.SGD(0.5, global_clipnorm=0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fit_equals_full_batch(name):
    full, acc, updates = _fit_pair(OPTIMIZERS[name])
    assert _max_rel_diff(full.get_weights(), acc.get_weights()) <= RTOL
    assert int(acc.optimizer.iterations) == updates
    assert int(acc.optimizer.inner_optimizer.iterations) == updates
    assert int(acc.optimizer.micro_step) == 0


@pytest.mark.parametrize("name", ["schedule"])
def test_keras_builtin_accumulation_differs(name):
    """The references above are sensitive: Keras's own accumulation is off."""
    x, y = _data()
    full = _model()
    full.compile(OPTIMIZERS[name](), "mse")
    full.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    builtin = _model()
    inner = OPTIMIZERS[name]()
    config = inner.get_config()
    config["gradient_accumulation_steps"] = N_MICRO
    builtin.compile(type(inner).from_config(config), "mse")
    builtin.fit(x, y, batch_size=MICRO, epochs=2, shuffle=False, verbose=0)
    assert _max_rel_diff(full.get_weights(), builtin.get_weights()) > 1e-4


def test_jit_compile_and_steps_per_execution():
    full, acc, updates = _fit_pair(
        OPTIMIZERS["adam"], jit_compile=True, steps_per_execution=4
    )
    assert _max_rel_diff(full.get_weights(), acc.get_weights()) <= RTOL
    assert int(acc.optimizer.iterations) == updates


def test_values_by_hand():
    opt = AccumulatingOptimizer(keras.optimizers.SGD(0.5), 2)
    w = keras.Variable(np.array([1.0, 1.0], "float32"))
    opt.apply_gradients([(np.array([1.0, 2.0], "float32"), w)])
    np.testing.assert_array_equal(w.numpy(), [1.0, 1.0])
    assert int(opt.micro_step) == 1
    opt.apply_gradients([(np.array([3.0, 0.0], "float32"), w)])
    # mean gradient [2, 1], lr 0.5
    np.testing.assert_allclose(w.numpy(), [0.0, 0.5])
    assert int(opt.iterations) == 1
    assert int(opt.micro_step) == 0


def test_gradient_tape_loop_equals_full_batch():
    x, y = _data()
    loss_fn = keras.losses.MeanSquaredError()

    full = _model()
    full_opt = keras.optimizers.Adam(0.01)
    acc = _model()
    acc_opt = AccumulatingOptimizer(keras.optimizers.Adam(0.01), N_MICRO)

    def make_step(model, opt):
        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        return step

    full_step, acc_step = make_step(full, full_opt), make_step(acc, acc_opt)
    for start in range(0, len(x), N_MICRO * MICRO):
        full_step(x[start : start + 32], y[start : start + 32])
    for start in range(0, len(x), MICRO):
        acc_step(x[start : start + MICRO], y[start : start + MICRO])
    assert _max_rel_diff(full.get_weights(), acc.get_weights()) <= RTOL
    assert int(acc_opt.iterations) == len(x) // (N_MICRO * MICRO)


def _masked_loss(y, pred, mask):
    """Sum of squared errors over valid rows / number of valid rows."""
    err = tf.reduce_sum(tf.square(y - pred), axis=-1) * mask
    count = tf.reduce_sum(mask)
    return tf.reduce_sum(err) / count, count


def test_num_items_weights_by_valid_count():
    x, y = _data(32)
    mask = np.ones(32, "float32")
    mask[[1, 2, 3, 4, 5, 9, 17, 18]] = 0.0  # micro-batches: 3, 7, 6, 8 valid

    def trained(num_items_mode):
        model = _model()
        inner = keras.optimizers.SGD(0.5)
        if num_items_mode == "full":
            with tf.GradientTape() as tape:
                loss, _ = _masked_loss(y, model(x), mask)
            grads = tape.gradient(loss, model.trainable_variables)
            inner.apply_gradients(zip(grads, model.trainable_variables))
            return model.get_weights()
        opt = AccumulatingOptimizer(inner, N_MICRO)
        for s in range(0, 32, MICRO):
            with tf.GradientTape() as tape:
                loss, count = _masked_loss(
                    y[s : s + MICRO], model(x[s : s + MICRO]), mask[s : s + 8]
                )
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(
                zip(grads, model.trainable_variables),
                num_items=count if num_items_mode == "weighted" else None,
            )
        assert int(opt.iterations) == 1
        return model.get_weights()

    full = trained("full")
    assert _max_rel_diff(full, trained("weighted")) <= RTOL
    # Without the counts the window is a plain mean: measurably off.
    assert _max_rel_diff(full, trained("plain")) > 1e-3


def test_loss_scale_optimizer_skips_whole_window():
    """LSO(Accumulating): values by hand, one bad micro-step of four."""
    w = keras.Variable(np.ones(2, "float32"))
    lso = keras.optimizers.LossScaleOptimizer(
        AccumulatingOptimizer(keras.optimizers.SGD(0.5), 4), initial_scale=8.0
    )

    @tf.function
    def step(g):
        lso.apply_gradients([(g, w)])

    bad_window = [[8.0, 16.0], [np.inf, 0.0], [8.0, 8.0], [0.0, 8.0]]
    for g in bad_window:
        step(tf.constant(g, "float32"))
    np.testing.assert_array_equal(w.numpy(), [1.0, 1.0])
    assert float(lso.dynamic_scale) == 4.0  # lowered once
    assert int(lso.iterations) == 0
    assert int(lso.inner_optimizer.micro_step) == 0
    for g in [[4.0, 8.0], [4.0, 0.0], [0.0, 8.0], [8.0, 0.0]]:
        step(tf.constant(g, "float32"))
    # unscaled mean gradient [1, 1] at scale 4, lr 0.5
    np.testing.assert_allclose(w.numpy(), [0.5, 0.5])
    assert int(lso.iterations) == 1
    assert float(lso.dynamic_scale) == 4.0


@pytest.mark.parametrize("bad", [0, 3])
def test_window_after_skipped_window_starts_clean(bad):
    """A non-finite first or last micro-step: the window is skipped, the
    stale accumulator is overwritten (not added to) by the next window."""
    w = keras.Variable(np.ones(2, "float32"))
    lso = keras.optimizers.LossScaleOptimizer(
        AccumulatingOptimizer(keras.optimizers.SGD(0.5), 4), initial_scale=2.0
    )
    acc = lso.inner_optimizer

    @tf.function
    def step(g):
        lso.apply_gradients([(g, w)])

    window = [[2.0, 4.0], [6.0, 2.0], [2.0, 2.0], [4.0, 8.0]]
    window[bad] = [np.nan, 0.0]
    for g in window:
        step(tf.constant(g, "float32"))
    np.testing.assert_array_equal(w.numpy(), [1.0, 1.0])
    assert int(acc.micro_step) == 0 and float(lso.dynamic_scale) == 1.0
    step(tf.constant([3.0, 1.0]))
    np.testing.assert_array_equal(acc._accumulators[0].numpy(), [3.0, 1.0])
    for g in [[1.0, 3.0], [0.0, 0.0], [0.0, 0.0]]:
        step(tf.constant(g, "float32"))
    # mean gradient [1, 1] at scale 1, lr 0.5
    np.testing.assert_allclose(w.numpy(), [0.5, 0.5])
    assert int(lso.iterations) == 1


def test_checkpoint_mid_window_holds_partial_sum(tmp_path):
    """The accumulators hold the window's partial sum (state that is
    saved); a restored optimizer finishes the window exactly."""

    def make():
        w = keras.Variable(np.ones(2, "float32"))
        opt = AccumulatingOptimizer(keras.optimizers.SGD(0.5), 4)
        opt.build([w])
        return w, opt, tf.train.Checkpoint(w=w, opt=opt)

    w, opt, ckpt = make()
    for _ in range(4):  # one full window leaves a stale partial sum
        opt.apply_gradients([(tf.constant([9.0, 9.0]), w)])
    for g in ([1.0, 2.0], [3.0, 0.0]):
        opt.apply_gradients([(tf.constant(g), w)])
    np.testing.assert_array_equal(opt._accumulators[0].numpy(), [4.0, 2.0])
    path = ckpt.write(str(tmp_path / "ckpt"))
    w2, opt2, ckpt2 = make()
    ckpt2.read(path).assert_consumed()
    assert int(opt2.micro_step) == 2
    for g in ([0.0, 2.0], [0.0, 0.0]):
        opt.apply_gradients([(tf.constant(g), w)])
        opt2.apply_gradients([(tf.constant(g), w2)])
    # w: 1 - 0.5 * 9 = -3.5, then mean [1, 1]: -4.0
    np.testing.assert_allclose(w2.numpy(), [-4.0, -4.0])
    np.testing.assert_array_equal(w2.numpy(), w.numpy())


def test_loss_scale_wrapping_survives_config_round_trip():
    lso = keras.optimizers.LossScaleOptimizer(
        AccumulatingOptimizer(keras.optimizers.SGD(0.5), 4)
    )
    clone = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(lso)
    )
    assert isinstance(clone.inner_optimizer, AccumulatingOptimizer)
    assert clone.inner_optimizer._outer_loss_scale() is clone
    assert lso.inner_optimizer._outer_loss_scale() is lso


def test_sparse_embedding_gradients():
    """IndexedSlices gradients (Embedding) accumulate like dense ones."""
    ids = np.random.RandomState(0).randint(0, 10, size=(16, 3))
    targets = np.random.RandomState(1).rand(16, 3, 2).astype("float32")

    def trained(micro_batches):
        keras.utils.set_random_seed(2)
        layer = keras.layers.Embedding(10, 2)
        layer.build((None, 3))
        opt = keras.optimizers.SGD(0.5, momentum=0.5)
        if micro_batches > 1:
            opt = AccumulatingOptimizer(opt, micro_batches)
        size = len(ids) // micro_batches
        for _ in range(2):
            for s in range(0, len(ids), size):
                with tf.GradientTape() as tape:
                    out = layer(ids[s : s + size])
                    loss = tf.reduce_mean(
                        tf.square(out - targets[s : s + size])
                    )
                grads = tape.gradient(loss, layer.trainable_variables)
                assert isinstance(grads[0], tf.IndexedSlices)
                opt.apply_gradients(zip(grads, layer.trainable_variables))
        return [layer.embeddings.numpy()]

    assert _max_rel_diff(trained(1), trained(4)) <= RTOL


def test_mixed_float16_compile_skips_window():
    keras.config.set_dtype_policy("mixed_float16")
    x, y = _data(64)
    x[10] = np.inf  # second micro-batch of the first window
    model = _model()
    model.compile(AccumulatingOptimizer(keras.optimizers.Adam(0.01), 4), "mse")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    model.optimizer.build(model.trainable_variables)
    before = [w.copy() for w in model.get_weights()]
    scale = float(model.optimizer.dynamic_scale)
    for s in range(0, 32, MICRO):
        model.train_on_batch(x[s : s + MICRO], y[s : s + MICRO])
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert float(model.optimizer.dynamic_scale) == scale / 2
    assert int(model.optimizer.iterations) == 0
    for s in range(32, 64, MICRO):
        model.train_on_batch(x[s : s + MICRO], y[s : s + MICRO])
    assert int(model.optimizer.iterations) == 1
    after = model.get_weights()
    assert all(np.isfinite(w).all() for w in after)
    assert max(np.abs(a - b).max() for a, b in zip(before, after)) > 0


def test_config_round_trip_and_keras_save(tmp_path):
    opt = AccumulatingOptimizer(
        keras.optimizers.Adam(0.01, clipnorm=1.0), 3, name="acc"
    )
    config = opt.get_config()
    clone = AccumulatingOptimizer.from_config(json.loads(json.dumps(config)))
    assert clone.get_config() == config
    assert clone.inner_optimizer.clipnorm == 1.0
    x, y = _data(32)
    model = _model()
    model.compile(opt, "mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # 4 micro-steps
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.optimizer, AccumulatingOptimizer)
    assert loaded.optimizer.accumulation_steps == 3
    assert int(loaded.optimizer.micro_step) == 1
    np.testing.assert_array_equal(
        model.predict(x, verbose=0), loaded.predict(x, verbose=0)
    )


_RESTORE_AND_CONTINUE = """
import numpy as np, keras, tensorflow as tf, tfmemopt
from test_accumulating_optimizer import _data, _model
x, y = _data()
out = {{}}
keras_model = keras.saving.load_model(r"{dir}/m.keras")
ckpt_model = _model()
ckpt_model.compile(tfmemopt.AccumulatingOptimizer(
    keras.optimizers.Adam(0.01, use_ema=True), 4), "mse")
ckpt_model.optimizer.build(ckpt_model.trainable_variables)
tf.train.Checkpoint(model=ckpt_model, optimizer=ckpt_model.optimizer).read(
    r"{dir}/ckpt").assert_existing_objects_matched()
for name, m in [("keras", keras_model), ("ckpt", ckpt_model)]:
    step = int(m.optimizer.micro_step)
    m.fit(x[16:], y[16:], batch_size=8, epochs=1, shuffle=False, verbose=0)
    out[name] = dict(step=step, iterations=int(m.optimizer.iterations),
                     weights=[w.tolist() for w in m.get_weights()])
emit(out)
"""


@pytest.mark.slow
def test_save_mid_window_restore_in_fresh_process(tmp_path):
    # Saved here (the save needs no fresh process; the restore does).
    x, y = _data()
    model = _model()
    model.compile(
        AccumulatingOptimizer(keras.optimizers.Adam(0.01, use_ema=True), 4),
        "mse",
    )
    model.fit(x[:16], y[:16], batch_size=8, epochs=1, shuffle=False, verbose=0)
    model.save(str(tmp_path / "m.keras"))
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
        str(tmp_path / "ckpt")
    )
    assert int(model.optimizer.micro_step) == 2
    env = {"PYTHONPATH": f"{tmp_path}:{_IMPORTABLE}"}
    result = run_in_subprocess(
        _RESTORE_AND_CONTINUE.format(dir=tmp_path), n_cpus=1, env=env
    )
    x, y = _data()
    ref = _model()
    ref.compile(
        AccumulatingOptimizer(keras.optimizers.Adam(0.01, use_ema=True), 4),
        "mse",
    )
    ref.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for name in ("keras", "ckpt"):
        assert result[name]["step"] == 2
        assert result[name]["iterations"] == int(ref.optimizer.iterations)
        got = [np.array(w) for w in result[name]["weights"]]
        assert _max_rel_diff(ref.get_weights(), got) <= RTOL, name


@pytest.mark.parametrize(
    "steps, error, match",
    [
        (0, ValueError, "integer >= 1"),
        (2.0, TypeError, "integer >= 1"),
        (True, TypeError, "integer >= 1"),
        ("4", TypeError, "accumulation_steps=4"),
    ],
)
def test_bad_accumulation_steps(steps, error, match):
    with pytest.raises(error, match=match):
        AccumulatingOptimizer(keras.optimizers.SGD(), steps)


def test_bad_inner_optimizers():
    with pytest.raises(ValueError, match="pass `accumulation_steps=3`"):
        AccumulatingOptimizer(
            keras.optimizers.SGD(gradient_accumulation_steps=3), 3
        )
    with pytest.raises(ValueError, match=r"LossScaleOptimizer\(Accumulating"):
        AccumulatingOptimizer(
            keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), 2
        )
    with pytest.raises(ValueError, match="product of the two"):
        AccumulatingOptimizer(
            AccumulatingOptimizer(keras.optimizers.SGD(), 2), 2
        )
    with pytest.raises(TypeError, match="not a string or a class"):
        AccumulatingOptimizer("adam", 2)
    with pytest.raises(ValueError, match="Set `clipnorm` on the"):
        AccumulatingOptimizer(keras.optimizers.SGD(), 2, clipnorm=1.0)
    with pytest.raises(ValueError, match="Set it on the `inner_optimizer`"):
        AccumulatingOptimizer(keras.optimizers.SGD(), 2, learning_rate=0.1)
    with pytest.raises(ValueError, match="`momentum`, `nesterov`"):
        AccumulatingOptimizer(
            keras.optimizers.SGD(), 2, nesterov=True, momentum=0.9
        )


def test_public_name():
    assert tfmemopt.AccumulatingOptimizer is AccumulatingOptimizer
    assert "AccumulatingOptimizer" in tfmemopt.__all__


_MIRRORED = """
import numpy as np, keras, tensorflow as tf, tfmemopt
from test_accumulating_optimizer import _data, _model

def counted_strategy():
    cdo = tf.distribute.ReductionToOneDevice()
    calls = tf.Variable(0, dtype=tf.int64)
    batch_reduce = cdo.batch_reduce_implementation

    def counting(*args, **kwargs):
        calls.assign_add(1)  # runs only when the all-reduce does
        return batch_reduce(*args, **kwargs)

    cdo.batch_reduce_implementation = counting
    strategy = tf.distribute.MirroredStrategy(
        ["CPU:0", "CPU:1"], cross_device_ops=cdo)
    return strategy, calls

x, y = _data()
out = {}
for spe in (1, 4):
    strategy, calls = counted_strategy()
    with strategy.scope():
        model = _model()
        model.compile(tfmemopt.AccumulatingOptimizer(
            keras.optimizers.Adam(0.01, global_clipnorm=0.01), 4), "mse",
            steps_per_execution=spe)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    out[f"spe{spe}"] = dict(
        all_reduces=int(calls.numpy()),
        iterations=int(model.optimizer.iterations.numpy()),
        weights=[w.tolist() for w in model.get_weights()])

# Hand-built LossScaleOptimizer(AccumulatingOptimizer) in a custom loop:
# window 1 has an inf on replica 1 only (LossScaleOptimizer looks at
# replica 0), window 2 an inf on replica 0, window 3 is finite.
strategy, calls = counted_strategy()
with strategy.scope():
    w = keras.Variable(np.ones(2, "float32"))
    lso = keras.optimizers.LossScaleOptimizer(tfmemopt.AccumulatingOptimizer(
        keras.optimizers.SGD(0.5), 2), initial_scale=8.0)

@tf.function
def step(per_replica):
    strategy.run(lambda g: lso.apply_gradients([(g, w)]), args=(per_replica,))

def run(g0, g1):
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant([g0, g1][ctx.replica_id_in_sync_group],
                                "float32"))
    step(values)

scales, weights = [], []
for bad in ([[8.0, 8.0], [np.inf, 0.0]], [[np.inf, 0.0], [8.0, 8.0]]):
    run(*bad)
    run([8.0, 8.0], [8.0, 8.0])
    scales.append(float(lso.dynamic_scale.numpy()))
    weights.append(w.numpy().tolist())
run([2.0, 4.0], [2.0, 4.0])
run([2.0, 4.0], [2.0, 4.0])
out["lso"] = dict(scales=scales, weights=weights, final=w.numpy().tolist(),
                  iterations=int(lso.iterations.numpy()),
                  all_reduces=int(calls.numpy()))

# num_items: 2 micro-steps x 2 replicas x 8 rows, valid rows 3, 7, 6, 8.
mask = np.ones(32, "float32")
mask[[1, 2, 3, 4, 5, 9, 17, 18]] = 0.0
strategy, calls = counted_strategy()
with strategy.scope():
    net = _model()
    opt = tfmemopt.AccumulatingOptimizer(keras.optimizers.SGD(0.5), 2)

@tf.function
def masked_step(xs, ys, ms):
    def fn(xb, yb, mb):
        with tf.GradientTape() as tape:
            err = tf.reduce_sum(tf.square(yb - net(xb)), axis=-1) * mb
            count = tf.reduce_sum(mb)
            # Keras's convention: a replica's loss / num_replicas_in_sync.
            loss = tf.reduce_sum(err) / count / 2.0
        grads = tape.gradient(loss, net.trainable_variables)
        opt.apply_gradients(zip(grads, net.trainable_variables),
                            num_items=count)
    strategy.run(fn, args=(xs, ys, ms))

def per_replica(arr, start):
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(arr[start + 8 * ctx.replica_id_in_sync_group:
                                    start + 8 * ctx.replica_id_in_sync_group
                                    + 8]))

for start in (0, 16):
    masked_step(*(per_replica(a, start) for a in (x[:32], y[:32], mask)))
out["num_items"] = dict(weights=[v.tolist() for v in net.get_weights()],
                        iterations=int(opt.iterations.numpy()))

# jit_compile=True under MirroredStrategy on CPUs: plain Keras fails inside
# XLA; the wrapper refuses with a ValueError that says what to do.
out["jit"] = {}
for name, make in [
    ("ours", lambda: tfmemopt.AccumulatingOptimizer(
        keras.optimizers.Adam(0.01), 4)),
    ("plain", lambda: keras.optimizers.Adam(0.01)),
]:
    strategy, calls = counted_strategy()
    with strategy.scope():
        net = _model()
        net.compile(make(), "mse", jit_compile=True)
    try:
        net.fit(x[:32], y[:32], batch_size=8, epochs=1, shuffle=False,
                verbose=0)
        out["jit"][name] = dict(ok=True)
    except Exception as e:
        out["jit"][name] = dict(ok=False, type=type(e).__name__,
                                error=str(e)[-2000:])
emit(out)
"""


@pytest.mark.slow
def test_mirrored_strategy_two_cpus():
    env = {"PYTHONPATH": _IMPORTABLE}
    result = run_in_subprocess(_MIRRORED, n_cpus=2, env=env, timeout=600)
    x, y = _data()
    ref = _model()
    ref.compile(
        AccumulatingOptimizer(
            keras.optimizers.Adam(0.01, global_clipnorm=0.01), 4
        ),
        "mse",
    )
    ref.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    updates = len(x) // (4 * 8)
    for spe in ("spe1", "spe4"):
        got = [np.array(w) for w in result[spe]["weights"]]
        assert _max_rel_diff(ref.get_weights(), got) <= RTOL, spe
        assert result[spe]["iterations"] == updates
        assert result[spe]["all_reduces"] == updates  # one per window
    lso = result["lso"]
    assert lso["scales"] == [4.0, 2.0]  # lowered once per bad window
    assert lso["weights"] == [[1.0, 1.0], [1.0, 1.0]]
    assert lso["iterations"] == 1
    # scale 2: unscaled [1, 2] per micro-step and replica; the window mean
    # [1, 2] per replica is summed over 2 replicas: [2, 4]; lr 0.5.
    np.testing.assert_allclose(lso["final"], [0.0, -1.0])
    assert lso["all_reduces"] == 1

    # num_items under the strategy equals the full batch on one device.
    x32, y32 = x[:32], y[:32]
    mask = np.ones(32, "float32")
    mask[[1, 2, 3, 4, 5, 9, 17, 18]] = 0.0
    full = _model()
    with tf.GradientTape() as tape:
        loss, _ = _masked_loss(y32, full(x32), mask)
    grads = tape.gradient(loss, full.trainable_variables)
    keras.optimizers.SGD(0.5).apply_gradients(
        zip(grads, full.trainable_variables)
    )
    got = [np.array(w) for w in result["num_items"]["weights"]]
    assert result["num_items"]["iterations"] == 1
    assert _max_rel_diff(full.get_weights(), got) <= RTOL

    # jit_compile=True on CPU replicas: Keras fails inside XLA (TF 2.21,
    # Keras 3.15; keras-team/keras#19005); ours refuses before tracing.
    jit = result["jit"]
    assert not jit["plain"]["ok"]
    assert "Trying to access resource" in jit["plain"]["error"]
    assert jit["ours"]["type"] == "ValueError", jit["ours"]
    assert "Compile with `jit_compile=False`" in jit["ours"]["error"]
    assert "autoclustering" in jit["ours"]["error"]


def test_jit_refusal_only_for_cpu_replicas():
    from tfmemopt.distribute._keras_fixes import cpu_only_replicas

    cpu = "/job:localhost/replica:0/task:0/device:CPU:"
    gpu = "/job:localhost/replica:0/task:0/device:GPU:"
    assert cpu_only_replicas([cpu + "0", cpu + "1"])
    assert not cpu_only_replicas([gpu + "0", gpu + "1"])
    assert not cpu_only_replicas([cpu + "0"])


_AUTOCLUSTER = """
import glob
import numpy as np, keras, tensorflow as tf, tfmemopt
from test_accumulating_optimizer import _data, _model
tf.config.optimizer.set_jit("autoclustering")
x, y = _data()
cdo = tf.distribute.ReductionToOneDevice()
calls = tf.Variable(0, dtype=tf.int64)
batch_reduce = cdo.batch_reduce_implementation

def counting(*args, **kwargs):
    calls.assign_add(1)
    return batch_reduce(*args, **kwargs)

cdo.batch_reduce_implementation = counting
strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"],
                                          cross_device_ops=cdo)
with strategy.scope():
    net = _model()
    net.compile(tfmemopt.AccumulatingOptimizer(
        keras.optimizers.Adam(0.01), 4), "mse", steps_per_execution=2)
net.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
clustered = [
    f for f in glob.glob(os.environ["TF_DUMP_GRAPH_PREFIX"]
                         + "/mark_for_compilation_annotated*")
    if "_XlaCluster" in open(f).read()]
emit(dict(weights=[w.tolist() for w in net.get_weights()],
          all_reduces=int(calls.numpy()),
          iterations=int(net.optimizer.iterations.numpy()),
          clustered_graphs=len(clustered)))
"""


@pytest.mark.slow
def test_mirrored_cpus_xla_autoclustering(tmp_path):
    # The XLA route that works on CPU replicas (the ValueError names it).
    env = {
        "PYTHONPATH": _IMPORTABLE,
        "TF_XLA_FLAGS": "--tf_xla_cpu_global_jit --tf_xla_clustering_debug",
        "TF_DUMP_GRAPH_PREFIX": str(tmp_path),
    }
    result = run_in_subprocess(_AUTOCLUSTER, n_cpus=2, env=env, timeout=600)
    x, y = _data()
    ref = _model()
    ref.compile(AccumulatingOptimizer(keras.optimizers.Adam(0.01), 4), "mse")
    ref.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    got = [np.array(w) for w in result["weights"]]
    assert _max_rel_diff(ref.get_weights(), got) <= RTOL
    assert result["iterations"] == result["all_reduces"] == 2
    assert result["clustered_graphs"] > 0  # XLA clusters were formed
