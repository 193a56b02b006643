"""Activation checkpointing: peak memory and step time inside graph-mode fit.

Side by side in one process, default TensorFlow settings: no checkpointing,
tfmemopt per block and "auto", a plain `tf.recompute_grad` wrapper, and
`keras.RematScope` modes. Peaks are CPU:0 allocator peaks above the
baseline (oneDNN allocator, TF_ENABLE_ONEDNN_OPTS=1), medians of REPEAT
steps; wall and CPU times in ROUNDS interleaved rounds (env variables).
Run: python benchmarks/checkpointing.py; `JIT_COMPILE=1` compiles every
variant with XLA (section `checkpointing_xla`, TensorFlow's CPU allocator
grown first, `_report.grow_allocator`).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _report  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _report import median  # noqa: E402
from _report import table  # noqa: E402
from _report import write_section  # noqa: E402

import tfmemopt  # noqa: E402
from tfmemopt.memory import MIB  # noqa: E402
from tfmemopt.memory import measure_peak  # noqa: E402

REPEAT = int(os.environ.get("REPEAT", "3"))
ROUNDS = int(os.environ.get("ROUNDS", "8"))
STEPS = int(os.environ.get("STEPS", "2"))


class PreLNBlock(keras.layers.Layer):
    def __init__(self, width=256, heads=4, ffn=1024, **kwargs):
        super().__init__(**kwargs)
        self.ln1 = keras.layers.LayerNormalization()
        self.ln2 = keras.layers.LayerNormalization()
        self.mha = keras.layers.MultiHeadAttention(heads, width // heads)
        self.ff1 = keras.layers.Dense(ffn, activation="gelu")
        self.ff2 = keras.layers.Dense(width)

    def call(self, x, training=None):
        h = self.ln1(x)
        x = x + self.mha(h, h, training=training)
        return x + self.ff2(self.ff1(self.ln2(x)))


class RecomputeGrad(keras.layers.Layer):
    """What a user writes first: tf.recompute_grad around a block."""

    def __init__(self, inner, **kwargs):
        super().__init__(**kwargs)
        self.inner = inner

    def call(self, x, training=None):
        return tf.recompute_grad(lambda t: self.inner(t, training=training))(x)


def transformer(wrap=None):
    keras.utils.set_random_seed(0)
    inp = keras.Input((256, 256))
    x = inp
    for i in range(6):
        block = PreLNBlock(name=f"block{i}")
        x = (wrap(block) if wrap else block)(x)
    return keras.Model(inp, keras.layers.Dense(1)(x))


def dense_stack():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((512,))]
        + [keras.layers.Dense(512, activation="relu") for _ in range(16)]
        + [keras.layers.Dense(1)]
    )


def prepare(build, x, y, batch):
    """(model, train function, iterator) after one traced step, or the
    error's first line."""
    try:
        model = build()
        model.compile(
            keras.optimizers.SGD(1e-4), "mse", jit_compile=_report.JIT
        )
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
        iterator = iter(data.repeat())
        step = model.make_train_function()
        step(iterator)
        return model, step, iterator
    except Exception as e:  # noqa: BLE001 - recorded in the table
        return f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"


def step_peak(model, x, y, batch):
    """Peak MiB of one `fit` step above what was held before it."""
    peak, _ = measure_peak(lambda: model.fit(x, y, batch_size=batch, verbose=0))
    return peak / MIB


def timed(step, iterator):
    """(wall s, process CPU s) per step, over STEPS steps."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(STEPS):
        out = step(iterator)
    float(out["loss"])
    return (
        (time.perf_counter() - wall) / STEPS,
        (time.process_time() - cpu) / STEPS,
    )


def remat(mode, build):
    def make():
        with keras.RematScope(mode=mode):
            return build()

    return make


def enabled(build, policy):
    def make():
        model = build()
        tfmemopt.enable_checkpointing(model, policy)
        return model

    return make


def rows_for(cases, x, y, batch):
    """Peaks one variant at a time; times in interleaved rounds.

    Each round times every variant once, in turn, so load from other jobs
    falls on all of them alike; a ratio is the median over rounds of the
    variant's time over the baseline's time in the same round. CPU time is
    the process's (both cores), which other jobs disturb far less than
    wall time.
    """
    ready = {name: prepare(fn, x, y, batch) for name, fn in cases}
    live = [n for n, _ in cases if not isinstance(ready[n], str)]
    peaks = {n: [] for n in live}
    for _ in range(REPEAT):
        for n in live:
            peaks[n].append(step_peak(ready[n][0], x, y, batch))
    walls = {n: [] for n in live}
    cpus = {n: [] for n in live}
    for r in range(ROUNDS):
        for n in live:
            w, c = timed(*ready[n][1:])
            walls[n].append(w)
            cpus[n].append(c)
        print(f"round {r}", {n: round(walls[n][-1], 2) for n in live})
    base = live[0]
    rows = []
    for name, _ in cases:
        if name not in live:
            rows.append([name, "crash", "-", "-", "-", "-", "-", ready[name]])
            continue

        def ratio(series):
            return median(a / b for a, b in zip(series[name], series[base]))

        peak = median(peaks[name])
        rows.append(
            [
                name,
                f"{peak:.0f}",
                f"{peak / median(peaks[base]):.2f}x",
                f"{median(walls[name]):.2f}",
                f"{ratio(walls):.2f}x",
                f"{median(cpus[name]):.2f}",
                f"{ratio(cpus):.2f}x",
                "",
            ]
        )
        print(rows[-1], flush=True)
    return rows


def main():
    headers = [
        "variant",
        "peak MiB",
        "peak ratio",
        "step s (wall)",
        "wall ratio",
        "step s (CPU)",
        "CPU ratio",
        "note",
    ]
    if _report.JIT:
        _report.grow_allocator()
    load_before = os.getloadavg()
    rng = np.random.RandomState(0)
    x = rng.randn(16, 256, 256).astype("float32")
    y = np.ones((16, 256, 1), "float32")
    t_cases = [
        ("no checkpointing", transformer),
        (
            "tfmemopt per block (CheckpointBlock)",
            lambda: transformer(tfmemopt.CheckpointBlock),
        ),
        (
            "tfmemopt enable_checkpointing 'blocks'",
            enabled(transformer, "blocks"),
        ),
        ("tfmemopt enable_checkpointing 'auto'", enabled(transformer, "auto")),
        (
            "plain tf.recompute_grad per block",
            lambda: transformer(RecomputeGrad),
        ),
        ("keras.RematScope('full')", remat("full", transformer)),
        ("keras.RematScope('activations')", remat("activations", transformer)),
    ]
    t_rows = rows_for(t_cases, x, y, 16)
    xd = rng.randn(8192, 512).astype("float32")
    yd = np.ones((8192, 1), "float32")
    d_cases = [
        ("no checkpointing", dense_stack),
        ("tfmemopt enable_checkpointing 'auto'", enabled(dense_stack, "auto")),
        ("keras.RematScope('full')", remat("full", dense_stack)),
    ]
    d_rows = rows_for(d_cases, xd, yd, 8192)
    load_after = os.getloadavg()
    load = (
        f"1-minute load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after (2 cores; 2.0 would be this job alone)"
    )
    body = (
        "## Activation checkpointing (`benchmarks/checkpointing.py`, "
        f"{_report.regime()})\n\n"
        "The training step `fit` runs ("
        + ("compiled with XLA, `jit_compile=True`" if _report.JIT else "graph")
        + "), default "
        "TensorFlow settings (grappler on, nothing changed by tfmemopt), "
        "SGD. Peak: CPU:0 allocator peak of one `fit` step above what was "
        f"held before, median of {REPEAT}. Step time: {ROUNDS} interleaved "
        f"rounds of {STEPS} steps per variant; seconds are medians, ratios "
        "are medians over rounds of the variant's time over the baseline's "
        "in the same round. CPU is the process's CPU time (both cores); "
        "wall time also measures how much of the machine other jobs left "
        f"us. Shared machine: {load}. Read the CPU ratios first.\n\n"
        "6-block pre-LayerNorm transformer (batch 16, sequence 256, width "
        "256, 4 heads, FFN 1024, GELU):\n\n"
        + table(headers, t_rows)
        + "\n\n16 x Dense(512, relu), batch 8192:\n\n"
        + table(headers, d_rows)
    )
    print(body, flush=True)  # kept in the log if the file write races
    write_section(_report.section("checkpointing"), body)


if __name__ == "__main__":
    main()
