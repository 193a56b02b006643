"""ShardedOptimizer under MultiWorkerMirroredStrategy: two processes.

Two worker processes on 127.0.0.1 (one replica each, so the state is cut in
two across the processes) train `tfmemopt.Model` with a sharded AdamW, then
both save the weights (saving gathers the parts: a collective both workers
join). The weights must equal one process training unwrapped AdamW on the
whole global batch, each worker must hold half the state, and the saved
optimizer state must equal the one process's.
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
from conftest import saved_optimizer_state as _optimizer_state

WORKER = r"""
import json, os, sys
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import keras
import tfmemopt

out_path = sys.argv[1]
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 9)).astype("float32")
y = rng.normal(size=(64, 3)).astype("float32")

def build(sharded):
    keras.utils.set_random_seed(0)
    inp = keras.Input((9,))
    h = keras.layers.Dense(13, activation="tanh")(inp)
    m = tfmemopt.Model(inp, keras.layers.Dense(3)(h), accumulation_steps=2)
    opt = keras.optimizers.AdamW(1e-2, weight_decay=0.05)
    if sharded:
        opt = tfmemopt.ShardedOptimizer(opt)
    m.compile(optimizer=opt, loss="mse")
    return m

strategy = tfmemopt.distribute.auto_strategy()
with strategy.scope():
    model = build(True)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
opts = tf.data.Options()
opts.experimental_distribute.auto_shard_policy = (
    tf.data.experimental.AutoShardPolicy.DATA)
model.fit(ds.with_options(opts), epochs=3, verbose=0)
model.save_weights(os.path.join(os.path.dirname(out_path),
                                f"w{task}.weights.h5"))
state = sum(
    int(np.prod(c.shape)) * c.dtype.size
    for v in model.optimizer.state_variables
    for c in strategy.experimental_local_results(v.value))
result = {"replicas": strategy.num_replicas_in_sync, "state_bytes": state,
          "weights": [w.numpy().ravel().tolist() for w in model.weights]}
if task == 0:
    ref = build(False)
    ref.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    ref.save_weights(os.path.join(os.path.dirname(out_path),
                                  "ref.weights.h5"))
    result["reference"] = [w.numpy().ravel().tolist() for w in ref.weights]
    result["reference_state_bytes"] = sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        for v in ref.optimizer.variables)
with open(out_path, "w") as f:
    json.dump(result, f)
"""

TIMEOUT = 240


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.slow
def test_two_workers_shard_the_state_and_equal_one_process(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
    procs, outs = [], []
    for i in range(2):
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": i}}
        )
        out = tmp_path / f"out{i}.json"
        log = open(tmp_path / f"log{i}.txt", "w")
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(out)],
                env=env,
                stdout=log,
                stderr=log,
                cwd=ROOT,
            )
        )
        outs.append(out)
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            if all(p.poll() is not None for p in procs):
                break
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=30)
    results = []
    for i, out in enumerate(outs):
        if not out.exists():
            log = (tmp_path / f"log{i}.txt").read_text()[-4000:]
            pytest.fail(f"worker {i} wrote no result:\n{log}")
        results.append(json.loads(out.read_text()))
    w0, w1 = results
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
    ref = _optimizer_state(tmp_path / "ref.weights.h5")
    for i in (0, 1):
        saved = _optimizer_state(tmp_path / f"w{i}.weights.h5")
        assert saved.keys() == ref.keys()
        for key in ref:
            np.testing.assert_allclose(saved[key], ref[key], atol=1e-5)
