"""Position-embedding rows under MirroredStrategy (two logical CPUs, in a
subprocess): the summed rows go through the replicas' sparse all-reduce."""

from __future__ import annotations

import pytest
from conftest import run_in_subprocess

CODE = """
import numpy as np, keras, tfmemopt
from tests.clients import models as M

strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
x, y = M.text_data(16)

def train(wrap, opt):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        # One transformer block (the client has two): the position rows'
        # gradient is what is checked; each block is traced four times.
        model = M.text_transformer(blocks=1)
        if wrap:
            model = tfmemopt.Model.wrap(model, 2)
        w0 = model.get_weights()
        model.compile(optimizer=opt(), loss=M.sce())
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    return w0, model.get_weights()

out = {}
for name, opt in [("sgd", lambda: keras.optimizers.SGD(0.1)),
                  ("adam", M.adam)]:
    w0, ref = train(False, opt)
    _, got = train(True, opt)
    change = max(float(np.abs(a - b).max()) for a, b in zip(ref, w0))
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ref, got))
    out[name] = diff / change
emit(out)
"""


@pytest.mark.slow
def test_position_embedding_rows_under_mirrored_strategy():
    """Against plain Keras under the same strategy (Keras's all-reduce of
    sparse rows concatenates the replicas' rows, so each position row
    reaches Adam once per replica in both)."""
    out = run_in_subprocess(CODE, n_cpus=2)
    assert out["sgd"] <= 1e-5, out
    assert out["adam"] <= 1e-4, out
