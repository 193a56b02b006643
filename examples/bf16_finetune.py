"""bfloat16 weights with AdamW8bit: a keras-hub GPT-2 at 4 bytes per parameter.

Builds a keras-hub GPT-2 from a small config (no download: 2 layers, width
64, a character vocabulary) twice from the same initial weights: once with
float32 weights (policy "float32") and once with bfloat16 weights (policy
"bfloat16", the weights rounded from the float32 ones). Both are trained
with tfmemopt's `AdamW8bit` on the dataset descriptions that ship with
scikit-learn (characters, the last 10% held out); on bfloat16 weights its
float32 step is written by stochastic rounding (`bf16_update=None`).
Prints, for each, the bytes per parameter of weights + optimizer state and
of gradients, and the train and held-out loss; then Keras's own AdamW on
bfloat16 weights for comparison (its step is zero: it casts `beta_2` to
bfloat16, 1.0). The smoke mode trains 1 layer for 24 steps, without the
Keras run.

    python examples/bf16_finetune.py
    TFMEMOPT_EXAMPLE_SMOKE=1 python examples/bf16_finetune.py   # a few steps
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import glob  # noqa: E402

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import sklearn  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfmemopt  # noqa: E402

SMOKE = os.environ.get("TFMEMOPT_EXAMPLE_SMOKE") == "1"
SEQ = 64
BATCH = 16
STEPS = 24 if SMOKE else 400
LR = 3e-4


def text_data():
    """Character ids of scikit-learn's dataset descriptions, cut into
    sequences of SEQ + 1: (train, held_out), vocabulary size."""
    root = os.path.join(os.path.dirname(sklearn.__file__), "datasets")
    text = "".join(
        open(path, encoding="utf-8").read()
        for path in sorted(glob.glob(os.path.join(root, "descr", "*.rst")))
    )
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype="int32")
    cut = int(len(ids) * 0.9)

    def windows(a):
        n = (len(a) - 1) // SEQ
        x = a[: n * SEQ].reshape(n, SEQ)
        y = a[1 : n * SEQ + 1].reshape(n, SEQ)
        inputs = {"token_ids": x, "padding_mask": np.ones_like(x, bool)}
        return inputs, y

    (x, y), held_out = windows(ids[:cut]), windows(ids[cut:])
    if SMOKE:
        x = {k: v[: STEPS * BATCH] for k, v in x.items()}
        y = y[: STEPS * BATCH]
    return (x, y), held_out, len(chars)


def make_model(vocab, dtype):
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab,
        num_layers=1 if SMOKE else 2,
        num_heads=4,
        hidden_dim=64,
        intermediate_dim=256,
        dropout=0.0,
        max_sequence_length=SEQ,
        dtype=dtype,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def nbytes(values):
    return sum(
        int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in values
    )


def train(name, dtype, optimizer, initial, data):
    (x, y), (xt, yt), vocab = data
    model = make_model(vocab, dtype)
    # The same start for every run: the float32 weights, rounded to
    # bfloat16 where the weights are bfloat16.
    model.set_weights(initial)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # XLA is off only to keep the compile time of this small CPU demo
    # short; tfmemopt's bfloat16 write compiles its own kernel either way.
    model.compile(optimizer=optimizer, loss=loss, jit_compile=False)
    per_epoch = -(-len(y) // BATCH)
    epochs = -(-STEPS // per_epoch)
    model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0)
    with tf.GradientTape() as tape:
        batch = {k: v[:BATCH] for k, v in x.items()}
        g_loss = loss(y[:BATCH], model(batch))
    grads = tape.gradient(g_loss, model.trainable_variables)
    params = model.count_params()
    state = nbytes(model.weights) + nbytes(optimizer.variables)
    return {
        "name": name,
        "weights": model.weights[0].dtype,
        "state": state / params,
        "grads": nbytes(grads) / params,
        "train": model.evaluate(
            x, y, batch_size=64, verbose=0, return_dict=True
        )["loss"],
        "held_out": model.evaluate(
            xt, yt, batch_size=64, verbose=0, return_dict=True
        )["loss"],
    }


def main():
    data = text_data()
    keras.utils.set_random_seed(0)
    initial = make_model(data[2], "float32").get_weights()
    runs = [
        train(
            "AdamW8bit, float32 weights",
            "float32",
            tfmemopt.optimizers.AdamW8bit(LR),
            initial,
            data,
        ),
        train(
            "AdamW8bit, bfloat16 weights",
            "bfloat16",
            tfmemopt.optimizers.AdamW8bit(LR),  # bf16_update=None: stochastic
            initial,
            data,
        ),
    ]
    if not SMOKE:
        runs.append(
            train(
                "Keras AdamW, bfloat16 weights",
                "bfloat16",
                keras.optimizers.AdamW(LR),
                initial,
                data,
            )
        )
    params = make_model(data[2], "float32").count_params()
    print(
        f"GPT-2 (keras-hub, small config): {params} parameters, "
        f"{STEPS} steps of batch {BATCH}, lr {LR}"
    )
    print(
        f"{'run':<32}{'weights':>10}{'B/param w+state':>17}"
        f"{'B/param grads':>15}{'train':>8}{'held-out':>10}"
    )
    for r in runs:
        print(
            f"{r['name']:<32}{r['weights']:>10}{r['state']:>17.2f}"
            f"{r['grads']:>15.2f}{r['train']:>8.4f}{r['held_out']:>10.4f}"
        )


if __name__ == "__main__":
    main()
