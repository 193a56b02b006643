"""tfmemopt under MultiWorkerMirroredStrategy: two processes.

Two worker processes on 127.0.0.1 (free ports), one replica each, run in
turn, each against one process training on the whole global batch:

- `tfmemopt.Model` with `accumulation_steps=2`: the same weights;
- the same with `steps_per_execution=4` on 6 batches per epoch (the second
  execution is partial, its last batch short; Keras 3's own multi-step loop
  fails there, keras-team/keras#19246): the same weights, optimizer
  iterations and logs as Keras's loop;
- a `ShardedOptimizer` AdamW (the state cut in two across the processes),
  then `save_weights` (saving gathers the parts: a collective both workers
  join): the same weights, half the state on each worker, and the saved
  optimizer state of the one process.

Then the same two processes train the first model again with
`keras.callbacks.BackupAndRestore`, worker 1 kills itself mid-epoch, both are
restarted, and the final weights must equal the uninterrupted run. All of it
in two launches of the two workers (each launch costs a cluster start, and
one TensorFlow import: both workers are forked from a process that has
imported TensorFlow, Keras and tfmemopt, whose runtime it never starts).
Every launch is bounded in time: past it the test kills its process group.
"""

import signal

import numpy as np
import pytest
from conftest import read_workers
from conftest import run_workers
from conftest import saved_optimizer_state as _optimizer_state

WORKER = r"""
import json, os, signal, sys
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import keras
import tfmemopt

EPOCHS = 3
# "first": the uninterrupted run, then the one that worker 1 kills;
# "restart": that one, restarted from its backup.
out_path, backup, mode = sys.argv[1], sys.argv[2], sys.argv[3]
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    return x, y

def build():
    keras.utils.set_random_seed(0)
    inp = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh")(inp)
    m = tfmemopt.Model(inp, keras.layers.Dense(1)(h), accumulation_steps=2)
    m.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
              loss="mse", metrics=["mae"])
    return m

class Kill(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
    def on_train_batch_end(self, batch, logs=None):
        if task == 1 and [self.epoch, batch] == [1, 2]:
            os.kill(os.getpid(), signal.SIGKILL)

strategy = tfmemopt.distribute.auto_strategy()
info = tfmemopt.distribute.describe(strategy)
x, y = data()
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
opts = tf.data.Options()
opts.experimental_distribute.auto_shard_policy = (
    tf.data.experimental.AutoShardPolicy.DATA)

def fit(callbacks=()):
    with strategy.scope():
        model = build()
    hist = model.fit(ds.with_options(opts), epochs=EPOCHS, verbose=0,
                     callbacks=list(callbacks))
    return {"describe": info, "history": hist.history,
            "weights": [w.numpy().ravel().tolist() for w in model.weights]}

class Batches(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.seen = []
    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(batch)

def steps_per_execution_run():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(88, 6)).astype("float32")
    y = rng.normal(size=(88, 1)).astype("float32")

    def train(fit_data, **kw):
        keras.utils.set_random_seed(0)
        inp = keras.Input((6,))
        h = keras.layers.Dense(8, activation="tanh")(inp)
        m = tfmemopt.Model(inp, keras.layers.Dense(1)(h),
                           accumulation_steps=2)
        m.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="mse", metrics=["mae"], steps_per_execution=4)
        batches = Batches()
        hist = m.fit(*fit_data, epochs=2, verbose=0, callbacks=[batches],
                     **kw)
        return {"weights": [w.numpy().ravel().tolist() for w in m.weights],
                "iterations": int(m.optimizer.iterations.numpy()),
                "batches": batches.seen, "history": hist.history}

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with strategy.scope():
        out = train([ds.with_options(opts)])
    if task == 0:
        # One process, no strategy: Keras's own loop on the global batch.
        out["reference"] = train([x, y], batch_size=16, shuffle=False)
    return out

def sharded_optimizer_run():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 9)).astype("float32")
    y = rng.normal(size=(64, 3)).astype("float32")
    where = os.path.dirname(out_path)

    def build(sharded):
        keras.utils.set_random_seed(0)
        inp = keras.Input((9,))
        h = keras.layers.Dense(13, activation="tanh")(inp)
        m = tfmemopt.Model(inp, keras.layers.Dense(3)(h),
                           accumulation_steps=2)
        opt = keras.optimizers.AdamW(1e-2, weight_decay=0.05)
        if sharded:
            opt = tfmemopt.ShardedOptimizer(opt)
        m.compile(optimizer=opt, loss="mse")
        return m

    with strategy.scope():
        model = build(True)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model.fit(ds.with_options(opts), epochs=3, verbose=0)
    model.save_weights(os.path.join(where, f"w{task}.weights.h5"))
    state = sum(
        int(np.prod(c.shape)) * c.dtype.size
        for v in model.optimizer.state_variables
        for c in strategy.experimental_local_results(v.value))
    out = {"replicas": strategy.num_replicas_in_sync, "state_bytes": state,
           "weights": [w.numpy().ravel().tolist() for w in model.weights]}
    if task == 0:
        ref = build(False)
        ref.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
        ref.save_weights(os.path.join(where, "ref.weights.h5"))
        out["reference"] = [w.numpy().ravel().tolist() for w in ref.weights]
        out["reference_state_bytes"] = sum(
            int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
            for v in ref.optimizer.variables)
    return out

backup_and_restore = keras.callbacks.BackupAndRestore(
    os.path.join(backup, f"worker{task}"), save_freq="epoch")
if mode == "restart":
    result = fit([backup_and_restore])
else:
    result = fit()
    result["spe"] = steps_per_execution_run()
    result["sharded"] = sharded_optimizer_run()
    if task == 0:
        # One process, whole global batch, no strategy: the reference.
        ref = build()
        ref.fit(x, y, batch_size=16, epochs=EPOCHS, shuffle=False, verbose=0)
        result["reference"] = [w.numpy().ravel().tolist()
                               for w in ref.weights]
with open(out_path, "w") as f:
    json.dump(result, f)
if mode == "first":
    # The same training again in the same processes (one launch fewer),
    # backed up each epoch: worker 1 kills itself in epoch 1, and worker 0
    # waits on it until the launcher kills it.
    fit([backup_and_restore, Kill()])
"""

TIMEOUT = 360  # seconds for each launch of the two workers


def _max_diff(a, b):
    return max(float(np.max(np.abs(np.subtract(p, q)))) for p, q in zip(a, b))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi_worker")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    backup = str(tmp / "backup")
    # The uninterrupted run, then (same processes) the one worker 1 kills.
    killed, outs = run_workers(
        script,
        tmp,
        "plain",
        (backup, "first"),
        until_any_dies=True,
        timeout=TIMEOUT,
    )
    plain = read_workers(outs, tmp, "plain")
    restart_codes, outs = run_workers(
        script, tmp, "restart", (backup, "restart"), timeout=TIMEOUT
    )
    restarted = read_workers(outs, tmp, "restart")
    return {
        "tmp": tmp,
        "plain": plain,
        "killed": killed,
        "restart_codes": restart_codes,
        "restarted": restarted,
    }


@pytest.mark.slow
def test_two_workers_equal_one_process(runs):
    w0, w1 = runs["plain"]
    assert (
        "MultiWorkerMirroredStrategy: 2 replicas on 2 workers"
        in (w0["describe"])
    )
    assert w0["weights"] == w1["weights"]  # both workers hold the same
    diff = _max_diff(w0["weights"], w0["reference"])
    print(f"two workers vs one process: max abs diff {diff:.3g}")
    assert diff < 1e-6
    loss = w0["history"]["loss"]
    assert len(loss) == 3 and np.isfinite(loss).all()
    assert loss[-1] < loss[0]  # it trained: the comparison is not vacuous


@pytest.mark.slow
def test_worker_killed_mid_epoch_resumes_to_the_same_weights(runs):
    assert runs["killed"][1] == -signal.SIGKILL  # worker 1 really died
    assert runs["restart_codes"] == [0, 0]
    uninterrupted = runs["plain"][0]["weights"]
    for worker in runs["restarted"]:
        diff = _max_diff(worker["weights"], uninterrupted)
        print(f"restarted vs uninterrupted: max abs diff {diff:.3g}")
        assert diff < 1e-6
    ref = _max_diff(
        runs["restarted"][0]["weights"], runs["plain"][0]["reference"]
    )
    assert ref < 1e-6
    # The restart resumed from the end of epoch 0: it ran epochs 1 and 2.
    assert len(runs["restarted"][0]["history"]["loss"]) == 2


@pytest.mark.slow
def test_two_workers_with_steps_per_execution_equal_one_process(runs):
    w0, w1 = (worker["spe"] for worker in runs["plain"])
    ref = w0["reference"]
    assert "2 replicas on 2 workers" in runs["plain"][0]["describe"]
    assert w0["weights"] == w1["weights"]
    diff = _max_diff(w0["weights"], ref["weights"])
    print(f"two workers, steps_per_execution=4 vs one process: {diff:.3g}")
    assert diff < 1e-6
    assert max(abs(v) for w in ref["weights"] for v in w) > 0.1
    for worker in (w0, w1):
        assert worker["iterations"] == ref["iterations"] == 2 * 6
        # Keras's numbering: the end of each execution, partial or not.
        assert worker["batches"] == ref["batches"] == [3, 7, 3, 7]
        for key in ("loss", "mae"):
            np.testing.assert_allclose(
                worker["history"][key], ref["history"][key], 1e-5
            )


@pytest.mark.slow
def test_two_workers_shard_the_state_and_equal_one_process(runs):
    w0, w1 = (worker["sharded"] for worker in runs["plain"])
    assert w0["replicas"] == 2
    assert w0["weights"] == w1["weights"]
    scale = max(float(np.max(np.abs(a))) for a in w0["reference"])
    diff = max(
        float(np.max(np.abs(np.subtract(a, b))))
        for a, b in zip(w0["weights"], w0["reference"])
    )
    assert diff <= 1e-5 * scale, diff
    # Each worker (one replica) holds half of the state, padding aside.
    for w in (w0, w1):
        assert w["state_bytes"] <= w0["reference_state_bytes"] / 2 * 1.05
    ref = _optimizer_state(runs["tmp"] / "ref.weights.h5")
    for i in (0, 1):
        saved = _optimizer_state(runs["tmp"] / f"w{i}.weights.h5")
        assert saved.keys() == ref.keys()
        for key in ref:
            np.testing.assert_allclose(saved[key], ref[key], atol=1e-5)
