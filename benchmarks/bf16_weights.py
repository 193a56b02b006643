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

A tiny causal transformer LM (`--task lm`): characters of the dataset
descriptions that ship with scikit-learn (`sklearn/datasets/descr/*.rst`,
43 kB of English; the last 10% held out), 2 pre-norm blocks of width 64
with 4 heads (Keras `MultiHeadAttention(use_causal_mask=True)`), sequences
of 64, batch 16, lr 3e-4: `AdamW8bit` on float32 weights
(`mixed_bfloat16`) against bfloat16 weights with `"stochastic"`,
`"kahan"` and `"plain"`, and Keras AdamW on bfloat16 weights.

Run: `python benchmarks/bf16_weights.py [--task digits|lm|both]
[--seeds 3] [--steps N]`.
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
LM_CONFIGS = [
    REFERENCE,
    "Keras AdamW, bfloat16 weights",
    "AdamW8bit plain, bfloat16 weights",
    "AdamW8bit stochastic, bfloat16 weights",
    "AdamW8bit kahan, bfloat16 weights",
]
LM_SEQ, LM_WIDTH, LM_HEADS, LM_BLOCKS, LM_BATCH = 64, 64, 4, 2, 16


def lm_data():
    """Character windows of scikit-learn's dataset descriptions: train on
    the first 90% of the text, hold out the rest. Returns
    ((x, y), (xt, yt)), vocabulary size."""
    import glob

    import numpy as np
    import sklearn

    root = os.path.join(os.path.dirname(sklearn.__file__), "datasets")
    text = "".join(
        open(f, encoding="utf-8").read()
        for f in sorted(glob.glob(os.path.join(root, "descr", "*.rst")))
    )
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype="int32")
    cut = int(len(ids) * 0.9)

    def windows(a):
        n = (len(a) - 1) // LM_SEQ
        x = a[: n * LM_SEQ].reshape(n, LM_SEQ)
        y = a[1 : n * LM_SEQ + 1].reshape(n, LM_SEQ)
        return x, y

    return (windows(ids[:cut]), windows(ids[cut:])), len(chars)


def lm_model(vocab: int):
    """A tiny pre-norm causal transformer LM (logits in float32)."""
    import keras
    from keras import ops

    class Positions(keras.layers.Layer):
        def build(self, shape):
            self.table = self.add_weight(
                (shape[1], shape[2]), initializer="random_normal"
            )

        def call(self, x):
            return x + ops.cast(self.table, x.dtype)[None]

    layers = keras.layers
    tokens = keras.Input((LM_SEQ,), dtype="int32")
    x = Positions()(layers.Embedding(vocab, LM_WIDTH)(tokens))
    for _ in range(LM_BLOCKS):
        h = layers.LayerNormalization()(x)
        h = layers.MultiHeadAttention(LM_HEADS, LM_WIDTH // LM_HEADS)(
            h, h, use_causal_mask=True
        )
        x = x + h
        h = layers.LayerNormalization()(x)
        h = layers.Dense(4 * LM_WIDTH, activation="gelu")(h)
        x = x + layers.Dense(LM_WIDTH)(h)
    x = layers.LayerNormalization()(x)
    logits = layers.Dense(vocab)(x)
    logits = layers.Activation("linear", dtype="float32")(logits)
    return keras.Model(tokens, logits)


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


def run(name: str, seed: int, steps: int, data, task="digits") -> dict:
    import keras
    import tensorflow as tf

    from tfmemopt.optimizers import AdamW8bit

    policy, kind = CONFIGS[name]
    if task == "lm":
        ((x, y), (xt, yt)), vocab = data
    else:
        (x, y), (xt, yt) = data
    keras.utils.set_random_seed(seed)
    keras.config.set_dtype_policy(policy)
    try:
        if task == "lm":
            model = lm_model(vocab)
        else:
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
    batch = LM_BATCH if task == "lm" else 32
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
        g_loss = loss(y[:batch], model(x[:batch]))
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


def measure(task, configs, seeds, steps, data) -> tuple[list, int]:
    """Every configuration over `seeds`, interleaved seed by seed so that
    load on the machine falls on all of them alike. Returns the table's
    rows and the step count."""
    results = {name: [] for name in configs}
    for seed in range(seeds):
        for name in configs:
            r = run(name, seed, steps, data, task)
            results[name].append(r)
            print(f"{task} seed {seed} {name}: {r}", flush=True)
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
    return rows, results[REFERENCE][0]["steps"]


HEADERS = [
    "weights / optimizer",
    "train loss",
    "held-out loss",
    "B/param weights+state",
    "B/param gradients",
    "step time",
]


def digits_section(seeds, steps) -> str:
    rows, steps = measure("digits", list(CONFIGS), seeds, steps, digits_data())
    return (
        "## bfloat16 weights (`bf16_update`)\n\n"
        "`benchmarks/bf16_weights.py`: digits MLP 64-256-256-10 (sklearn "
        f"`load_digits`, 1400 train / 397 held out), batch 32, lr {LR}, "
        f"{steps} steps, seeds 0-{seeds - 1}; loss = mean "
        "(min-max over seeds) after training. Bytes per parameter: weights "
        "+ everything in `optimizer.variables`, from their dtypes and "
        "sizes; gradients from one tape. Step time: ratio to AdamW8bit on "
        "float32 weights (median epoch after the first).\n\n"
        + table(HEADERS, rows)
    )


def lm_section(seeds, steps) -> str:
    data = lm_data()
    ((x, _), (xt, _)), vocab = data
    rows, steps = measure("lm", LM_CONFIGS, seeds, steps, data)
    return (
        "## bfloat16 weights on a tiny transformer LM\n\n"
        "`benchmarks/bf16_weights.py --task lm`: a causal character LM on "
        "the dataset descriptions shipped with scikit-learn "
        f"(`sklearn/datasets/descr/*.rst`, vocabulary {vocab}, "
        f"{len(x)} train / {len(xt)} held-out sequences of {LM_SEQ}), "
        f"{LM_BLOCKS} pre-norm blocks of width {LM_WIDTH}, {LM_HEADS} "
        f"heads, batch {LM_BATCH}, lr {LR}, {steps} steps, seeds "
        f"0-{seeds - 1}; loss in nats per character, mean (min-max over "
        "seeds). Columns as in the digits table; step time as a ratio to "
        "AdamW8bit on float32 weights (`mixed_bfloat16`).\n\n"
        + table(HEADERS, rows)
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task", choices=["digits", "lm", "both"], default="both"
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--steps", type=int, default=None, help="digits 360, lm 400"
    )
    parser.add_argument(
        "--no-write", action="store_true", help="print, do not write"
    )
    args = parser.parse_args(argv)
    sections = []
    if args.task in ("digits", "both"):
        sections.append(
            ("bf16_weights", digits_section(args.seeds, args.steps or 360))
        )
    if args.task in ("lm", "both"):
        sections.append(
            ("bf16_weights_lm", lm_section(args.seeds, args.steps or 400))
        )
    for name, body in sections:
        print(body)
        if not args.no_write:
            write_section(name, body)


if __name__ == "__main__":
    main()
