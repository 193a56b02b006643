"""Adam's state at a quarter of the bytes: 8-bit AdamW and factored Adafactor.

Trains the same MLP on scikit-learn's digits (shipped with scikit-learn, no
download) with Keras's AdamW, tfmemopt's AdamW8bit and tfmemopt's Adafactor,
and prints, for each, the bytes of optimizer state per parameter and the
final held-out accuracy. Then it saves the AdamW8bit model, loads it and
checks that its 8-bit state came back bit for bit.

    python examples/small_state_optimizers.py
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tempfile  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tfmemopt  # noqa: E402

EPOCHS = int(os.environ.get("TFMEMOPT_EXAMPLE_EPOCHS", "10"))


def make_model():
    keras.utils.set_random_seed(0)
    # 64 -> 300 -> 300 -> 10: the matrices hold 96% of the parameters, and
    # no size is a multiple of the 8-bit block size (256).
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(300, activation="relu"),
            keras.layers.Dense(300, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def state_bytes(optimizer):
    """Bytes of every variable the optimizer keeps, the counters aside."""
    skip = {id(optimizer.iterations)}
    lr = getattr(optimizer, "_learning_rate", None)
    if isinstance(lr, keras.Variable):
        skip.add(id(lr))
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        for v in optimizer.variables
        if id(v) not in skip
    )


def main():
    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype("float32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    (xt, yt), (xv, yv) = (x[:1400], y[:1400]), (x[1400:], y[1400:])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizers = {
        "keras AdamW": keras.optimizers.AdamW(1e-3),
        "tfmemopt AdamW8bit": tfmemopt.optimizers.AdamW8bit(1e-3),
        # Adafactor's relative step: learning_rate caps it (paper: 1e-2)
        "tfmemopt Adafactor": tfmemopt.optimizers.Adafactor(1e-2),
    }
    print(f"{'optimizer':<20} {'state B/param':>14} {'held-out acc':>13}")
    models = {}
    for name, optimizer in optimizers.items():
        model = make_model()
        model.compile(optimizer, loss, metrics=["accuracy"])
        model.fit(xt, yt, batch_size=32, epochs=EPOCHS, verbose=0)
        _, acc = model.evaluate(xv, yv, verbose=0)
        per_param = state_bytes(optimizer) / model.count_params()
        print(f"{name:<20} {per_param:>14.3f} {acc:>13.4f}")
        models[name] = model

    model = models["tfmemopt AdamW8bit"]
    path = os.path.join(tempfile.mkdtemp(), "digits.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    same = all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(model.optimizer.variables, loaded.optimizer.variables)
    )
    print(
        f"8-bit state after save/load: {'bit for bit' if same else 'CHANGED'}"
    )


if __name__ == "__main__":
    main()
