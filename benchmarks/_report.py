"""Writes one benchmark's table into its own section of BENCHMARKS.md.

Each script owns the text between `<!-- BEGIN name -->` and `<!-- END name -->`
so that scripts run in any order and never overwrite each other.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(ROOT, "BENCHMARKS.md")
HEADER = (
    "# Benchmarks\n\n"
    "Written by the scripts in `benchmarks/` (run by hand: `make bench`, or\n"
    "one script at a time). Each measures ours against the alternatives\n"
    "side by side in one process; times are medians of several runs and\n"
    "quoted as\n"
    "ratios, since these machines are shared and noisy.\n"
)


def fresh_process(code: str, arg: str, timeout: float = 1800):
    """Runs `python -c code arg` in a fresh interpreter; returns `(value,
    stderr)`, `value` the JSON the child printed last on a line starting
    with `@@` (None when it printed none: it failed)."""
    out = subprocess.run(
        [sys.executable, "-c", code, arg],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("@@")]
    return (json.loads(lines[-1][2:]) if lines else None), out.stderr


def machine() -> str:
    import keras
    import tensorflow as tf

    return (
        f"{platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, TF {tf.__version__}, Keras "
        f"{keras.__version__}, TF_ENABLE_ONEDNN_OPTS="
        f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')}, "
        f"{time.strftime('%Y-%m-%d')}"
    )


# Both regimes (#46): `JIT_COMPILE=1` compiles every variant's step with XLA
# (`jit_compile=True`, Keras's default on one GPU and what a TPU runs) and
# writes the section as `<name>_xla`.
JIT = os.environ.get("JIT_COMPILE") == "1"


def regime() -> str:
    """`"XLA"` or `"graph"`, for tables and section names."""
    return "XLA" if JIT else "graph"


def section(name: str) -> str:
    """The section a script writes in this regime."""
    return f"{name}_xla" if JIT else name


def grow_allocator(gib: int = 4) -> None:
    """Grows TensorFlow's CPU allocator by one `gib` region, never touched,
    before anything is measured: XLA allocates a step's temporaries as a
    few large buffers, which a fresh process would place in power-of-two
    regions (docs/xla.md); grown, each is counted at its own size, as on a
    GPU, whose allocator takes its memory up front."""
    import tensorflow as tf

    t = tf.raw_ops.Empty(shape=[gib << 28], dtype=tf.float32, init=False)
    del t


def median(values):
    return statistics.median(values)


def table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |"]
    out.append("|" + "|".join("---" for _ in headers) + "|")
    for row in rows:
        out.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(out)


def write_section(name: str, body: str) -> None:
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    text = open(PATH).read() if os.path.exists(PATH) else HEADER
    block = f"{begin}\n{body.rstrip()}\n\nMachine: {machine()}.\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    with open(PATH, "w") as f:
        f.write(text)
    print(f"wrote section {name!r} of {PATH}")
