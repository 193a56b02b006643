"""Batch-size finder and planner: what they find, what it costs, how close.

1. find_batch_size on CPU with a memory budget, "binsearch" against "power":
   the batch found, the trials, the median search time, and the device
   memory after the search relative to before it.
2. The planner's candidates for a 2-block transformer (global batch 64):
   estimated peak (tfmemopt.estimate_memory) against measured peak, and
   the step-time model against measured step time (median of 5 steps).

Run: TF_ENABLE_ONEDNN_OPTS=1 .venv/bin/python benchmarks/batch_size.py
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfmemopt  # noqa: E402
from benchmarks._report import machine  # noqa: E402
from benchmarks._report import median  # noqa: E402
from benchmarks._report import table  # noqa: E402
from benchmarks._report import write_section  # noqa: E402
from tfmemopt import memory  # noqa: E402
from tfmemopt._plan_apply import apply_plan  # noqa: E402
from tfmemopt._trials import variable_bytes  # noqa: E402
from tfmemopt.planner import Plan  # noqa: E402
from tfmemopt.planner import step_time  # noqa: E402

MIB = 2**20


def wide_model():
    inputs = keras.Input((32,))
    h = keras.layers.Dense(4096, activation="relu")(inputs)
    for _ in range(4):
        h = keras.layers.Activation("tanh")(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse")
    return model


def transformer(seq=64, width=64, blocks=2, heads=4):
    inputs = keras.Input((seq, width))
    h = inputs
    for _ in range(blocks):
        a = keras.layers.MultiHeadAttention(heads, width // heads)(h, h)
        h = keras.layers.LayerNormalization()(h + a)
        f = keras.layers.Dense(4 * width, activation="gelu")(h)
        f = keras.layers.Dense(width)(f)
        h = keras.layers.LayerNormalization()(h + f)
    pooled = keras.layers.GlobalAveragePooling1D()(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(pooled))
    model.compile(optimizer="adam", loss="mse")
    return model


def finder(runs=3):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 32)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    model = wide_model()
    model.fit(x, y, batch_size=16, verbose=0)
    budget = 64 * MIB
    rows = []
    for mode in ("binsearch", "power"):
        times, found, worst = [], None, (0, 0)
        for _ in range(runs):
            before = memory.device_memory()["current"]
            start = time.perf_counter()
            found = tfmemopt.find_batch_size(
                model,
                (x, y),
                mode=mode,
                memory_budget=budget,
                max_batch_size=2048,
                multiple_of=32,
                steps_per_trial=1,
                verbose=0,
            )
            times.append(time.perf_counter() - start)
            after = memory.device_memory()["current"]
            if after - before >= worst[1] - worst[0]:
                worst = (before, after)
        peak = {t.batch_size: t.peak_bytes for t in found.trials}
        rows.append(
            [
                mode,
                found.batch_size,
                f"{peak[found.batch_size] / MIB:.1f}",
                f"{found.limit_bytes / MIB:.1f}",
                len(found.trials),
                f"{median(times):.1f}",
                f"{worst[0] / MIB:.2f} -> {worst[1] / MIB:.2f}",
            ]
        )
    return table(
        [
            "mode",
            "batch found",
            "its peak MiB",
            "limit MiB",
            "trials",
            "median s",
            "CPU:0 in use before -> after MiB (worst run)",
        ],
        rows,
    )


def candidates(rounds=7):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 64, 64)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    model = transformer()
    configs = [(1, None), (2, None), (4, None), (8, None), (1, "auto")]
    built = []
    for acc, ckpt in configs:
        est = tfmemopt.estimate_memory(
            model, 64, accumulation_steps=acc, checkpointing=ckpt
        ).total
        plan = Plan(64, 64 // acc, acc, 1, ckpt, "float32", est, 1.0, 1)
        applied = apply_plan(plan, model, copy=True)
        extra, _ = memory.measure_peak(lambda: applied.train_on_batch(x, y))
        peak = extra + variable_bytes(applied.variables)
        peak += variable_bytes(applied.optimizer.variables)
        built.append((acc, ckpt, est, peak, applied))
    # Interleaved rounds: each round times one step of every variant, so
    # load from other processes hits them alike; ratios per round.
    ratios = [[] for _ in built]
    for _ in range(rounds):
        times = []
        for *_, applied in built:
            start = time.perf_counter()
            applied.train_on_batch(x, y)
            times.append(time.perf_counter() - start)
        for i, t in enumerate(times):
            ratios[i].append(t / times[0])
    rows = []
    for (acc, ckpt, est, peak, _), r in zip(built, ratios):
        rows.append(
            [
                f"{64 // acc} x {acc}",
                ckpt or "-",
                f"{est / MIB:.1f}",
                f"{peak / MIB:.1f}",
                f"{peak / est:.2f}",
                f"{step_time(64 // acc, acc, ckpt, 'float32', False):.2f}",
                f"{median(r):.2f}",
            ]
        )
    return table(
        [
            "micro x steps",
            "checkpointing",
            "estimated MiB",
            "measured MiB",
            "measured/estimated",
            "modelled time",
            "measured time (median ratio to 64 x 1)",
        ],
        rows,
    )


def main():
    start = time.perf_counter()
    part1 = finder()
    part2 = candidates()
    body = (
        f"Machine: {machine()}. Timings taken under load (4 to 12 "
        "runnable processes on 2 cores, other engineers' tests): read ratios, "
        "not seconds.\n\n"
        "find_batch_size with a 64 MiB budget (margin 0.05), wide MLP "
        "(32 -> 4096 -> 4 x tanh -> 1), multiple_of=32, 1 step per trial, "
        "median of 3 searches:\n\n"
        f"{part1}\n\n"
        "Planner candidates for a 2-block transformer (seq 64, width 64), "
        "global batch 64, float32, Adam; peak measured on CPU:0 (oneDNN "
        "allocator, counts allocations >= 256 KiB) over the first step, "
        "time ratios are medians over 7 interleaved rounds of one step "
        "each:\n\n"
        f"{part2}\n\n"
        f"Total run: {time.perf_counter() - start:.0f} s."
    )
    write_section("batch_size", body)
    print(body)


if __name__ == "__main__":
    main()
