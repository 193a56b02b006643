"""Shared test helpers.

- `run_in_subprocess(code, n_cpus=2)`: runs `code` in a fresh Python whose CPU
  is split into `n_cpus` logical devices before TensorFlow initialises (it
  cannot be done later in this process). The code prints its result as JSON on
  the last line with `emit(obj)`; the helper returns it. `step_peak(fn,
  repeats)` there is `measure_step_peak` (it skips the test likewise). With
  `TFMEMOPT_TEST_FORK=1` it is forked from a server that has imported
  TensorFlow, Keras and tfmemopt once (tests/_forkserver.py; ~5 s of CPU
  less per call), unless `env` changes a variable read at import.
- `measure_step_peak(fn)`: the peak CPU:0 bytes above the baseline while
  `fn()` runs (oneDNN allocator statistics; skips when unavailable).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import _forkserver  # noqa: E402
import pytest  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PRELUDE = """\
import json, os, sys
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import gc
import tensorflow as tf
gc.freeze()  # the imports live as long as the process: no collection walks them
_cpus = tf.config.list_physical_devices("CPU")
if {n_cpus} > 1:
    tf.config.set_logical_device_configuration(
        _cpus[0],
        [tf.config.LogicalDeviceConfiguration()] * {n_cpus},
    )
def emit(obj):
    sys.stdout.write("\\n@@RESULT@@" + json.dumps(obj) + "\\n")
    sys.stdout.flush()
def step_peak(fn, repeats=1):
    # The smallest of `repeats` peaks of `fn()` on CPU:0 above its start;
    # where the allocator keeps no statistics the test is skipped.
    from tfmemopt.memory import MemoryStatsUnavailable, measure_peak
    try:
        return min(measure_peak(fn)[0] for _ in range(repeats))
    except MemoryStatsUnavailable as e:
        emit({{"@@skip@@": str(e)}})
        sys.exit(0)
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
    if _forkserver.usable(child_env):
        # TFMEMOPT_TEST_FORK=1: forked after the imports (tests/_forkserver.py).
        proc = _forkserver.run(source, child_env, ROOT, ROOT, timeout)
    else:
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
    result = json.loads(results[-1])
    if isinstance(result, dict) and "@@skip@@" in result:
        pytest.skip(result["@@skip@@"])  # `step_peak` found no statistics
    return result


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# The workers of a multi-worker test, forked from one interpreter after
# the imports (~7 s of CPU each: four of them
# were a third of this file's CPU time). Like tests/_forkserver.py, the
# parent never makes a device or runs an op, so each child starts
# TensorFlow's runtime (and its gRPC server, from TF_CONFIG) itself, as a
# fresh interpreter would. The parent waits for both (or, with
# until_any_dies, for the first and then kills the other) and writes
# their exit codes.
_LAUNCHER = r"""
import json, os, runpy, signal, sys, traceback
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import gc, numpy, tensorflow, keras, tfmemopt  # noqa: F401
gc.freeze()  # the workers' collections skip the imports
spec = json.loads(sys.argv[1])
sys.stdout.flush()
sys.stderr.flush()
pids = []
for i, (config, out, log) in enumerate(spec["workers"]):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            os.environ["TF_CONFIG"] = config
            sys.argv = [spec["script"], out, *spec["args"]]
            runpy.run_path(spec["script"], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(
                e.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    pids.append(pid)
codes = [None] * len(pids)
while None in codes:
    pid, status = os.wait()
    codes[pids.index(pid)] = os.waitstatus_to_exitcode(status)
    if spec["until_any_dies"]:
        for p, c in zip(pids, codes):
            if c is None:
                os.kill(p, signal.SIGKILL)
with open(spec["codes"], "w") as f:
    json.dump(codes, f)
"""


def run_workers(
    script, tmp, tag, args=(), until_any_dies=False, n=2, timeout=360
):
    """Runs `n` workers of `script` as the workers of one
    MultiWorkerMirroredStrategy cluster on free local ports (worker `i`:
    `tmp/{tag}{i}.json` for its result, `tmp/{tag}{i}.log` for its
    output; `script` is run with `sys.argv = [script, result path,
    *args]`); returns their exit codes and result paths. Fails the test
    with their logs after `timeout` seconds, leaving none running."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(n)]}
    outs = [tmp / f"{tag}{i}.json" for i in range(n)]
    spec = {
        "script": str(script),
        "args": [str(a) for a in args],
        "until_any_dies": until_any_dies,
        "codes": str(tmp / f"{tag}.codes.json"),
        "workers": [
            [
                json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": i}}
                ),
                str(outs[i]),
                str(tmp / f"{tag}{i}.log"),
            ]
            for i in range(n)
        ],
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TPU_NAME", None)
    env.pop("TF_CONFIG", None)
    launcher = tmp / f"{tag}.launcher.log"
    with open(launcher, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, json.dumps(spec)],
            env=env,
            stdout=log,
            stderr=log,
            cwd=ROOT,
            start_new_session=True,  # its own group: the workers too
        )
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        logs = [(tmp / f"{tag}{i}.log").read_text()[-3000:] for i in range(n)]
        pytest.fail(
            f"workers did not finish in {timeout}s:\n" + "\n".join(logs)
        )
    finally:
        if proc.poll() is None:  # timed out or interrupted: the whole group
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    codes_path = tmp / f"{tag}.codes.json"
    if proc.returncode != 0 or not codes_path.exists():
        pytest.fail(f"the launcher failed:\n{launcher.read_text()[-4000:]}")
    return json.loads(codes_path.read_text()), outs


def read_workers(outs, tmp, tag):
    """The workers' JSON results; fails with a worker's log if it wrote
    none."""
    results = []
    for i, out in enumerate(outs):
        if not out.exists():
            log = (tmp / f"{tag}{i}.log").read_text()[-4000:]
            pytest.fail(f"worker {i} wrote no result:\n{log}")
        results.append(json.loads(out.read_text()))
    return results


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


def measure_step_peak(fn, device: str = "CPU:0", repeats: int = 1) -> int:
    """Peak bytes above the baseline while `fn()` runs on `device`.

    The allocator's statistics are process-wide, so another thread's tensor
    (a prefetch left by an earlier test in the same worker) can only add to
    a reading: with `repeats > 1` the smallest of the readings is returned.
    """
    from tfmemopt.memory import MemoryStatsUnavailable
    from tfmemopt.memory import measure_peak

    peaks = []
    for _ in range(repeats):
        try:
            peak, _ = measure_peak(fn, device)
        except MemoryStatsUnavailable as e:
            pytest.skip(str(e))
        peaks.append(peak)
    return min(peaks)


@pytest.fixture
def step_peak():
    return measure_step_peak


DURATIONS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "durations.json"
)


def _recorded_durations() -> dict:
    """Seconds each test file took in a recorded run (tests/durations.json,
    written by `python tests/record_durations.py LOG` from the output of
    `pytest --durations=0`); {} without it."""
    try:
        with open(DURATIONS) as f:
            return json.load(f).get("files", {})
    except (OSError, ValueError):
        return {}


def pytest_collection_modifyitems(config, items):
    """Test files run longest first, each file's tests together and in
    their order (module-scoped fixtures are set up once).

    `make test` hands whole test files to two workers (`--dist loadfile`),
    the next file to whichever is free. Longest first is the classic rule
    for that (each worker ends within about one short file of the others):
    the order comes from tests/durations.json, the files' recorded seconds;
    a file not recorded yet goes with the others marked `slow` (before the
    rest) if it has such a test. The order was "files with a slow test
    first, alphabetically" before: on a 2-core AMD machine the suite took
    17.6 minutes, one worker running the 4-minute FSDP file alone at the
    end. Since pytest-xdist 3.5 the scheduler reorders the files by their
    number of tests; `--no-loadscope-reorder` (pytest-xdist >= 3.8, in the
    Makefile) keeps this order.
    """
    recorded = _recorded_durations()
    slow_modules = {
        item.module.__name__
        for item in items
        if item.get_closest_marker("slow") is not None
    }

    def key(item):
        path = os.path.relpath(str(item.path), ROOT).replace(os.sep, "/")
        seconds = recorded.get(path)
        if seconds is None:
            # Unrecorded: a slow file as if it took a minute, else a second.
            seconds = 60.0 if item.module.__name__ in slow_modules else 1.0
        return -seconds

    items.sort(key=key)


def pytest_collection_finish(session):
    """Moves what is imported by now out of the garbage collector's sight.

    A full `gc.collect()` walks every tracked object: with TensorFlow, Keras
    and the test modules imported that is ~380,000 objects and 0.3-0.4 s.
    What is imported by now lives as long as the process (`gc.freeze()`).
    """
    gc.collect()
    gc.freeze()


_last_module = [None]
# Modules that set up a fixture wider than one test (module, class, session).
_wide_fixture_modules = set()


def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope != "function":
        _wide_fixture_modules.add(getattr(request, "module", None))


@pytest.fixture(autouse=True)
def _clean_keras_state(request):
    """Each test starts from float32, a fresh Keras session, fixed seeds and
    no garbage left by earlier tests (in-process memory tests read the whole
    process's allocator).

    The collection is kept cheap: what is still alive after it is frozen, so
    the next test's collection walks only what that test made. This matters
    because TensorFlow never frees a traced step: each `tf.custom_gradient`
    traced in a graph (Keras's `fit` traces some) registers a gradient
    function under a unique name in a process-wide registry, which keeps its
    whole FuncGraph alive (~6,000 objects per `fit`, measured). Without the
    freeze, a full collection walked all of them before every test: 0.9 s per
    test on average, 775 s of the suite's 2,342 test-seconds.

    After a module that set up a fixture wider than one test (module-scoped:
    8 modules), everything is unfrozen and collected, so such fixtures that
    died in cycles are freed too. Not after the others: the unfrozen
    collection walks every FuncGraph kept so far (2.5 million objects after
    214 tests, 0.9 s per module, 17.3 s over 19 modules in one process),
    and only a wider fixture can leave garbage that was alive at a freeze.
    """
    import keras

    keras.config.set_dtype_policy("float32")
    if request.module is not _last_module[0]:
        if _last_module[0] in _wide_fixture_modules:
            gc.unfreeze()
        _last_module[0] = request.module
    keras.backend.clear_session()  # with a full gc.collect()
    gc.freeze()
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


def pytest_sessionfinish(session, exitstatus):
    _forkserver.stop()
