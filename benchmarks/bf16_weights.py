"""bfloat16 weights: bytes per parameter and loss parity (#25).

A digits MLP (sklearn's `load_digits`, 64-256-256-10, batch 32, lr 3e-4,
360 steps) trained over several seeds, side by side in one process:

- Keras AdamW on float32 weights (policy `float32`, `mixed_bfloat16`) and on
  bfloat16 weights (policy `bfloat16`: it casts `beta_2` to bfloat16, 1.0,
  and never moves);
- `AdamW8bit` on float32 weights (`mixed_bfloat16`, the reference) and on
  bfloat16 weights with `bf16_update="plain"` (round to nearest),
  `"stochastic"` (the default) and `"kahan"`.

Reported: final train and held-out loss (mean and min-max over seeds),
bytes per parameter of weights + optimizer state (from the dtypes and sizes
of `model.weights` and `optimizer.variables`), gradient bytes per parameter,
and the step time as a ratio to `AdamW8bit` on float32 weights (median of
the epochs after the first; a shared machine: ratios only).

Run: `python benchmarks/bf16_weights.py [--seeds 3] [--steps 360]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from _report import median  # noqa: E402
from _report import table  # noqa: E402
from _report import write_section  # noqa: E402

LR = 3e-4

# name: (policy, optimizer factory)
CONFIGS = {
    "Keras AdamW, float32": ("float32", "keras"),
    "Keras AdamW, mixed_bfloat16": ("mixed_bfloat16", "keras"),
    "Keras AdamW, bfloat16 weights": ("bfloat16", "keras"),
    "AdamW8bit, mixed_bfloat16 (float32 weights)": ("mixed_bfloat16", None),
    "AdamW8bit plain, bfloat16 weights": ("bfloat16", "plain"),
    "AdamW8bit stochastic, bfloat16 weights": ("bfloat16", "stochastic"),
    "AdamW8bit kahan, bfloat16 weights": ("bfloat16", "kahan"),
}
REFERENCE = "AdamW8bit, mixed_bfloat16 (float32 weights)"


def digits_data():
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype("float32")
    rng = np.random.default_rng(123)
    order = rng.permutation(len(x))
    x, y = x[order], y[order]
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


def _bytes(variables) -> int:
    import keras
    import numpy as np
    import tensorflow as tf

    total = 0
    for v in variables:
        dtype = tf.as_dtype(keras.backend.standardize_dtype(v.dtype))
        total += int(np.prod(v.shape)) * dtype.size
    return total


class _EpochTimes:
    def __init__(self):
        import keras

        class Callback(keras.callbacks.Callback):
            def on_epoch_begin(cb, epoch, logs=None):
                cb.start = time.perf_counter()

            def on_epoch_end(cb, epoch, logs=None):
                self.times.append(time.perf_counter() - cb.start)

        self.times = []
        self.callback = Callback()


def run(name: str, seed: int, steps: int, data) -> dict:
    import keras
    import tensorflow as tf

    from tfmemopt.optimizers import AdamW8bit

    policy, kind = CONFIGS[name]
    (x, y), (xt, yt) = data
    keras.utils.set_random_seed(seed)
    keras.config.set_dtype_policy(policy)
    try:
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
    finally:
        keras.config.set_dtype_policy("float32")
    if kind == "keras":
        opt = keras.optimizers.AdamW(LR)
    else:
        opt = AdamW8bit(LR, bf16_update=kind)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(opt, loss)
    batch = 32
    per_epoch = -(-len(x) // batch)
    epochs = -(-steps // per_epoch)
    timer = _EpochTimes()
    model.fit(
        x,
        y,
        batch_size=batch,
        epochs=epochs,
        verbose=0,
        callbacks=[timer.callback],
    )
    with tf.GradientTape() as tape:
        g_loss = loss(y[:32], model(x[:32]))
    grads = tape.gradient(g_loss, model.trainable_variables)
    params = model.count_params()
    later = timer.times[1:] or timer.times
    return {
        "train": float(model.evaluate(x, y, batch_size=256, verbose=0)),
        "test": float(model.evaluate(xt, yt, batch_size=256, verbose=0)),
        "bytes": (_bytes(model.weights) + _bytes(opt.variables)) / params,
        "grad_bytes": _bytes(grads) / params,
        "step_s": median(later) / per_epoch,
        "steps": epochs * per_epoch,
    }


def _spread(values) -> str:
    mean = sum(values) / len(values)
    return f"{mean:.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=360)
    parser.add_argument(
        "--no-write", action="store_true", help="print, do not write"
    )
    args = parser.parse_args(argv)
    data = digits_data()
    results = {name: [] for name in CONFIGS}
    # Interleaved: seed by seed, every configuration, so that load on the
    # machine falls on all of them alike.
    for seed in range(args.seeds):
        for name in CONFIGS:
            r = run(name, seed, args.steps, data)
            results[name].append(r)
            print(f"seed {seed} {name}: {r}", flush=True)
    ref_time = median([r["step_s"] for r in results[REFERENCE]])
    rows = []
    for name, runs in results.items():
        rows.append(
            [
                name,
                _spread([r["train"] for r in runs]),
                _spread([r["test"] for r in runs]),
                f"{median([r['bytes'] for r in runs]):.2f}",
                f"{median([r['grad_bytes'] for r in runs]):.2f}",
                f"{median([r['step_s'] for r in runs]) / ref_time:.2f}",
            ]
        )
    steps = results[REFERENCE][0]["steps"]
    body = (
        "## bfloat16 weights (`bf16_update`)\n\n"
        "`benchmarks/bf16_weights.py`: digits MLP 64-256-256-10 (sklearn "
        f"`load_digits`, 1400 train / 397 held out), batch 32, lr {LR}, "
        f"{steps} steps, seeds 0-{args.seeds - 1}; loss = mean "
        "(min-max over seeds) after training. Bytes per parameter: weights "
        "+ everything in `optimizer.variables`, from their dtypes and "
        "sizes; gradients from one tape. Step time: ratio to AdamW8bit on "
        "float32 weights (median epoch after the first).\n\n"
        + table(
            [
                "weights / optimizer",
                "train loss",
                "held-out loss",
                "B/param weights+state",
                "B/param gradients",
                "step time",
            ],
            rows,
        )
    )
    print(body)
    if not args.no_write:
        write_section("bf16_weights", body)


if __name__ == "__main__":
    main()
