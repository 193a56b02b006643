"""Two local workers train one tfmemopt.Model with MultiWorkerMirroredStrategy.

Run `python examples/multi_worker.py`: it starts two worker processes on
127.0.0.1 (free ports), each with its own `TF_CONFIG`, waits for both and
prints what each ended with. On real machines, start the same `worker()` on
each host with a `TF_CONFIG` listing every host; nothing else changes.

Batch semantics: `batch_size` is global. With 2 workers and global batch 32,
each worker takes 16 samples per step and splits them into
`accumulation_steps=4` micro-batches of 4; one all-reduce per update.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile


def worker():
    # oneDNN's allocator keeps the CPU's memory statistics; TensorFlow
    # enables it by default only on some CPUs (not on AMD).
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    import tfmemopt

    strategy = tfmemopt.distribute.auto_strategy()  # reads TF_CONFIG
    print(tfmemopt.distribute.describe(strategy), flush=True)
    with strategy.scope():
        inputs = keras.Input((20,))
        h = keras.layers.Dense(64, activation="relu")(inputs)
        outputs = keras.layers.Dense(1)(h)
        model = tfmemopt.Model(inputs, outputs, accumulation_steps=4)
        model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 20)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)  # global
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    history = model.fit(data.with_options(options), epochs=3, verbose=0)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    print(f"worker {task}: loss per epoch {history.history['loss']}")


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def launch(num_workers=2, timeout=600):
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(num_workers)]}
    procs, outs = [], []
    for index in range(num_workers):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}
        )
        # One file per worker: lines written at the same moment by two
        # processes into one pipe can end up on one line.
        outs.append(tempfile.TemporaryFile("w+"))
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--worker"], env=env, stdout=outs[-1]
            )
        )
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:  # never leave a worker behind
            if p.poll() is None:
                p.kill()
                p.wait()
        for out in outs:  # each worker's lines, one worker after the other
            out.seek(0)
            print(out.read(), end="", flush=True)
            out.close()
    if any(codes):
        raise SystemExit(f"a worker failed: exit codes {codes}")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        launch()
