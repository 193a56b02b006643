"""Memory of accumulation and checkpointing with and without XLA (#46).

The issue's activation-bound transformer: 4 post-LayerNorm blocks
(`MultiHeadAttention`, 2 heads), T=256, D=256, batch 16, Adam. One step's
peak above what was allocated before it (the weights and Adam state are
in that baseline), median of 3 steps after a first one, each cell in a
fresh process, in three regimes: TensorFlow's executor (`jit_compile=
False`), XLA (`jit_compile=True`) as a fresh process has TensorFlow's CPU
allocator, and XLA with the allocator grown first (one 4 GiB region, never
touched, `_report.grow_allocator`): XLA allocates a step's temporaries as
one buffer, which a fresh allocator places in a power-of-two region, so
the grown column counts each buffer at its own size, as a GPU's allocator
(which takes its memory up front) does. The goals are read in the grown
column: accumulation 4 <= 0.40x, 8 <= 0.30x, checkpointing "auto" <=
0.45x, both <= 0.25x of plain Keras in the same regime.

    python benchmarks/xla_memory.py
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import fresh_process  # noqa: E402
from _report import table  # noqa: E402
from _report import write_section  # noqa: E402
from xla_first_fit import BUILD  # noqa: E402

CELLS = {
    "plain Keras": {},
    "accumulation_steps=4": {"accumulation_steps": 4},
    "accumulation_steps=8": {"accumulation_steps": 8},
    'checkpointing="auto"': {"checkpointing": "auto"},
    'accumulation_steps=4 + "auto"': {
        "accumulation_steps": 4,
        "checkpointing": "auto",
    },
}
REGIMES = {
    "executor": (False, False),
    "XLA": (True, False),
    "XLA, allocator grown": (True, True),
}

_CELL = (
    """
import json, statistics, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np, keras, tensorflow as tf, tfmemopt
from tfmemopt.memory import measure_peak
options, jit, grown = json.loads(sys.argv[1])
if grown:
    t = tf.raw_ops.Empty(shape=[1 << 30], dtype=tf.float32, init=False)
    del t
"""
    + BUILD
    + """
model.train_on_batch(x, y)
peaks = [measure_peak(lambda: model.train_on_batch(x, y))[0]
         for _ in range(3)]
print("@@" + json.dumps(statistics.median(peaks)))
"""
)


def cell(options, jit, grown):
    value, stderr = fresh_process(_CELL, json.dumps([options, jit, grown]))
    if value is None:
        print(stderr[-2000:], file=sys.stderr)
    return value


def main():
    peaks = {}
    for regime, (jit, grown) in REGIMES.items():
        for name, options in CELLS.items():
            peaks[name, regime] = cell(options, jit, grown)
            print(name, regime, peaks[name, regime], flush=True)
    rows = []
    for name in CELLS:
        row = [name]
        for regime in REGIMES:
            peak, plain = peaks[name, regime], peaks["plain Keras", regime]
            if peak is None or not plain:
                row.append("failed")
            else:
                row.append(f"{peak / 2**20:.1f} ({peak / plain:.2f}x)")
        rows.append(row)
    body = (
        "## xla_memory\n\n"
        "One step's peak (MiB above what was allocated before it; the "
        "ratio to plain Keras in the same regime) of a 4-block post-LN "
        "transformer (`MultiHeadAttention`, 2 heads, T=256, D=256, batch "
        "16, Adam), median of 3 steps, each cell in a fresh process: "
        "`python benchmarks/xla_memory.py`. `XLA, allocator grown`: "
        "TensorFlow's CPU allocator grown first, so that XLA's one "
        "temporary buffer is counted at its own size, as on a GPU "
        "(docs/xla.md).\n\n" + table(["", *REGIMES], rows)
    )
    write_section("xla_memory", body)


if __name__ == "__main__":
    main()
