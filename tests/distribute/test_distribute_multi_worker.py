"""tfmemopt.Model under MultiWorkerMirroredStrategy: two processes.

Two worker processes on 127.0.0.1 (free ports) train with
`accumulation_steps=2`; both must end with the weights of one process
training on the whole global batch. Then the same two workers train with
`keras.callbacks.BackupAndRestore`, worker 1 kills itself mid-epoch, both are
restarted, and the final weights must equal the uninterrupted run. Every
process is bounded in time and killed by the test.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT

WORKER = r"""
import json, os, signal, sys
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import keras
import tfmemopt

EPOCHS = 3
out_path, backup, kill_at = sys.argv[1], sys.argv[2], sys.argv[3]
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
        if kill_at != "-" and task == 1 and [self.epoch, batch] == [
                int(v) for v in kill_at.split(",")]:
            os.kill(os.getpid(), signal.SIGKILL)

strategy = tfmemopt.distribute.auto_strategy()
info = tfmemopt.distribute.describe(strategy)
with strategy.scope():
    model = build()
x, y = data()
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
opts = tf.data.Options()
opts.experimental_distribute.auto_shard_policy = (
    tf.data.experimental.AutoShardPolicy.DATA)
callbacks = [Kill()]
if backup != "-":
    callbacks.append(keras.callbacks.BackupAndRestore(
        os.path.join(backup, f"worker{task}"), save_freq="epoch"))
hist = model.fit(ds.with_options(opts), epochs=EPOCHS, verbose=0,
                 callbacks=callbacks)
result = {"describe": info, "history": hist.history,
          "weights": [w.numpy().ravel().tolist() for w in model.weights]}
if task == 0 and backup == "-":
    # One process, whole global batch, no strategy: the reference.
    ref = build()
    ref.fit(x, y, batch_size=16, epochs=EPOCHS, shuffle=False, verbose=0)
    result["reference"] = [w.numpy().ravel().tolist() for w in ref.weights]
with open(out_path, "w") as f:
    json.dump(result, f)
"""

TIMEOUT = 240  # seconds for each launch of the two workers


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _launch(script, tmp, tag, backup="-", kill_at="-"):
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
    procs, outs = [], []
    for i in range(2):
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": i}}
        )
        env.pop("TPU_NAME", None)
        out = tmp / f"{tag}{i}.json"
        log = open(tmp / f"{tag}{i}.log", "w")
        cmd = [sys.executable, str(script), str(out), backup, kill_at]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=log, stderr=log, cwd=ROOT)
        )
        outs.append(out)
    return procs, outs


def _wait(procs, tmp, tag, until_any_dies=False):
    """Waits for the workers; always leaves none running."""
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                return codes
            if until_any_dies and any(c is not None for c in codes):
                return codes
            time.sleep(0.5)
        logs = [(tmp / f"{tag}{i}.log").read_text()[-3000:] for i in (0, 1)]
        pytest.fail(
            f"workers did not finish in {TIMEOUT}s:\n" + "\n".join(logs)
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=30)


def _read(outs, tmp, tag):
    results = []
    for i, out in enumerate(outs):
        if not out.exists():
            log = (tmp / f"{tag}{i}.log").read_text()[-4000:]
            pytest.fail(f"worker {i} wrote no result:\n{log}")
        results.append(json.loads(out.read_text()))
    return results


def _max_diff(a, b):
    return max(float(np.max(np.abs(np.subtract(p, q)))) for p, q in zip(a, b))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi_worker")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    procs, outs = _launch(script, tmp, "plain")
    codes = _wait(procs, tmp, "plain")
    plain = _read(outs, tmp, "plain")
    assert codes == [0, 0]

    backup = str(tmp / "backup")
    procs, outs = _launch(script, tmp, "fault", backup, kill_at="1,2")
    codes = _wait(procs, tmp, "fault", until_any_dies=True)
    killed = [p.returncode for p in procs]
    procs, outs = _launch(script, tmp, "restart", backup)
    restart_codes = _wait(procs, tmp, "restart")
    restarted = _read(outs, tmp, "restart")
    return {
        "plain": plain,
        "killed": killed,
        "first_exit": codes,
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
