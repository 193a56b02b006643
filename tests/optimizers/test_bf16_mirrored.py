"""bfloat16 weights under MirroredStrategy on two logical CPUs (one
subprocess): every replica rounds alike, with and without sharded state."""

import pytest
from conftest import run_in_subprocess

CODE = """
import numpy as np, keras, tfmemopt
from tfmemopt.optimizers import AdamW8bit

strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 12)).astype("float32")
y = rng.normal(size=(64, 2)).astype("float32")

def fit(wrap, mode):
    keras.config.set_dtype_policy("bfloat16")
    try:
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([
                keras.Input((12,)),
                keras.layers.Dense(256, activation="tanh"),
                keras.layers.Dense(2)])
            inner = AdamW8bit(3e-3, block_size=64, min_8bit_size=0,
                              bf16_update=mode)
            model.compile(wrap(inner), "mse")
    finally:
        keras.config.set_dtype_policy("float32")
    hist = model.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                     verbose=0)
    opt = model.optimizer
    state = getattr(opt, "inner_optimizer", opt).variables
    def same(variables):
        return all(
            all(np.array_equal(np.asarray(c[0]), np.asarray(o)) for o in c)
            for c in (strategy.experimental_local_results(v.value)
                      for v in variables))
    weights = [np.asarray(keras.ops.cast(w, "float32")) for w in model.weights]
    kahan = [v for v in state if v.name.endswith("kahan")]
    return {
        "loss": hist.history["loss"],
        "replicas_equal": same(model.weights),
        "dtypes": sorted({str(w.dtype) for w in model.weights}),
        "kahan": len(kahan),
        "kahan_replicas_equal": same(kahan),
    }, weights

out, w = {}, {}
for name, wrap, mode in [
        ("mirrored", lambda o: o, None),
        ("sharded", lambda o: tfmemopt.ShardedOptimizer(o, stage=2), None),
        ("accumulating", lambda o: tfmemopt.AccumulatingOptimizer(
            o, accumulation_steps=2), "kahan")]:
    out[name], w[name] = fit(wrap, mode)
out["sharded_vs_mirrored"] = max(
    float(np.abs(a - b).max()) for a, b in zip(w["sharded"], w["mirrored"]))
emit(out)
"""


@pytest.mark.slow
def test_replicas_round_alike_mirrored_sharded_accumulating():
    out = run_in_subprocess(CODE, n_cpus=2, timeout=600)
    for name in ("mirrored", "sharded", "accumulating"):
        run = out[name]
        assert run["dtypes"] == ["bfloat16"], out
        assert run["replicas_equal"], (name, out)
        assert run["loss"][-1] < run["loss"][0], (name, out)
    # ShardedOptimizer: each replica rounds its own partition with the bits
    # of the whole parameter's elements, so it equals the unsharded step.
    assert out["sharded_vs_mirrored"] == 0.0, out
    assert out["accumulating"]["kahan"] == 4
    assert out["accumulating"]["kahan_replicas_equal"], out
    print(out)
