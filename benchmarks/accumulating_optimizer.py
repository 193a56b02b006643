"""Throughput of `tfmemopt.AccumulatingOptimizer` at a fixed micro-batch.

Side by side in one process, interleaved rounds, one epoch per timing:
- plain `fit` at the micro-batch with Adam (no accumulation),
- Keras's own `Adam(gradient_accumulation_steps=N)` at the micro-batch,
- `AccumulatingOptimizer(Adam(), N)` at the micro-batch.
Targets (issue 3): >= 1.0x Keras's accumulation, >= 0.95x plain fit.

Run: `.venv/bin/python benchmarks/accumulating_optimizer.py`
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

MICRO = 32
STEPS = 4
BATCHES = 96  # micro-batches per timed epoch (24 updates)
ROUNDS = int(os.environ.get("ROUNDS", "15"))
WIDTH = 512


def make_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((WIDTH,))]
        + [keras.layers.Dense(WIDTH, activation="relu") for _ in range(4)]
        + [keras.layers.Dense(10)]
    )


VARIANTS = {
    "plain fit (Adam)": lambda: keras.optimizers.Adam(1e-3),
    f"Keras gradient_accumulation_steps={STEPS}": lambda: keras.optimizers.Adam(
        1e-3, gradient_accumulation_steps=STEPS
    ),
    f"AccumulatingOptimizer(Adam, {STEPS})": lambda: (
        tfmemopt.AccumulatingOptimizer(keras.optimizers.Adam(1e-3), STEPS)
    ),
}


def _window_function(opt, grads, variables):
    @tf.function
    def window():
        for _ in range(STEPS):
            opt.apply(grads, variables)

    return window


def optimizer_only(calls=50):
    """CPU ms per window of `apply` alone (STEPS calls), same gradients.

    The model's forward and backward passes dominate `fit`; this isolates
    the per-micro-step work of each optimizer.
    """
    rng = np.random.RandomState(0)
    model = make_model()
    grads = [
        tf.constant(rng.randn(*v.shape).astype("float32") * 1e-3)
        for v in model.trainable_variables
    ]
    windows = {}
    for name, make_opt in VARIANTS.items():
        variables = keras.models.clone_model(model).trainable_variables
        opt = make_opt()
        opt.build(variables)

        windows[name] = _window_function(opt, grads, variables)
        windows[name]()  # trace
    cpu = {name: [] for name in windows}
    for _ in range(ROUNDS):
        for name, window in windows.items():
            start = time.process_time()
            for _ in range(calls):
                window()
            cpu[name].append((time.process_time() - start) / calls)
    return cpu


def main():
    load = os.getloadavg()
    rng = np.random.RandomState(0)
    x = rng.rand(MICRO * BATCHES, WIDTH).astype("float32")
    y = rng.randint(0, 10, size=MICRO * BATCHES)
    models = {}
    for name, make_opt in VARIANTS.items():
        model = make_model()
        model.compile(make_opt(), "sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0)  # trace
        models[name] = model
    wall = {name: [] for name in VARIANTS}
    cpu = {name: [] for name in VARIANTS}
    for _ in range(ROUNDS):
        for name, model in models.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            model.fit(x, y, batch_size=MICRO, epochs=1, verbose=0)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    plain, keras_acc, ours = list(VARIANTS)
    opt_cpu = optimizer_only()

    def ratios(times, name, base):
        return sorted(b / t for t, b in zip(times[name], times[base]))

    def ratio(times, name, base):
        # Median over rounds of the per-round ratio of throughputs.
        return median(ratios(times, name, base))

    def spread(times, name, base):
        r = ratios(times, name, base)
        return f"{r[len(r) // 4]:.2f}-{r[(3 * len(r)) // 4]:.2f}"

    rows = [
        [
            name,
            f"{len(x) / median(wall[name]):.0f}",
            f"{len(x) / median(cpu[name]):.0f}",
            f"{ratio(wall, name, plain):.2f}x",
            f"{ratio(cpu, name, plain):.2f}x",
        ]
        for name in VARIANTS
    ]
    body = (
        "### AccumulatingOptimizer throughput (issue 3)\n\n"
        f"MLP {WIDTH}x4 + Dense(10) "
        f"({models[plain].count_params():,} parameters), Adam, micro-batch "
        f"{MICRO}, {STEPS} micro-steps per update, {BATCHES} micro-batches "
        f"per timed epoch, {ROUNDS} interleaved rounds after a tracing "
        "epoch; graph mode, one CPU device. Ratios are medians of the "
        "per-round ratios; CPU time (process time) is less disturbed by "
        "other processes than wall time.\n\n"
        + table(
            [
                "variant",
                "samples/s (wall, median)",
                "samples per CPU-second",
                "vs plain (wall)",
                "vs plain (CPU)",
            ],
            rows,
        )
        + "\n\n"
        "AccumulatingOptimizer / Keras accumulation: "
        f"**{ratio(wall, ours, keras_acc):.2f}x** wall, "
        f"**{ratio(cpu, ours, keras_acc):.2f}x** CPU (target >= 1.0). "
        "AccumulatingOptimizer / plain fit: "
        f"**{ratio(wall, ours, plain):.2f}x** wall, "
        f"**{ratio(cpu, ours, plain):.2f}x** CPU (target >= 0.95).\n\n"
        f"The optimizer alone ({STEPS} `apply` calls on fixed gradients, "
        "CPU ms per window, median): "
        + ", ".join(
            f"{name} {1e3 * median(opt_cpu[name]):.2f}" for name in VARIANTS
        )
        + "; AccumulatingOptimizer / Keras accumulation: "
        f"**{ratio(opt_cpu, ours, keras_acc):.2f}x** "
        f"(interquartile {spread(opt_cpu, ours, keras_acc)}).\n\n"
        "Interquartile range of the per-round ratios, AccumulatingOptimizer "
        f"/ Keras accumulation: {spread(wall, ours, keras_acc)} wall, "
        f"{spread(cpu, ours, keras_acc)} CPU; / plain fit: "
        f"{spread(wall, ours, plain)} wall, {spread(cpu, ours, plain)} CPU."
        "\n\n"
        "Timings were taken on a shared 2-core machine under load from "
        "other engineers' runs (1-minute load average "
        f"{load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end): "
        "read the CPU-time columns rather than wall time."
    )
    print(body)
    write_section("accumulating_optimizer", body)


if __name__ == "__main__":
    main()
