"""Smoke tests: the examples run as a user would run them."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_quickstart_prints_table_and_matching_accuracy():
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = re.findall(
        r"^(plain Keras|tfmemopt).*?([\d.]+) MiB\s+([\d.]+)$",
        proc.stdout,
        flags=re.M,
    )
    assert [r[0] for r in rows] == ["plain Keras", "tfmemopt"], proc.stdout
    (_, plain_mib, plain_acc), (_, ours_mib, ours_acc) = rows
    # Same updates, so the same accuracy; and a smaller step peak.
    assert float(plain_acc) > 0.9
    assert abs(float(plain_acc) - float(ours_acc)) <= 0.005
    assert float(ours_mib) < 0.8 * float(plain_mib)
