"""The small-state optimizers inside tfmemopt's accumulation, under loss
scaling and bfloat16 (one process; MirroredStrategy is in
test_optimizers_mirrored.py)."""

import keras
import numpy as np
import pytest

import tfmemopt
from tfmemopt.optimizers import Adafactor
from tfmemopt.optimizers import Adam8bit
from tfmemopt.optimizers import AdamW8bit

OPTIMIZERS = {
    "adamw8bit": lambda: AdamW8bit(0.01, min_8bit_size=0, block_size=64),
    "adafactor": lambda: Adafactor(0.05),
}


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(n, 12)).astype("float32"),
        rng.normal(size=(n, 2)).astype("float32"),
    )


def layers(seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((12,))
    h = keras.layers.Dense(40, activation="tanh")(inp)
    out = keras.layers.Dense(2, dtype="float32")(h)
    return inp, out


def state(opt):
    return [np.asarray(v).copy() for v in opt.variables]


# max |w - w_full| / max |w_full - w_init|: the window's summed gradient
# differs from the whole batch's by float rounding only; Adafactor carries
# it, an 8-bit code may flip on it (docs/optimizers.md, "Accumulation and
# 8-bit state"; the bound is tested in test_accumulation_8bit_bound.py)
WHOLE_BATCH_DISTANCE = {"adamw8bit": 2e-2, "adafactor": 1e-4}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_tfmemopt_model_accumulation_updates_once_per_window(name):
    x, y = data()
    runs = {}
    for steps in (1, 4):
        inp, out = layers()
        model = tfmemopt.Model(inp, out, accumulation_steps=steps)
        model.compile(OPTIMIZERS[name](), "mse")
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        runs[steps] = model
    assert int(runs[4].optimizer.iterations) == 4  # once per batch of 32
    start = [w.numpy() for w in tfmemopt.Model(*layers()).weights]
    full = [w.numpy() for w in runs[1].weights]
    moved = max(np.abs(a - w0).max() for a, w0 in zip(full, start))
    diff = max(
        np.abs(a - b.numpy()).max() for a, b in zip(full, runs[4].weights)
    )
    assert diff <= WHOLE_BATCH_DISTANCE[name] * moved


def test_accumulating_optimizer_quantises_the_window_mean_once():
    w1 = keras.Variable(np.linspace(-1, 1, 300).reshape(10, 30), "float32")
    w2 = keras.Variable(w1.numpy())
    acc = tfmemopt.AccumulatingOptimizer(
        Adam8bit(min_8bit_size=0, block_size=64), accumulation_steps=2
    )
    ref = Adam8bit(min_8bit_size=0, block_size=64)
    rng = np.random.default_rng(0)
    for _ in range(3):
        g1, g2 = (rng.normal(size=(10, 30)).astype("float32") for _ in "ab")
        acc.apply_gradients([(g1, w1)])
        acc.apply_gradients([(g2, w1)])
        ref.apply_gradients([((g1 + g2) / np.float32(2), w2)])
    assert int(acc.iterations) == 3
    np.testing.assert_allclose(w1.numpy(), w2.numpy(), rtol=0, atol=1e-7)
    for a, b in zip(state(acc.inner_optimizer)[1:], state(ref)[1:]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mixed_float16_skips_non_finite_steps_state_untouched(name):
    x, y = data(32)
    keras.config.set_dtype_policy("mixed_float16")
    try:
        inp, out = layers()
        model = keras.Model(inp, out)
        model.compile(OPTIMIZERS[name](), "mse")
        model.train_on_batch(x, y)
        lso = model.optimizer
        assert isinstance(lso, keras.optimizers.LossScaleOptimizer)
        before = state(lso.inner_optimizer)
        weights = [w.numpy() for w in model.weights]
        scale = float(lso.dynamic_scale)
        bad = x.copy()
        bad[3, 0] = 7e4  # overflows float16 in the forward pass
        model.train_on_batch(bad, y)
        assert float(lso.dynamic_scale) == scale / 2
        for a, b in zip(before, state(lso.inner_optimizer)):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(weights, model.weights):
            np.testing.assert_array_equal(a, b.numpy())
        model.train_on_batch(x, y)  # finite again: trains
        assert any(
            not np.array_equal(a, b)
            for a, b in zip(before, state(lso.inner_optimizer))
        )
        assert all(np.isfinite(s).all() for s in state(lso.inner_optimizer))
    finally:
        keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_mixed_bfloat16_trains_with_the_same_state(name):
    x, y = data(64)
    losses = {}
    for policy in ("float32", "mixed_bfloat16"):
        keras.config.set_dtype_policy(policy)
        try:
            inp, out = layers()
            model = keras.Model(inp, out)
            opt = OPTIMIZERS[name]()
            model.compile(opt, "mse")
            hist = model.fit(x, y, batch_size=16, epochs=4, verbose=0)
        finally:
            keras.config.set_dtype_policy("float32")
        losses[policy] = hist.history["loss"]
        if name == "adamw8bit":
            assert {v.dtype for v in opt.variables[2:]} == {"uint8", "float32"}
        assert all(np.isfinite(s).all() for s in state(opt))
    assert losses["mixed_bfloat16"][-1] < losses["mixed_bfloat16"][0]
    assert losses["mixed_bfloat16"][-1] == pytest.approx(
        losses["float32"][-1], rel=0.05
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_jit_compile_gives_the_same_weights(name):
    x, y = data(64)
    runs = []
    for jit in (False, True):
        inp, out = layers()
        model = keras.Model(inp, out)
        model.compile(OPTIMIZERS[name](), "mse", jit_compile=jit)
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        runs.append([w.numpy() for w in model.weights])
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
