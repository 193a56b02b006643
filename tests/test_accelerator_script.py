"""benchmarks/accelerator.py runs on CPU in smoke mode, so it cannot rot.

One subprocess runs every part at small sizes on two logical CPUs, with a
failure injected into one part (`--fail precision`) and the
find_batch_size part run against a layer that raises
ResourceExhaustedError above 200 samples (`--simulate-oom`). The lookups of
the CPU counterparts in BENCHMARKS.md and the markdown table are checked
in this process (no TensorFlow needed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import accelerator  # noqa: E402

PARTS = [
    "memory",
    "estimator",
    "find_batch_size",
    "precision",
    "accumulation_checkpointing",
    "optimizers",
    "sharding",
]


def _figure(part, prefix):
    found = [f for f in part["figures"] if f["figure"].startswith(prefix)]
    assert found, (prefix, [f["figure"] for f in part["figures"]])
    return found[0]


@pytest.mark.slow
def test_smoke_run_records_every_part_and_survives_a_failing_one(tmp_path):
    env = dict(
        os.environ,
        TF_ENABLE_ONEDNN_OPTS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        CUDA_VISIBLE_DEVICES="",
    )
    env.pop("OUT", None)
    env.pop("TFMEMOPT_ACCEL_FAIL", None)
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "accelerator.py"),
            "--mode",
            "smoke",
            "--out",
            str(tmp_path),
            "--simulate-oom",
            "--fail",
            "precision",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "accelerator.json").read_text())
    assert list(report["parts"]) == PARTS == accelerator.ORDER
    assert report["mode"] == "smoke" and report["device_run"] is False
    assert "not device figures" in report["note"]
    assert report["environment"]["kind"] == "CPU"

    for name, part in report["parts"].items():
        if part["status"] == "skipped":
            assert part["reason"], name
            continue
        if name == "precision":
            continue
        # cut (a budget spent on a loaded machine) still keeps figures
        assert part["status"] in ("ok", "cut"), (name, part.get("error"))
        assert part["figures"], name

    # The injected failure is recorded with what was measured before it,
    # and the parts after it ran.
    precision = report["parts"]["precision"]
    assert precision["status"] == "error"
    assert "failure injected into part 'precision'" in precision["error"]
    assert "Traceback" in precision["traceback"]
    assert [f["figure"] for f in precision["figures"]] == ["step peak, float32"]
    assert report["parts"]["sharding"]["figures"]

    # find_batch_size against the simulated out-of-memory layer: the finder
    # stops at 192 (multiples of 64), the scan's first OOM is 256, and
    # tfmemopt.Model.fit attached its report to the error.
    fbs = report["parts"]["find_batch_size"]
    assert _figure(fbs, "find_batch_size: largest")["value"] == 192
    assert _figure(fbs, "first batch raising")["value"] == 256
    assert _figure(fbs, "OOM report")["value"] == "yes"
    assert fbs["data"]["oom_report"][0].startswith("Out of memory on CPU:0")

    # MemoryMonitor logs what the allocator says.
    mem = report["parts"]["memory"]
    logged = _figure(mem, "MemoryMonitor peak / get_memory_info")["value"]
    assert abs(logged - 1.0) <= 0.05, logged

    # Figures that have a CPU counterpart found it in BENCHMARKS.md.
    opt = report["parts"]["optimizers"]
    state_ratio = _figure(opt, "AdamW8bit / AdamW state")
    assert state_ratio["cpu"] == accelerator.counterpart(
        ("optimizer_states", ("AdamW8bit",), "state ratio")
    )
    assert state_ratio["cpu"] is not None

    md = (tmp_path / "accelerator.md").read_text()
    assert md.startswith("**SMOKE RUN on CPU")
    assert "| precision | error |" in md


BENCH = """
<!-- BEGIN demo -->
- **design set** (x): 6 cases, median |error| 3.1%, worst 9%.

| variant | peak | / base |
|---|---|---|
| plain | 10 | 1.00 |
| ours | 5 | 0.50 |

| variant | time | / base |
|---|---|---|
| ours | 2 | 1.20 |

Machine: x.
<!-- END demo -->
"""


def test_counterpart_reads_the_cell_and_the_pattern():
    cp = accelerator.counterpart
    assert cp(("demo", ("ours",), "/ base"), BENCH) == "0.50"
    # the first table that has both the row and the column
    assert cp(("demo", ("ours",), "time"), BENCH) == "2"
    assert cp(("demo", ("ours",), 2), BENCH) == "0.50"
    assert cp(("demo", r"median \|error\| ([\d.]+%)"), BENCH) == "3.1%"
    assert cp(("demo", ("missing",), "/ base"), BENCH) is None
    assert cp(("nosection", ("ours",), "peak"), BENCH) is None
    assert cp(None, BENCH) is None


def test_markdown_table_of_a_device_report():
    report = {
        "mode": "full",
        "device_run": True,
        "note": "",
        "started": "2026-12-04 10:00:00 UTC",
        "elapsed_s": 412.0,
        "environment": {
            "kind": "GPU",
            "gpus": ["/device:GPU:0"],
            "device_names": ["NVIDIA H200 (compute capability 9.0)"],
            "tensorflow": "2.21.0",
            "keras": "3.15.1",
            "tfmemopt": "0.1.0.dev0",
            "python": "3.12.3",
            "cuda_version": "12.5.1",
            "cudnn_version": "9",
        },
        "parts": {
            "optimizers": {
                "status": "ok",
                "seconds": 30.0,
                "budget_s": 55,
                "figures": [
                    {
                        "figure": "AdamW8bit / AdamW state (allocator)",
                        "value": 0.26,
                        "unit": "x",
                        "cpu": "0.254x",
                        "cpu_source": ["optimizer_states"],
                        "note": "a|b",
                    }
                ],
            },
            "sharding": {
                "status": "skipped",
                "reason": "needs two or more GPUs; this machine has 1",
                "figures": [],
            },
        },
    }
    md = accelerator.markdown(report)
    assert "NVIDIA H200 (compute capability 9.0)" in md
    assert "CUDA 12.5.1" in md and "not a device" not in md
    assert "| part | figure | on this device | CPU (BENCHMARKS.md) |" in md
    assert (
        "| optimizers | AdamW8bit / AdamW state (allocator) | 0.26x | "
        "0.254x (optimizer_states) | a/b |"
    ) in md
    assert "| sharding | skipped | - (-) | needs two or more GPUs" in md
