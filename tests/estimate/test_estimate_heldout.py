"""estimate_memory on held-out models (issue #23): models of families no
rule of the estimator was designed on, measured the way
`benchmarks/estimator_accuracy.py` measures them (its own child process:
a fresh process per case, the median of 3 steps' peaks of the CPU
allocator's statistics, estimated with `min_counted_bytes`)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
BENCHMARK = os.path.join(ROOT, "benchmarks", "estimator_accuracy.py")


def _case(name, variant, batch):
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, BENCHMARK, "--child", name, "--case", variant, batch],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


def _row(proc):
    out, err = proc.communicate(timeout=300)
    lines = [line for line in out.splitlines() if line.startswith("@@")]
    assert proc.returncode == 0 and lines, err[-4000:]
    (row,) = json.loads(lines[-1][2:])
    assert not row["error"], row["error"]
    return row


@pytest.mark.slow
def test_heldout_cases_within_a_generous_bound():
    """Two small held-out cases, one per family: a 1-D conv net (Adam;
    Conv1D and MaxPooling1D run on `ExpandDims` views of their inputs,
    which were counted twice: +56% before) and a wide-and-deep MLP with
    three inputs (SGD with momentum 0.9). Each within 25% of its measured
    peak (the held-out table's worst is far inside that: the bound is
    for regressions, not for the table's accuracy).

    The wide-and-deep model's peak moves between processes: the same
    model at batch 512 peaked at 21.8 to 26.5 MiB in 7 fresh processes
    (1.22x; at batch 4096, 1.49x; benchmarks/estimator_spread.json), and
    one run in the suite read -25.7% where the table reads -12.7%. It is
    measured in three processes and the estimate compared with their
    median, as the spread benchmark does; the bound is unchanged."""
    # Every child at once: each is its own process, so none sees the
    # others' allocations.
    procs = [_case("conv1d", "base", "32")] + [
        _case("wide_deep", "sgd_momentum", "1024") for _ in range(3)
    ]
    rows = [_row(p) for p in procs]
    conv, deep = rows[0], rows[1:]
    measured = sorted(r["measured"] for r in deep)[1]
    for row, peak in ((conv, conv["measured"]), (deep[0], measured)):
        assert peak > 0, row
        error = (row["estimate"] - peak) / peak
        assert abs(error) <= 0.25, (row["model"], row["batch"], error)
