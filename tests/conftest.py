"""Shared test helpers.

- `run_in_subprocess(code, n_cpus=2)`: runs `code` in a fresh Python whose CPU
  is split into `n_cpus` logical devices before TensorFlow initialises (it
  cannot be done later in this process). The code prints its result as JSON on
  the last line with `emit(obj)`; the helper returns it.
- `measure_step_peak(fn)`: the peak CPU:0 bytes above the baseline while
  `fn()` runs (oneDNN allocator statistics; skips when unavailable).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PRELUDE = """\
import json, os, sys
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
_cpus = tf.config.list_physical_devices("CPU")
if {n_cpus} > 1:
    tf.config.set_logical_device_configuration(
        _cpus[0],
        [tf.config.LogicalDeviceConfiguration()] * {n_cpus},
    )
def emit(obj):
    sys.stdout.write("\\n@@RESULT@@" + json.dumps(obj) + "\\n")
    sys.stdout.flush()
"""


def run_in_subprocess(
    code: str,
    n_cpus: int = 2,
    timeout: float = 300,
    env: dict | None = None,
):
    """Runs `code` in a fresh interpreter with `n_cpus` logical CPUs.

    Returns what the code passed to `emit(...)` (the last call), or raises
    AssertionError with the child's output when it failed.
    """
    source = _PRELUDE.format(n_cpus=int(n_cpus)) + textwrap.dedent(code)
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = (
        ROOT + os.pathsep + child_env.get("PYTHONPATH", "")
    )
    if env:
        child_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env,
        cwd=ROOT,
    )
    results = [
        line[len("@@RESULT@@") :]
        for line in proc.stdout.splitlines()
        if line.startswith("@@RESULT@@")
    ]
    if proc.returncode != 0 or not results:
        raise AssertionError(
            f"subprocess failed (exit {proc.returncode}):\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n"
            f"--- stderr ---\n{proc.stderr[-8000:]}"
        )
    return json.loads(results[-1])


def saved_optimizer_state(path) -> dict:
    """The optimizer's arrays in a `.weights.h5` file, by their h5 path."""
    import h5py
    import numpy as np

    out = {}
    with h5py.File(path, "r") as f:

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and name.startswith("optimizer"):
                out[name] = np.asarray(obj)

        f.visititems(visit)
    return out


@pytest.fixture
def subprocess_runner():
    return run_in_subprocess


def measure_step_peak(fn, device: str = "CPU:0") -> int:
    """Peak bytes above the baseline while `fn()` runs on `device`."""
    from tfmemopt.memory import MemoryStatsUnavailable
    from tfmemopt.memory import measure_peak

    try:
        peak, _ = measure_peak(fn, device)
    except MemoryStatsUnavailable as e:
        pytest.skip(str(e))
    return peak


@pytest.fixture
def step_peak():
    return measure_step_peak


def pytest_collection_finish(session):
    """Keeps Python's garbage collection cheap in the test processes.

    A full `gc.collect()` walks every tracked object: with TensorFlow, Keras
    and the test modules imported that is ~380,000 objects and 0.3-0.4 s.
    What is imported by now lives as long as the process, so it is moved
    out of the collector's sight once (`gc.freeze()`); later collections
    walk only what the tests made.
    """
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _clean_keras_state():
    """Each test starts from float32, a fresh Keras session and fixed seeds."""
    import keras

    keras.config.set_dtype_policy("float32")
    # With a full `gc.collect()` (cheaper after `gc.freeze()` above): without
    # it, in-process memory tests saw the previous tests' garbage.
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")
