"""How far each accumulation method lands from true full-batch training.

Trains the same small models with the same data for a few epochs and reports
max |w - w_full_batch| / max |w_full_batch - w_init| (0 is exact; float32
rounding alone gives ~1e-6) for:

- `tfmemopt.Model(accumulation_steps=N)` at batch B;
- Keras's built-in `gradient_accumulation_steps=N` at batch B/N;
- the gradient-accumulator package's `GradientAccumulateModel` at B/N
  (0.5.2, model wrapper; where it imports).

Run: `python benchmarks/exactness.py` (writes its section of BENCHMARKS.md).
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _report  # noqa: E402

import tfmemopt  # noqa: E402

N = 4


def mlp():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(16, activation="tanh")(inputs)
    return inputs, keras.layers.Dense(3)(h)


def masked():
    keras.utils.set_random_seed(2)
    inputs = keras.Input((7,), dtype="int32")
    h = keras.layers.Embedding(12, 6, mask_zero=True)(inputs)
    h = keras.layers.Dense(8, activation="tanh")(h)
    return inputs, keras.layers.Dense(4)(h)


def mlp_data(n):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, rng.integers(0, 3, size=(n,))


def masked_data(n):
    rng = np.random.default_rng(3)
    x = rng.integers(1, 12, size=(n, 7)).astype("int32")
    for i, length in enumerate(rng.integers(1, 8, size=(n,))):
        x[i, length:] = 0
    return x, rng.integers(0, 4, size=(n, 7))


def sce(reduction="sum_over_batch_size"):
    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=reduction
    )


SCENARIOS = {
    "SGD, equal micro-batches": (
        mlp,
        mlp_data,
        32,
        8,
        lambda **k: keras.optimizers.SGD(0.1, **k),
    ),
    "SGD + ExponentialDecay(decay_steps=1)": (
        mlp,
        mlp_data,
        32,
        8,
        lambda **k: keras.optimizers.SGD(
            keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.7), **k
        ),
    ),
    "Adam, sample weights, mean_with_sample_weight": (
        mlp,
        mlp_data,
        32,
        8,
        lambda **k: keras.optimizers.Adam(0.01, **k),
    ),
    "masked sequence loss, SGD": (
        masked,
        masked_data,
        32,
        8,
        lambda **k: keras.optimizers.SGD(0.5, **k),
    ),
    "batch 10 not divisible by N=4": (
        mlp,
        mlp_data,
        30,
        10,
        lambda **k: keras.optimizers.SGD(0.1, **k),
    ),
}


def run(name, build, x, y, batch, optimizer, method):
    keras.backend.clear_session()
    inputs, outputs = build()
    opt_kwargs = {}
    fit_batch = batch
    if method == "full batch":
        model = keras.Model(inputs, outputs)
    elif method == "tfmemopt":
        model = tfmemopt.Model(inputs, outputs, accumulation_steps=N)
    elif method == "keras":
        model = keras.Model(inputs, outputs)
        opt_kwargs = {"gradient_accumulation_steps": N}
        fit_batch = -(-batch // N)
    else:
        from gradient_accumulator import GradientAccumulateModel

        model = GradientAccumulateModel(
            accum_steps=N, inputs=inputs, outputs=outputs
        )
        fit_batch = -(-batch // N)
    w0 = model.get_weights()
    weighted = "sample weights" in name
    model.compile(
        optimizer(**opt_kwargs),
        sce("mean_with_sample_weight" if weighted else "sum_over_batch_size"),
    )
    sw = None
    if weighted:
        sw = np.random.default_rng(5).uniform(0.1, 3.0, len(x))
        sw = sw.astype("float32")
    model.fit(
        x,
        y,
        sample_weight=sw,
        batch_size=fit_batch,
        epochs=3,
        verbose=0,
        shuffle=False,
    )
    return w0, model.get_weights()


def main():
    methods = ["tfmemopt", "keras", "gradient-accumulator"]
    rows = []
    for name, (build, make_data, n, batch, optimizer) in SCENARIOS.items():
        x, y = make_data(n)
        w0, ref = run(name, build, x, y, batch, optimizer, "full batch")
        change = max(np.abs(a - b).max() for a, b in zip(ref, w0))
        row = [name]
        for method in methods:
            try:
                _, w = run(name, build, x, y, batch, optimizer, method)
                diff = max(np.abs(a - b).max() for a, b in zip(ref, w))
                row.append(f"{diff / change:.1e}")
            except Exception as e:  # noqa: BLE001 - the row says it broke
                row.append(f"fails: {type(e).__name__}")
        print(row, flush=True)
        rows.append(row)
    body = (
        "## Exactness against full-batch training "
        "(`benchmarks/exactness.py`)\n\n"
        "max |w - w_full| / max |w_full - w_init| after 3 epochs (0 is "
        f"exact; float32 rounding alone gives ~1e-6), N={N}. tfmemopt runs "
        "at batch B; the others at B/N, accumulating N micro-batches.\n\n"
        + _report.table(
            [
                "scenario",
                "tfmemopt.Model",
                "Keras gradient_accumulation_steps",
                "GradientAccumulateModel 0.5.2",
            ],
            rows,
        )
    )
    _report.write_section("exactness", body)


if __name__ == "__main__":
    main()
