"""find_batch_size against what fits in fresh processes (API and CLI).

The budget is the peak that one training step at batch 512 reaches in a
fresh process: the search must return at least 0.9x of the largest batch
that really fits there, and the `tfmemopt find-batch-size` command must
agree with the API. Each measurement runs in its own fresh interpreter
(an allocator that ran other work keeps chunks that change later peaks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT
from conftest import run_in_subprocess

from tfmemopt import memory

_MODEL = """
import numpy as np
import keras

def make_model():
    # Activations grow with the batch; 0.8 MiB of weights and Adam slots.
    inputs = keras.Input((32,))
    h = keras.layers.Dense(2048, activation="relu")(inputs)
    for _ in range(3):
        h = keras.layers.Activation("tanh")(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse")
    return model

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 32)).astype("float32")
y = rng.normal(size=(256, 1)).astype("float32")
"""

_FIT = (
    _MODEL
    + """
batch = BATCH
model = make_model()
if SAVE:
    model.save(SAVE)
xb, yb = np.resize(x, (2 * batch, 32)), np.resize(y, (2 * batch, 1))
tf.config.experimental.reset_memory_stats("CPU:0")
model.fit(xb, yb, batch_size=batch, epochs=1, verbose=0)
emit(tf.config.experimental.get_memory_info("CPU:0")["peak"])
"""
)

_FIND = (
    _MODEL
    + """
import tfmemopt
found = tfmemopt.find_batch_size(
    make_model(), (x, y), memory_budget=BUDGET, verbose=0
)
emit([found.batch_size, found.largest_fitting])
"""
)


def _fresh_peak(batch, save=None):
    code = _FIT.replace("BATCH", str(batch)).replace("SAVE", repr(save))
    return run_in_subprocess(code, n_cpus=1)


@pytest.mark.skipif(
    not memory.stats_available("CPU:0"),
    reason="CPU allocator statistics need TF_ENABLE_ONEDNN_OPTS=1",
)
@pytest.mark.slow
def test_budget_of_a_fresh_peak_finds_that_batch_in_api_and_cli(tmp_path):
    path = str(tmp_path / "wide.keras")
    budget = _fresh_peak(512, save=path)
    # 520 (the next multiple of 8) does not fit in a fresh process: 512 is
    # the largest batch that really fits this budget.
    assert _fresh_peak(520) > budget, "the model no longer grows past 512"

    api, largest = run_in_subprocess(
        _FIND.replace("BUDGET", str(budget)), n_cpus=1
    )
    assert 0.9 * 512 <= api <= largest <= 512, (api, largest, budget)

    env = dict(os.environ, PYTHONPATH=ROOT, TF_ENABLE_ONEDNN_OPTS="1")
    cli = subprocess.run(
        [sys.executable, "-m", "tfmemopt.cli", "find-batch-size", path]
        + ["--memory", str(budget), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    out = json.loads(cli.stdout)
    assert out["limit_bytes"] == budget
    # Same model and shapes (the CLI makes random data): the same search.
    assert abs(out["batch_size"] - api) <= 8, (out, api)
    assert out["batch_size"] >= 0.9 * 512
