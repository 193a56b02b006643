"""tests/_forkserver.py (TFMEMOPT_TEST_FORK=1): a forked child is what a
fresh interpreter would be after the imports; failures and timeouts are
reported as `subprocess.run` reports them."""

from __future__ import annotations

import os
import subprocess

import _forkserver
import pytest
from conftest import _PRELUDE
from conftest import ROOT


def test_forked_children_split_the_cpu_and_report_failures(monkeypatch):
    monkeypatch.setattr(_forkserver, "ENABLED", True)
    monkeypatch.setattr(_forkserver, "_server", [None])  # a server of its own
    env = {"PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2", "X_TEST": "7"}
    try:
        for n in (2, 4):  # each child splits its own, still uninitialised
            proc = _forkserver.run(
                _PRELUDE.format(n_cpus=n)
                + "import sys, tfmemopt\n"
                + "emit([len(tf.config.list_logical_devices('CPU')),"
                + " os.environ['X_TEST'], sys.argv, os.getcwd()])\n",
                env,
                ROOT,
                ROOT,
                60,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            line = proc.stdout.strip().splitlines()[-1]
            assert line == f'@@RESULT@@[{n}, "7", ["-c"], "{ROOT}"]', line
        proc = _forkserver.run("raise ValueError('boom')", env, ROOT, ROOT, 60)
        assert proc.returncode == 1 and "ValueError: boom" in proc.stderr
        proc = _forkserver.run("import sys; sys.exit(3)", env, ROOT, ROOT, 60)
        assert proc.returncode == 3
        with pytest.raises(subprocess.TimeoutExpired):
            _forkserver.run("import time; time.sleep(60)", env, ROOT, ROOT, 1)
        # The server survives its child's kill.
        proc = _forkserver.run("print('after')", env, ROOT, ROOT, 60)
        assert proc.stdout == "after\n", proc
    finally:
        _forkserver.stop()
    # A variable TensorFlow reads at import gets a fresh interpreter.
    here = dict(os.environ, **env)
    assert _forkserver.usable(here)
    assert not _forkserver.usable(dict(here, TF_ENABLE_ONEDNN_OPTS="0"))
