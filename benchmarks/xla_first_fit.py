"""The first `fit` under XLA (#46): compile and one step, tfmemopt's
features against plain Keras, each cell in a fresh process. The issue's
transformer: 4 post-LayerNorm blocks (`MultiHeadAttention`, 2 heads),
T=256, D=256, batch 16, Adam, `jit_compile=True`. The goal: at most 3x
plain Keras's first fit under XLA. Wall-clock seconds of the first
`train_on_batch` (medians of `REPEATS` fresh processes per cell) and the
ratio; a later step's median time too.

    python benchmarks/xla_first_fit.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import fresh_process  # noqa: E402
from _report import table  # noqa: E402
from _report import write_section  # noqa: E402

REPEATS = int(os.environ.get("TFMEMOPT_BENCH_REPEATS", "2"))
CELLS = {
    "plain Keras": {},
    "accumulation_steps=4": {"accumulation_steps": 4},
    'checkpointing="auto"': {"checkpointing": "auto"},
    "both": {"accumulation_steps": 4, "checkpointing": "auto"},
}

# The transformer, built and compiled from `options` (tfmemopt.Model's
# keyword arguments; {} for plain Keras) and `jit`: `model`, `x`, `y`.
# benchmarks/xla_memory.py builds the same one.
BUILD = """
T, D, B = 256, 256, 16
keras.utils.set_random_seed(0)
inputs = keras.Input((T, D))
h = inputs
for i in range(4):
    a = keras.layers.MultiHeadAttention(2, D // 2)(h, h)
    h = keras.layers.LayerNormalization()(h + a)
    f = keras.layers.Dense(2 * D, activation="relu")(h)
    h = keras.layers.LayerNormalization()(h + keras.layers.Dense(D)(f))
outputs = keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(h))
model = (tfmemopt.Model(inputs, outputs, **options) if options
         else keras.Model(inputs, outputs))
model.compile("adam",
              keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=jit)
rng = np.random.default_rng(0)
x = rng.normal(size=(B, T, D)).astype("float32")
y = rng.integers(0, 4, size=(B,)).astype("int32")
"""

_CELL = (
    """
import json, statistics, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np, keras, tfmemopt
options, jit = json.loads(sys.argv[1]), True
"""
    + BUILD
    + """
start = time.perf_counter()
model.train_on_batch(x, y)
first = time.perf_counter() - start
steps = []
for _ in range(5):
    start = time.perf_counter()
    model.train_on_batch(x, y)
    steps.append(time.perf_counter() - start)
print("@@" + json.dumps([first, statistics.median(steps)]))
"""
)


def cell(options):
    value, stderr = fresh_process(_CELL, json.dumps(options))
    if value is None:
        print(stderr[-2000:], file=sys.stderr)
    return value


def main():
    runs = {name: [] for name in CELLS}
    for _ in range(REPEATS):  # interleaved: drift hits every cell
        for name, options in CELLS.items():
            r = cell(options)
            if r is not None:
                runs[name].append(r)
    base = statistics.median(r[0] for r in runs["plain Keras"])
    base_step = statistics.median(r[1] for r in runs["plain Keras"])
    rows = []
    for name, rs in runs.items():
        if not rs:
            rows.append([name, "failed", "-", "-", "-"])
            continue
        first = statistics.median(r[0] for r in rs)
        step = statistics.median(r[1] for r in rs)
        rows.append(
            [
                name,
                f"{first:.1f}",
                f"{first / base:.2f}x",
                f"{1000 * step:.0f}",
                f"{step / base_step:.2f}x",
            ]
        )
        print(rows[-1], flush=True)
    body = (
        "## xla_first_fit\n\n"
        "The first `fit` under XLA (compile and one step) of a 4-block "
        "transformer (T=256, D=256, batch 16, Adam, `jit_compile=True`), "
        f"medians of {REPEATS} fresh processes per cell, interleaved: "
        "`python benchmarks/xla_first_fit.py`. Wall-clock on a shared "
        "machine: read the ratios.\n\n"
        + table(
            [
                "step",
                "first fit (s)",
                "vs plain",
                "later step (ms)",
                "vs plain",
            ],
            rows,
        )
    )
    write_section("xla_first_fit", body)


if __name__ == "__main__":
    main()
