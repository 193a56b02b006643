"""Long context: a keras-hub GPT-2 trained where plain Keras does not fit.

Builds a keras-hub `GPT2CausalLM` from a small config (no download: 2
layers, 12 heads, width 192, GPT-2's vocabulary size of 50257) and trains it
on 4 x 1024-token windows of word ids (the dataset descriptions that ship
with scikit-learn, one id per distinct word; the rest of the 50257 rows are
never seen, as rare tokens in a real corpus). Stated budget: 1024 MiB for
one training step, weights and Adam state included.

It measures one step of `tfmemopt.Model.wrap(model, chunked_loss=True,
attention="chunked")` and one of plain Keras (`model.fit` as compiled),
from the same initial weights, as the allocator's peak during the step
(`CPU:0`, or `GPU:0` where there is one), and trains the wrapped model and
prints its loss. Plain Keras holds the logits (4096 x 50257 floats, 785 MiB
a copy) and every layer's 4 x 12 x 1024 x 1024 attention scores; the wrap
holds one block of each at a time, recomputed in the backward pass.

    python examples/long_context_gpt2.py
    TFMEMOPT_EXAMPLE_SMOKE=1 python examples/long_context_gpt2.py  # small

The smoke mode uses a vocabulary of 8192, 1 layer of width 64 (4 heads),
2 x 512 tokens, a 96 MiB budget and 3 training steps.
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gc  # noqa: E402
import glob  # noqa: E402
import re  # noqa: E402

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import sklearn  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfmemopt  # noqa: E402
from tfmemopt.memory import device_memory  # noqa: E402
from tfmemopt.memory import reset_peak  # noqa: E402

SMOKE = os.environ.get("TFMEMOPT_EXAMPLE_SMOKE") == "1"
if SMOKE:
    VOCAB, LAYERS, HEADS, WIDTH, BATCH, SEQ = 8192, 1, 4, 64, 2, 512
    BUDGET_MIB, STEPS = 96, 3
else:
    VOCAB, LAYERS, HEADS, WIDTH, BATCH, SEQ = 50257, 2, 12, 192, 4, 1024
    BUDGET_MIB, STEPS = 1024, 30
DEVICE = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"


def word_ids():
    """One id per distinct word of scikit-learn's dataset descriptions,
    in text order (ids below VOCAB)."""
    root = os.path.join(os.path.dirname(sklearn.__file__), "datasets")
    text = " ".join(
        open(path, encoding="utf-8").read()
        for path in sorted(glob.glob(os.path.join(root, "descr", "*.rst")))
    )
    words = re.findall(r"\w+|[^\w\s]", text.lower())
    index = {}
    ids = [index.setdefault(w, len(index)) % VOCAB for w in words]
    return np.array(ids, dtype="int32")


def batches(ids):
    """(x, y) batches of BATCH windows of SEQ tokens, next-token targets."""
    rng = np.random.default_rng(0)
    while True:
        starts = rng.integers(0, len(ids) - SEQ - 1, size=BATCH)
        tokens = np.stack([ids[s : s + SEQ + 1] for s in starts])
        x = {
            "token_ids": tokens[:, :-1],
            "padding_mask": np.ones((BATCH, SEQ), bool),
        }
        yield x, tokens[:, 1:]


def gpt2():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB,
        num_layers=LAYERS,
        num_heads=HEADS,
        hidden_dim=WIDTH,
        intermediate_dim=4 * WIDTH,
        max_sequence_length=SEQ,
        dropout=0.0,  # chunked attention refuses attention dropout
    )
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def compiled(model):
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def step_peak_mib(model, x, y):
    """The allocator's peak during one step (after a traced warm-up)."""
    model.train_on_batch(x, y)
    reset_peak(DEVICE)
    model.train_on_batch(x, y)
    return device_memory(DEVICE)["peak"] / 2**20


def main():
    data = batches(word_ids())
    x, y = next(data)
    print(
        f"GPT-2 {LAYERS} layers, {HEADS} heads, width {WIDTH}, vocabulary "
        f"{VOCAB}, {BATCH} x {SEQ} tokens, Adam; budget {BUDGET_MIB} MiB"
    )

    # The wrap first, on an allocator nothing has fragmented yet: measured
    # after plain Keras's step, its peak moved with the chunks that step
    # left (62 MiB in one run, 80 in another, smoke mode).
    model = compiled(
        tfmemopt.Model.wrap(gpt2(), chunked_loss=True, attention="chunked")
    )
    peak = step_peak_mib(model, x, y)
    print(model.long_sequences)
    losses = []
    for _ in range(STEPS):
        x_step, y_step = next(data)
        losses.append(float(model.train_on_batch(x_step, y_step)))
    del model
    keras.backend.clear_session()
    gc.collect()

    plain = compiled(gpt2())
    plain_peak = step_peak_mib(plain, x, y)
    del plain
    for name, mib in (("plain Keras", plain_peak), ("tfmemopt", peak)):
        fits = mib <= BUDGET_MIB
        print(f"{name:<12} step peak {mib:8.1f} MiB  fits: {fits}")

    print(f"loss first {losses[0]:.4f} last {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
