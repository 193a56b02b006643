"""A fork server for `conftest.run_in_subprocess` (opt-in).

Each fresh interpreter that a test starts spends ~5 s of CPU importing
TensorFlow, Keras and tfmemopt before its first line of work. With
`TFMEMOPT_TEST_FORK=1`, each pytest process starts one server that imports
them once (TensorFlow's runtime stays uninitialised: no device is made, no
op runs) and forks a child per request. The child is what a fresh
interpreter would be after those imports: it splits the CPU into logical
devices itself, runs the code as `__main__` with its own stdout/stderr, and
exits. Requests whose environment differs in a variable that TensorFlow
reads as it is imported (`TF_*`, `XLA_*`, `CUDA_*`, `OMP_*`, `MKL_*`) run
in a fresh interpreter as before.

The import leaves two native threads besides the main one (idle while the
server waits for a request); a forked child has only its main thread.
Measured on 7 test files with 10 forkable calls (test_sharded_optimizer,
_checkpoints, test_bf16_mirrored, test_accumulating_optimizer,
test_memory_monitor, test_saved_fixtures, test_mixed_precision; 99
passed either way): 188.9 s of CPU without, 145.3 s with (user+sys of the
pytest tree, one process, the server's own import included).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile

ENABLED = os.environ.get("TFMEMOPT_TEST_FORK") == "1"

# Read by TensorFlow (or its libraries) at import: a request that changes
# one of them gets a fresh interpreter.
_IMPORT_TIME = ("TF_", "XLA_", "CUDA_", "OMP_", "MKL_", "KMP_", "KERAS_")

_SERVER = r"""
import json, os, sys, traceback
root = sys.argv[1]
sys.path.insert(0, root)
os.chdir(root)
import gc, numpy, tensorflow, keras, tfmemopt  # noqa: F401
gc.freeze()  # the children inherit it: their collections skip the imports
requests, replies = sys.stdin, sys.stdout
replies.write(json.dumps({"ready": os.getpid()}) + "\n")
replies.flush()
for line in requests:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.close(out)
            os.close(err)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            sys.stdin = open(0, closefd=False)
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            os.environ.clear()
            os.environ.update(req["env"])
            paths = req["env"].get("PYTHONPATH", "").split(os.pathsep)
            sys.path[:0] = [p for p in paths if p]
            sys.argv = ["-c"]
            os.chdir(req["cwd"])
            main = type(sys)("__main__")
            sys.modules["__main__"] = main
            exec(compile(req["source"], "<string>", "exec"), main.__dict__)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(
                e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    replies.write(json.dumps({"pid": pid}) + "\n")
    replies.flush()
    _, status, usage = os.wait4(pid, 0)
    replies.write(json.dumps({
        "rc": os.waitstatus_to_exitcode(status),
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }) + "\n")
    replies.flush()
"""

_server = [None]


def usable(child_env: dict) -> bool:
    """Whether a request with this environment may be forked."""
    if not ENABLED:
        return False
    for key in set(child_env) | set(os.environ):
        if key.startswith(_IMPORT_TIME):
            if child_env.get(key) != os.environ.get(key):
                return False
    return True


def _start(root):
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, root],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        bufsize=1,
    )
    ready = json.loads(proc.stdout.readline() or "{}")
    if "ready" not in ready:
        proc.kill()
        raise RuntimeError("the test fork server did not start")
    return proc


def _read(proc, deadline_s):
    ready, _, _ = select.select([proc.stdout], [], [], deadline_s)
    if not ready:
        return None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError("the test fork server exited")
    return json.loads(line)


def run(source, child_env, cwd, root, timeout):
    """Runs `source` in a forked child; returns a CompletedProcess-like
    object (returncode, stdout, stderr). Raises subprocess.TimeoutExpired
    after `timeout` seconds (the child is killed)."""
    if _server[0] is None or _server[0].poll() is not None:
        _server[0] = _start(root)
    proc = _server[0]
    with tempfile.TemporaryDirectory() as tmp:
        paths = {k: os.path.join(tmp, k) for k in ("stdout", "stderr")}
        req = dict(source=source, env=child_env, cwd=cwd, **paths)
        proc.stdin.write(json.dumps(req) + "\n")
        proc.stdin.flush()
        pid = _read(proc, 60)["pid"]
        reply = _read(proc, timeout)
        if reply is None:
            os.kill(pid, signal.SIGKILL)
            _read(proc, 60)
            raise subprocess.TimeoutExpired(["fork", str(pid)], timeout)
        out = {k: open(p).read() for k, p in paths.items()}
    return subprocess.CompletedProcess(
        ["fork"], reply["rc"], out["stdout"], out["stderr"]
    )


def stop():
    proc = _server[0]
    if proc is not None and proc.poll() is None:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _server[0] = None
