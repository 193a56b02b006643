"""ShardedOptimizer around tfmemopt's 8-bit Adam/AdamW (issue #18).

The cut of an 8-bit variable falls on block boundaries, so each replica's
codes and scales are whole blocks of the unsharded state: same arithmetic,
same codes. Two subprocesses, one per test:

- 2 logical CPUs (a module fixture, both tests read it): AdamW8bit (a
  schedule, weight decay; stage 1 and 2) and Adam8bit under mixed_float16,
  sharded against unsharded under the same strategy (weights; the saved
  state, which is the whole unsharded 8-bit state, bit for bit), the state
  bytes each replica holds, and a checkpoint (`.keras`, `save_weights`)
  written after 2 of 4 epochs.
- 4 logical CPUs (`extended`): the same at R=4, then the R=2 checkpoint read
  back at R=4, on one device (the default strategy), into a plain unsharded
  AdamW8bit and into a sharded AdamW8bit with another block size
  (re-encoded): training continues as the uninterrupted R=2 run does, to the
  8-bit optimizer's own floor between replica counts (measured in the same
  run).
"""

import numpy as np
import pytest
from conftest import run_in_subprocess
from conftest import saved_optimizer_state as _optimizer_state

import tfmemopt
from tfmemopt.distribute import ShardedOptimizer

COMMON = """
import os, numpy as np, keras, tfmemopt
from tfmemopt.distribute import ShardedOptimizer
from tfmemopt.optimizers import Adam8bit, AdamW8bit

R = len(tf.config.list_logical_devices("CPU"))
STRATEGY = tf.distribute.MirroredStrategy([f"CPU:{i}" for i in range(R)])
ONE = tf.distribute.get_strategy()
D = os.environ["CKPT_DIR"]
rng = np.random.default_rng(0)
X = rng.normal(size=(96, 37)).astype("float32")
Y = rng.normal(size=(96, 5)).astype("float32")
# Kernels 37x250 (9250) and 250x5 (1250) are 8-bit (min_8bit_size=512), in
# blocks of 64 (neither size a multiple of 64); the biases stay float32.
OPTS = {
    "adam8bit": lambda bs=64: Adam8bit(1e-2, block_size=bs,
                                       min_8bit_size=512),
    "adamw8bit": lambda bs=64: AdamW8bit(
        keras.optimizers.schedules.ExponentialDecay(1e-2, 3, 0.8),
        weight_decay=0.05, block_size=bs, min_8bit_size=512),
}

def make(strategy, name, sharded, policy="float32", bs=64):
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        inp = keras.Input((37,))
        h = keras.layers.Dense(250, activation="tanh")(inp)
        m = keras.Model(inp, keras.layers.Dense(5, dtype="float32")(h))
        opt = OPTS[name](bs)
        if sharded:
            opt = ShardedOptimizer(opt, stage=int(sharded))
        m.compile(optimizer=opt, loss="mse")
    keras.config.set_dtype_policy("float32")
    return m

def fit(m, epochs):
    # `epochs` passes over the data as one Keras epoch: with shuffle=False
    # and 16 | 96 the same batches in the same order, without the
    # distributed iterator Keras makes per epoch.
    m.fit(np.concatenate([X] * epochs), np.concatenate([Y] * epochs),
          batch_size=16, shuffle=False, verbose=0)
    return [w.numpy() for w in m.trainable_weights]

def rel(a, b, w0):
    change = max(float(np.max(np.abs(q - p))) for p, q in zip(w0, b))
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b)) / change

def state_bytes(opt):
    while hasattr(opt, "inner_optimizer"):
        opt = opt.inner_optimizer
    per = {}
    for v in opt.variables:
        for c in STRATEGY.experimental_local_results(v.value):
            per[c.device] = per.get(c.device, 0) + (
                int(np.prod(c.shape)) * c.dtype.size)
    return sorted(per.values())

def save(m, tag):
    m.save_weights(os.path.join(D, f"{tag}.weights.h5"))
"""

WRITE = """
out = {}
# AdamW8bit (a schedule, weight decay) sharded and unsharded: 2 epochs, the
# checkpoint, 2 more (the uninterrupted run).
ms = make(STRATEGY, "adamw8bit", True)
mu = make(STRATEGY, "adamw8bit", False)
out["w0"] = [w.numpy().tolist() for w in ms.trainable_weights]
fit(ms, 2)
fit(mu, 2)
ms.save(os.path.join(D, "m.keras"))
save(ms, "m")
save(mu, "plain_2")
ref, b = fit(ms, 2), fit(mu, 2)
out["ref"] = [w.tolist() for w in ref]
w0 = [np.asarray(w, "float32") for w in out["w0"]]
out["adamw8bit"] = {"vs_unsharded": rel(ref, b, w0),
                    "bytes_sharded": state_bytes(ms.optimizer),
                    "bytes_plain": state_bytes(mu.optimizer),
                    "iterations": [int(ms.optimizer.iterations.numpy()),
                                   int(mu.optimizer.iterations.numpy())]}
# Stage 2 (each replica keeps its partition of the summed gradient).
m2 = make(STRATEGY, "adamw8bit", 2)
out["stage2"] = {"vs_unsharded": rel(fit(m2, 4), b, w0),
                 "bytes": state_bytes(m2.optimizer)}
# LossScaleOptimizer(ShardedOptimizer(Adam8bit)) under mixed_float16.
runs = []
for sharded in (True, False):
    m = make(STRATEGY, "adam8bit", sharded, policy="mixed_float16")
    v0 = [w.numpy() for w in m.trainable_weights]
    runs.append((fit(m, 2), int(m.optimizer.iterations.numpy())))
out["mixed_float16"] = {"vs_unsharded": rel(runs[0][0], runs[1][0], v0),
                        "iterations": [runs[0][1], runs[1][1]]}
emit(out)
"""

READ = """
out = {}
runs = {}
# R=4 from scratch, sharded and unsharded (the latter is also the floor:
# the unsharded 8-bit optimizer's own distance from the R=2 run).
ms = make(STRATEGY, "adamw8bit", True)
mu = make(STRATEGY, "adamw8bit", False)
w0 = [w.numpy() for w in ms.trainable_weights]
runs["r4_sharded"] = fit(ms, 4)
runs["gap_r4"] = fit(mu, 4)
save(ms, "r4_sharded")
save(mu, "r4_plain")
out["adamw8bit_r4"] = {
    "vs_unsharded": rel(runs["r4_sharded"], runs["gap_r4"], w0),
    "bytes_sharded": state_bytes(ms.optimizer),
    "bytes_plain": state_bytes(mu.optimizer),
    "iterations": [int(ms.optimizer.iterations.numpy()),
                   int(mu.optimizer.iterations.numpy())]}
runs["gap_one"] = fit(make(ONE, "adamw8bit", False), 4)

def loaded(strategy, sharded, bs=64):
    m = make(strategy, "adamw8bit", sharded, bs=bs)
    # As with any Keras optimizer, the state loads into a built optimizer.
    with strategy.scope():
        m.optimizer.build(m.trainable_variables)
    m.load_weights(os.path.join(D, "m.weights.h5"))
    return m

for where, strategy in (("r4", STRATEGY), ("one", ONE)):
    with strategy.scope():
        m = keras.saving.load_model(os.path.join(D, "m.keras"))
    save(m, f"resaved_{where}")
    runs[f"{where}_keras"] = fit(m, 2)
m = loaded(ONE, False)
save(m, "resaved_one_plain")
runs["one_plain_adamw8bit"] = fit(m, 2)
runs["r4_block_size_32"] = fit(loaded(STRATEGY, True, bs=32), 2)
out["runs"] = {k: [w.tolist() for w in v] for k, v in runs.items()}
emit(out)
"""


def _same_state(a, b):
    sa, sb = _optimizer_state(a), _optimizer_state(b)
    assert sa.keys() == sb.keys(), (sorted(sa), sorted(sb))
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        np.testing.assert_array_equal(sa[key], sb[key], err_msg=key)
    return sa


def _check_sharded(out, replicas):
    # Same arithmetic on whole blocks: bit-equal to the unsharded 8-bit
    # optimizer (measured 0.0); the bound leaves room for a code flipped by
    # another summation order in a future TensorFlow.
    assert out["vs_unsharded"] <= 1e-5, out
    assert out["iterations"][0] == out["iterations"][1] > 0, out
    plain, sharded = out["bytes_plain"], out["bytes_sharded"]
    assert len(sharded) == len(plain) == replicas, out
    # 1/R of the unsharded 8-bit state plus at most one block of codes and
    # its scale per 8-bit variable and moment (the cut is block-aligned) and
    # R-1 elements per float32 moment: measured 0.506 at R=2, 0.256 at R=4.
    assert max(sharded) <= plain[0] / replicas * 1.05, out
    return max(sharded) / plain[0]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The R=2 run (WRITE) and the directory of its checkpoints."""
    path = tmp_path_factory.mktemp("sharded_8bit")
    env = {"CKPT_DIR": str(path)}
    return path, run_in_subprocess(
        COMMON + WRITE, n_cpus=2, env=env, timeout=600
    )


@pytest.mark.slow
def test_sharded_8bit_exact_two_replicas(written):
    tmp_path, written = written
    _check_sharded(written["adamw8bit"], 2)
    r = written["stage2"]
    assert r["vs_unsharded"] <= 1e-5, r
    assert r["bytes"] == written["adamw8bit"]["bytes_sharded"], r
    # LossScaleOptimizer(ShardedOptimizer(Adam8bit)) under mixed_float16.
    r = written["mixed_float16"]
    assert r["vs_unsharded"] <= 1e-5, r
    assert r["iterations"][0] == r["iterations"][1] > 0, r
    # The state saved by the sharded run is the unsharded AdamW8bit's, bit
    # for bit: uint8 codes of the whole kernels, one float32 scale per block
    # of 64, the float32 bias moments, the layout record.
    saved = _same_state(
        tmp_path / "m.weights.h5", tmp_path / "plain_2.weights.h5"
    )
    shapes = sorted(v.shape for v in saved.values())
    assert shapes.count((9250,)) == 2 and shapes.count((145,)) == 2, shapes
    assert sum(v.dtype == np.uint8 for v in saved.values()) == 4, shapes


@pytest.mark.slow
@pytest.mark.extended(
    reason="the 2-replica checks again at 4 replicas, and the 2-replica 8-bit "
    "checkpoint read at 4 replicas, on one device and with another block "
    "size; make test keeps the 8-bit checks at 2 replicas (the test above), "
    "a sharded AdamW checkpoint moved to 4 replicas and one device "
    "(test_sharded_optimizer_checkpoints.py) and a sharded AdamW8bit saved "
    "and loaded at 2 (round_trip/test_round_trip_multi_device.py)"
)
def test_sharded_8bit_checkpoints_move(written):
    tmp_path, written = written
    env = {"CKPT_DIR": str(tmp_path)}
    w0 = [np.asarray(w) for w in written["w0"]]
    ref = [np.asarray(w) for w in written["ref"]]
    change = max(float(np.max(np.abs(r - w))) for r, w in zip(ref, w0))

    read = run_in_subprocess(COMMON + READ, n_cpus=4, env=env, timeout=600)
    ratios = {
        "r2": _check_sharded(written["adamw8bit"], 2),
        "r4": _check_sharded(read["adamw8bit_r4"], 4),
    }
    _same_state(
        tmp_path / "r4_sharded.weights.h5", tmp_path / "r4_plain.weights.h5"
    )
    # Read at R=4, on one device or by a plain AdamW8bit, the state is the
    # state written at R=2.
    for where in ("r4", "one", "one_plain"):
        _same_state(
            tmp_path / f"resaved_{where}.weights.h5", tmp_path / "m.weights.h5"
        )
    diffs = {
        how: max(
            float(np.max(np.abs(np.asarray(w) - r)))
            for w, r in zip(weights, ref)
        )
        / change
        for how, weights in read["runs"].items()
    }
    print({"ratios": ratios, "diffs": diffs})
    # Continuing: the replica count changes the gradient's summation order,
    # and a moment that crosses a midpoint of the 8-bit map flips its code
    # (that element's step moves by one gap of the map). Whether any code
    # flips in a run is chance, so the floor is the larger of the unsharded
    # optimizer's own distances from the R=2 run, run from scratch at R=4
    # and on one device (measured 2.4e-3, 2.4e-5 or 7.0e-3, and 8.15e-3;
    # continuing: 2.5e-3 or 2.8e-3 and 3.7e-7). A lost state is 0.70 away
    # (below).
    floor = max(diffs["gap_r4"], diffs["gap_one"], 1e-4)
    for how in ("r4_keras", "one_keras", "one_plain_adamw8bit"):
        assert diffs[how] <= 3 * floor, diffs
    # Another block size: the moments are decoded and encoded again (a
    # quantisation error on the state). Measured 1.1e-2; the same weights
    # with a new optimizer state (a lost state) were 0.70 away.
    assert diffs["r4_block_size_32"] <= 0.05, diffs


def test_sharded_8bit_refusals():
    with pytest.raises(ValueError, match="lazy_sparse"):
        ShardedOptimizer(tfmemopt.optimizers.AdamW8bit(lazy_sparse=True))
    with pytest.raises(ValueError, match="cannot partition Adafactor"):
        ShardedOptimizer(tfmemopt.optimizers.Adafactor())
    with pytest.raises(TypeError, match="already a ShardedOptimizer"):
        ShardedOptimizer(ShardedOptimizer(tfmemopt.optimizers.Adam8bit()))
