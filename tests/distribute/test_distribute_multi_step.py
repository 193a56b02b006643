"""`steps_per_execution > 1` across two workers (collective all-reduce).

Keras 3's own multi-step loop fails there as under MirroredStrategy
(keras-team/keras#19246); `tfmemopt.Model` runs its own loop. Two worker
processes on 127.0.0.1 train with `accumulation_steps=2` and
`steps_per_execution=4` on 6 batches per epoch (the second execution is
partial, its last batch short): both must end with the weights, optimizer
iterations and logs of one process running Keras's loop on the global batch.
The processes are launched, bounded and killed by the multi-worker test's
helpers.
"""

import numpy as np
import pytest

from .test_distribute_multi_worker import _launch
from .test_distribute_multi_worker import _max_diff
from .test_distribute_multi_worker import _read
from .test_distribute_multi_worker import _wait

WORKER = r"""
import json, os, sys
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import keras
import tfmemopt

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
rng = np.random.default_rng(0)
x = rng.normal(size=(88, 6)).astype("float32")
y = rng.normal(size=(88, 1)).astype("float32")

class Batches(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.seen = []
    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(batch)

def train(fit_data, **kw):
    keras.utils.set_random_seed(0)
    inp = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh")(inp)
    m = tfmemopt.Model(inp, keras.layers.Dense(1)(h), accumulation_steps=2)
    m.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
              loss="mse", metrics=["mae"], steps_per_execution=4)
    batches = Batches()
    hist = m.fit(*fit_data, epochs=2, verbose=0, callbacks=[batches], **kw)
    return {"weights": [w.numpy().ravel().tolist() for w in m.weights],
            "iterations": int(m.optimizer.iterations.numpy()),
            "batches": batches.seen, "history": hist.history}

strategy = tfmemopt.distribute.auto_strategy()
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
opts = tf.data.Options()
opts.experimental_distribute.auto_shard_policy = (
    tf.data.experimental.AutoShardPolicy.DATA)
with strategy.scope():
    result = train([ds.with_options(opts)])
result["describe"] = tfmemopt.distribute.describe(strategy)
if task == 0:
    # One process, no strategy: Keras's own loop on the global batch.
    result["reference"] = train([x, y], batch_size=16, shuffle=False)
with open(sys.argv[1], "w") as f:
    json.dump(result, f)
"""


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi_step")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    procs, outs = _launch(script, tmp, "spe")
    codes = _wait(procs, tmp, "spe")
    results = _read(outs, tmp, "spe")
    assert codes == [0, 0]
    return results


@pytest.mark.slow
def test_two_workers_with_steps_per_execution_equal_one_process(workers):
    w0, w1 = workers
    ref = w0["reference"]
    assert "2 replicas on 2 workers" in w0["describe"]
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
