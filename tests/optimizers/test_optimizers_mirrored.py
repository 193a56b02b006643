"""Adam8bit/AdamW8bit and Adafactor under MirroredStrategy on two logical
CPUs, against one device, in one subprocess."""

import pytest
from conftest import run_in_subprocess

CODE = """
import numpy as np, keras, tfmemopt
from tfmemopt.optimizers import Adam8bit, AdamW8bit, Adafactor

strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
out = {}

# 1. Same gradients, same codes: dyadic per-replica gradients whose sum is
# exact, so the all-reduced gradient equals the one-device gradient bit for
# bit; every replica's codes must equal the one-device codes.
rng = np.random.default_rng(0)
w0 = rng.normal(size=(256, 12)).astype("float32")
grads = [np.round(rng.normal(size=(256, 12)) * 256).astype("float32") / 512
         for _ in range(3)]

def one_device():
    w = keras.Variable(w0)
    opt = Adam8bit(min_8bit_size=0, block_size=64)
    opt._CHUNK = 300  # the piecewise path: 12 pieces of 256 (4 blocks)
    for g in grads:
        opt.apply_gradients([(g, w)])
    return w.numpy(), [np.asarray(v) for v in opt.variables]

def mirrored():
    with strategy.scope():
        w = keras.Variable(w0)
        opt = Adam8bit(min_8bit_size=0, block_size=64)
        opt._CHUNK = 300
        opt.build([w])
    @tf.function
    def step(g):
        def fn(g):
            # each replica holds half of the gradient: the sum is exact
            opt.apply_gradients([(g / 2, w)])
        strategy.run(fn, args=(g,))
    for g in grads:
        step(tf.constant(g))
    comps = [[np.asarray(c) for c in strategy.experimental_local_results(
        v.value)] for v in opt.variables]
    return w.numpy(), comps

w_one, s_one = one_device()
w_mir, s_mir = mirrored()
out["codes_equal"] = all(
    all(np.array_equal(a, c) for c in comps)
    for a, comps in zip(s_one[1:], s_mir[1:]))
out["weights_equal"] = bool(np.array_equal(w_one, w_mir))

# 2. model.fit under the strategy against one device, global batch 32.
def fit(make_opt, use_strategy):
    keras.utils.set_random_seed(0)
    scope = strategy.scope() if use_strategy else tf.name_scope("one")
    with scope:
        model = keras.Sequential([
            keras.Input((12,)),
            keras.layers.Dense(400, activation="tanh"),
            keras.layers.Dense(2)])
        model.compile(make_opt(), "mse")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(128, 12)).astype("float32")
    y = rng.normal(size=(128, 2)).astype("float32")
    model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    codes = [np.asarray(v) for v in model.optimizer.variables
             if v.dtype == "uint8"]
    return [w.numpy() for w in model.weights], codes

for name, make in [
        # default min_8bit_size: the 12x400 kernel is 8-bit, the rest float32
        ("adamw8bit", lambda: AdamW8bit(1e-3)),
        ("adafactor", lambda: Adafactor(0.01)),
        ("keras_adamw", lambda: keras.optimizers.AdamW(1e-3))]:
    (a, ca), (b, cb) = fit(make, False), fit(make, True)
    out[name] = {
        "max_rel": max(float(np.abs(u - v).max() / np.abs(u).max())
                       for u, v in zip(a, b)),
        "l2_rel": max(float(np.linalg.norm(u - v) / np.linalg.norm(u))
                      for u, v in zip(a, b)),
        "codes": sum(c.size for c in ca),
        "codes_differing": sum(int((c != d).sum()) for c, d in zip(ca, cb)),
    }

# 3. ShardedOptimizer partitions the 8-bit state in whole blocks (the
# composition itself: tests/distribute/test_sharded_optimizer_8bit.py).
with strategy.scope():
    w = keras.Variable(w0)
    sharded = tfmemopt.distribute.ShardedOptimizer(
        Adam8bit(min_8bit_size=0, block_size=64))
    sharded.build([w])
out["sharded"] = sorted(
    [tuple(c.shape) for c in strategy.experimental_local_results(v.value)]
    for v in sharded.inner_optimizer.variables if v.dtype != "int64"
    and len(v.shape))
emit(out)
"""


@pytest.mark.slow
def test_mirrored_same_codes_and_weights_as_one_device():
    out = run_in_subprocess(CODE, n_cpus=2, timeout=600)
    assert out["codes_equal"] and out["weights_equal"], out
    # Keras's AdamW sets the floor (all-reduce order, measured 1.3e-6);
    # ours within 1e-5 (measured: no code differs, 1.2e-6). A code could
    # flip where the all-reduce's rounding moves a moment across a midpoint
    # of the map; that element would move by up to one map gap of its
    # update (1.4% of one step): the count and the L2 bound say how many.
    assert out["keras_adamw"]["max_rel"] <= 1e-5, out
    assert out["adafactor"]["max_rel"] <= 1e-5, out
    assert out["adamw8bit"]["codes"] == 2 * 12 * 400
    assert out["adamw8bit"]["codes_differing"] <= 0.001 * 9600, out
    assert out["adamw8bit"]["l2_rel"] <= 1e-5, out
    assert out["adamw8bit"]["max_rel"] <= 1e-5, out
    # 3072 elements = 48 blocks of 64: 24 blocks of codes and scales per
    # replica, for each of the two moments.
    assert out["sharded"] == [[[24], [24]]] * 2 + [[[1536], [1536]]] * 2, out
    print(out)
