"""Activation checkpointing: peak memory and step time inside graph-mode fit.

Side by side in one process, default TensorFlow settings: no checkpointing,
tfmemopt per block and "auto", a plain `tf.recompute_grad` wrapper, and
`keras.RematScope` modes. Peaks are CPU:0 allocator peaks above the
baseline (oneDNN allocator, TF_ENABLE_ONEDNN_OPTS=1), medians of REPEAT
steps; times are medians of REPEAT steps.
Run: python benchmarks/checkpointing.py
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

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


def measure(build, x, y, batch):
    """(peak MiB, step seconds) medians, or the error's first line."""
    try:
        model = build()
        model.compile(keras.optimizers.SGD(1e-4), "mse")
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        peaks, times = [], []
        for _ in range(REPEAT):
            start = time.perf_counter()
            peak, _ = measure_peak(
                lambda: model.fit(x, y, batch_size=batch, verbose=0)
            )
            times.append(time.perf_counter() - start)
            peaks.append(peak / MIB)
        return median(peaks), median(times)
    except Exception as e:  # noqa: BLE001 - recorded in the table
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"


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
    results = {}
    for name, fn in cases:
        results[name] = measure(fn, x, y, batch)
        print(name, results[name], flush=True)
    base_peak, base_time = results[cases[0][0]]
    rows = []
    for name, _ in cases:
        peak, t = results[name]
        if peak is None:
            rows.append([name, "crash", "-", "-", "-", t])
            continue
        rows.append(
            [
                name,
                f"{peak:.0f}",
                f"{peak / base_peak:.2f}x",
                f"{t:.2f}",
                f"{t / base_time:.2f}x",
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
        "step s",
        "time ratio",
        "note",
    ]
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
    body = (
        "## Activation checkpointing (`benchmarks/checkpointing.py`)\n\n"
        "Graph-mode `model.fit`, default TensorFlow settings (grappler on, "
        "nothing changed by tfmemopt), SGD. Peak: CPU:0 allocator peak "
        f"above the baseline, median of {REPEAT} steps; step time median of "
        f"{REPEAT} steps. Timings taken on a shared machine under load "
        "(about 7 other engineers running TensorFlow): read the ratios, "
        "not the seconds.\n\n"
        "6-block pre-LayerNorm transformer (batch 16, sequence 256, width "
        "256, 4 heads, FFN 1024, GELU):\n\n"
        + table(headers, t_rows)
        + "\n\n16 x Dense(512, relu), batch 8192:\n\n"
        + table(headers, d_rows)
    )
    write_section("checkpointing", body)


if __name__ == "__main__":
    main()
