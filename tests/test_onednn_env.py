"""Every script that starts its own Python asks for oneDNN before
TensorFlow loads (#51).

On AMD CPUs TensorFlow leaves oneDNN off unless `TF_ENABLE_ONEDNN_OPTS=1`
is set before it is imported, and then the CPU's memory statistics
(`tf.config.experimental.get_memory_info("CPU:0")`) raise: a benchmark
run by hand there measured nothing. The Makefile and tests/conftest.py set
it for `make test`; a benchmark or example run as `python FILE` must set
it itself.
"""

from __future__ import annotations

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPORT = re.compile(r"^\s*(import|from)\s+(tensorflow|keras|tfmemopt)\b")


def _scripts():
    paths = glob.glob(os.path.join(ROOT, "benchmarks", "[a-z]*.py"))
    paths += glob.glob(os.path.join(ROOT, "examples", "[a-z]*.py"))
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def _measures_memory(source: str) -> bool:
    return (
        any(
            word in source
            for word in (
                "get_memory_info",
                "measure_peak",
                "MemoryMonitor",
                "device_memory",
                "step_peak",
                "reset_peak",
            )
        )
        or "import tfmemopt" in source
    )


@pytest.mark.parametrize("path", _scripts())
def test_sets_onednn_before_tensorflow(path):
    with open(os.path.join(ROOT, path)) as f:
        lines = f.read().splitlines()
    source = "\n".join(lines)
    first_import = next(
        (i for i, line in enumerate(lines) if IMPORT.match(line)), None
    )
    if first_import is None or not _measures_memory(source):
        pytest.skip(f"{path} imports no TensorFlow or measures no memory")
    setting = next(
        (i for i, line in enumerate(lines) if "TF_ENABLE_ONEDNN_OPTS" in line),
        None,
    )
    assert setting is not None and setting < first_import, (
        f"{path}: set os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '1') "
        "before importing TensorFlow, Keras or tfmemopt (line "
        f"{first_import + 1}); without it an AMD CPU keeps no memory "
        "statistics"
    )
