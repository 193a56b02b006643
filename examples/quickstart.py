"""Quickstart: exact gradient accumulation with a `tfmemopt.Model` subclass.

Trains a small classifier on scikit-learn's bundled handwritten digits (no
download) twice with the same effective batch of 512: plain Keras, and
`tfmemopt.Model` with 8 micro-batches of 64. It prints the peak memory of one
training step for each (the accelerator when there is one, else `CPU:0`) and
the final accuracy, which match because the updates are the same.

Run: `make demo` (or `python examples/quickstart.py`).
"""

import os

# CPU memory statistics come from oneDNN's allocator: ask for it before
# TensorFlow is imported (TensorFlow enables it by default only on some CPUs).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tfmemopt  # noqa: E402

BATCH = 1024
STEPS = 8
# The smoke test shortens training with this variable; users need not.
EPOCHS = int(os.environ.get("TFMEMOPT_QUICKSTART_EPOCHS", "15"))


class DigitNet(tfmemopt.Model):
    """A wide MLP: its activations, not its weights, dominate memory."""

    def __init__(self, width=512, **kwargs):
        super().__init__(**kwargs)
        self.width = width
        self.hidden = [
            keras.layers.Dense(width, activation="relu") for _ in range(4)
        ]
        self.head = keras.layers.Dense(10)

    def call(self, inputs):
        h = inputs
        for layer in self.hidden:
            h = layer(h)
        return self.head(h)


def device_name():
    for kind in ("GPU", "TPU"):
        if keras.config.backend() == "tensorflow":
            import tensorflow as tf

            if tf.config.list_logical_devices(kind):
                return f"{kind}:0"
    return "CPU:0"


def train(accumulation_steps, x, y, x_test, y_test):
    keras.utils.set_random_seed(0)
    model = DigitNet(accumulation_steps=accumulation_steps)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    device = device_name()
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
    try:
        peak, _ = tfmemopt.memory.measure_peak(
            lambda: model.train_on_batch(x[:BATCH], y[:BATCH]), device
        )
    except tfmemopt.memory.MemoryStatsUnavailable as e:
        print(f"(no memory statistics: {e})")
        peak = None
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    return peak, accuracy, device


def main():
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    x, y = x[order], y[order]
    x_train, y_train = x[:1400], y[:1400]
    x_test, y_test = x[1400:], y[1400:]

    rows = []
    for label, steps in (
        (f"plain Keras, batch {BATCH}", 1),
        (f"tfmemopt, {STEPS} x {BATCH // STEPS}", STEPS),
    ):
        peak, accuracy, device = train(steps, x_train, y_train, x_test, y_test)
        rows.append((label, peak, accuracy))

    print(f"\nOne training step of an effective batch of {BATCH} on {device}:")
    print(f"{'':28} {'peak memory':>12} {'test accuracy':>14}")
    for label, peak, accuracy in rows:
        mib = "n/a" if peak is None else f"{peak / 2**20:.1f} MiB"
        print(f"{label:28} {mib:>12} {accuracy:>14.4f}")
    if rows[0][1] and rows[1][1]:
        print(f"peak ratio (tfmemopt / plain): {rows[1][1] / rows[0][1]:.2f}")


if __name__ == "__main__":
    main()
