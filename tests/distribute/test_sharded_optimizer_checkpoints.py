"""ShardedOptimizer checkpoints do not depend on the replica count.

Written with 2 replicas (`model.save`, `save_weights`, `BackupAndRestore`
interrupted after 2 of 4 epochs), read back with 4 replicas, on one device
and into an unwrapped AdamW: the optimizer state read back is the state
written (bit for bit), and training continues as the uninterrupted 2-replica
run does (to the all-reduce rounding floor).
"""

import json
import os

import numpy as np
import pytest
from conftest import run_in_subprocess
from conftest import saved_optimizer_state as _optimizer_state

COMMON = """
import json, os, numpy as np, keras, tfmemopt
from tfmemopt.distribute import ShardedOptimizer

R = len(tf.config.list_logical_devices("CPU"))
STRATEGY = (tf.distribute.MirroredStrategy([f"CPU:{i}" for i in range(R)])
            if R > 1 else tf.distribute.get_strategy())
rng = np.random.default_rng(0)
X = rng.normal(size=(64, 37)).astype("float32")
Y = rng.normal(size=(64, 5)).astype("float32")
D = os.environ["CKPT_DIR"]

def make(sharded=True):
    keras.utils.set_random_seed(0)
    with STRATEGY.scope():
        inp = keras.Input((37,))
        h = keras.layers.Dense(61, activation="tanh")(inp)
        m = keras.Model(inp, keras.layers.Dense(5)(h))
        lr = keras.optimizers.schedules.ExponentialDecay(1e-2, 3, 0.8)
        opt = keras.optimizers.AdamW(lr, weight_decay=0.05)
        if sharded:
            opt = ShardedOptimizer(opt)
        m.compile(optimizer=opt, loss="mse")
    return m

def fit(m, epochs, callbacks=()):
    m.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
          callbacks=list(callbacks))
    return [w.numpy().tolist() for w in m.trainable_weights]

class Epochs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ran = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.ran += 1


class Stop(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise RuntimeError("interrupted")
"""

WRITE = """
m = make()
w0 = [w.numpy().tolist() for w in m.trainable_weights]
fit(m, 2)
m.save(os.path.join(D, "m.keras"))
m.save_weights(os.path.join(D, "m.weights.h5"))
# The uninterrupted run: the same model trained on after it was saved
# (same batches, the schedule reads the iterations), as a 4-epoch run.
ref = fit(m, 2)
m = make()
try:
    fit(m, 4, [keras.callbacks.BackupAndRestore(os.path.join(D, "backup")),
               Stop()])
except RuntimeError:
    pass
emit({"w0": w0, "ref": ref})
"""

READ = """
# Read back at R=4, then on one device (the default strategy) in the same
# process: make(), fit() and the file names read the globals R, STRATEGY.
results, epochs_run = {}, {}
# A finished fit deletes its backup: each reader restores its own copy of
# the R=2 backup (else the one-device run would find none, train 4 epochs
# from scratch and restore nothing).
import shutil
for n in (R, 1):
    shutil.copytree(os.path.join(D, "backup"), os.path.join(D, f"backup_{n}"))
for R, STRATEGY in ((R, STRATEGY), (1, tf.distribute.get_strategy())):
    out = results[R] = {}
    with STRATEGY.scope():
        m = keras.saving.load_model(os.path.join(D, "m.keras"))
    m.save_weights(os.path.join(D, f"resaved_{R}.weights.h5"))
    out["keras"] = fit(m, 2)
    def load_weights(m):
        # As with any Keras optimizer, the state loads into a built optimizer.
        with STRATEGY.scope():
            m.optimizer.build(m.trainable_variables)
        m.load_weights(os.path.join(D, "m.weights.h5"))

    m = make()
    load_weights(m)
    out["weights"] = fit(m, 2)
    m = make()
    epochs = Epochs()
    out["backup"] = fit(m, 4, [keras.callbacks.BackupAndRestore(
        os.path.join(D, f"backup_{R}")), epochs])
    epochs_run[R] = epochs.ran
    if R == 1:
        m = make(sharded=False)
        load_weights(m)
        out["unwrapped_adamw"] = fit(m, 2)
emit({"read": results, "epochs_run": epochs_run})
"""


@pytest.mark.slow
def test_checkpoint_written_with_two_replicas_reads_anywhere(tmp_path):
    env = {"CKPT_DIR": str(tmp_path)}
    written = run_in_subprocess(COMMON + WRITE, n_cpus=2, env=env, timeout=600)
    w0 = [np.asarray(w) for w in written["w0"]]
    ref = [np.asarray(w) for w in written["ref"]]
    change = max(float(np.max(np.abs(r - w))) for r, w in zip(ref, w0))
    saved = _optimizer_state(tmp_path / "m.weights.h5")
    # The whole state, in AdamW's own layout: the iteration count (the
    # learning rate is a schedule) + 2 slots x 4 variables, each slot shaped
    # like its variable.
    assert len(saved) == 9, sorted(saved)
    shapes = sorted(v.shape for v in saved.values())
    assert (37, 61) in shapes and (61, 5) in shapes

    # One process with 4 logical CPUs reads at R=4 and on one device.
    read = run_in_subprocess(COMMON + READ, n_cpus=4, env=env, timeout=600)
    # BackupAndRestore resumed at epoch 3 of 4 at both replica counts.
    assert read["epochs_run"] == {"4": 2, "1": 2}, read["epochs_run"]
    results = {int(n): out for n, out in read["read"].items()}
    assert set(results) == {4, 1}, sorted(results)
    for n_cpus in (4, 1):
        resaved = _optimizer_state(tmp_path / f"resaved_{n_cpus}.weights.h5")
        assert resaved.keys() == saved.keys()
        for key in saved:
            np.testing.assert_array_equal(resaved[key], saved[key])
    report = {}
    for n_cpus, out in results.items():
        for how, weights in out.items():
            diff = max(
                float(np.max(np.abs(np.asarray(w) - r)))
                for w, r in zip(weights, ref)
            )
            report[f"{n_cpus}:{how}"] = diff / change
    with open(os.path.join(tmp_path, "report.json"), "w") as f:
        json.dump(report, f)
    assert set(report) == {
        "4:keras",
        "4:weights",
        "4:backup",
        "1:keras",
        "1:weights",
        "1:backup",
        "1:unwrapped_adamw",
    }, report
    for how, diff in report.items():
        assert diff <= 1e-5, report
