"""FSDP for Keras on TensorFlow: a keras-hub GPT-2 with `shard_parameters=True`.

Builds a keras-hub GPT-2 from a small config (no download: 2 layers, width
64, a character vocabulary of the dataset descriptions that ship with
scikit-learn) and trains it under `tf.distribute.MirroredStrategy` twice
from the same initial weights: with Keras's own data parallelism (every
replica holds the whole model and optimizer state) and with
`tfmemopt.Model.wrap(..., shard_parameters=True, accumulation_steps=2)`
(each replica holds 1/R of every weight and of AdamW's state; each layer's
weight is all-gathered when it runs). Uses the local GPUs when there are
two or more, else splits the CPU into 2 logical devices. Prints the bytes
of weights + optimizer state on each device for both, and both losses.
The smoke mode trains 1 layer for 8 steps, sharded only and without
accumulation (the whole model is built, not trained, for its bytes).

    python examples/fsdp_gpt2.py
    TFMEMOPT_EXAMPLE_SMOKE=1 python examples/fsdp_gpt2.py   # a few steps
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import glob  # noqa: E402

import tensorflow as tf  # noqa: E402

# Logical CPUs must be made before TensorFlow initialises its devices.
_GPUS = tf.config.list_physical_devices("GPU")
if len(_GPUS) < 2:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * 2,
    )

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import sklearn  # noqa: E402

import tfmemopt  # noqa: E402

SMOKE = os.environ.get("TFMEMOPT_EXAMPLE_SMOKE") == "1"
SEQ = 64
BATCH = 16  # global: BATCH / R per replica, cut into 2 micro-batches
STEPS = 8 if SMOKE else 200
LR = 1e-3


def text_data():
    """Character ids of scikit-learn's dataset descriptions in sequences
    of SEQ + 1: ((x, y), vocabulary size)."""
    root = os.path.join(os.path.dirname(sklearn.__file__), "datasets")
    text = "".join(
        open(path, encoding="utf-8").read()
        for path in sorted(glob.glob(os.path.join(root, "descr", "*.rst")))
    )
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype="int32")
    n = min((len(ids) - 1) // SEQ, STEPS * BATCH)
    x = ids[: n * SEQ].reshape(n, SEQ)
    y = ids[1 : n * SEQ + 1].reshape(n, SEQ)
    return ({"token_ids": x, "padding_mask": np.ones_like(x)}, y), len(chars)


def make_lm(vocab):
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab,
        num_layers=1 if SMOKE else 2,
        num_heads=4,
        hidden_dim=64,
        intermediate_dim=256,
        dropout=0.0,
        max_sequence_length=SEQ,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def bytes_per_device(strategy, variables):
    """Bytes of `variables` on each device (a distributed variable counts
    each of its components on its own device)."""
    out = {}
    for v in variables:
        if isinstance(v, keras.Variable):
            v = v.value  # the tf.Variable (a distributed one) it holds
        for part in strategy.experimental_local_results(v):
            device = part.device[part.device.find("device:") + 7 :]
            size = int(np.prod(part.shape)) * tf.as_dtype(part.dtype).size
            out[device] = out.get(device, 0) + size
    return out


def train(strategy, shard, initial, data, vocab, fit=True):
    (x, y) = data
    with strategy.scope():
        lm = make_lm(vocab)
        lm.set_weights(initial)
        if shard:
            # The smoke mode skips accumulation: tracing 2 micro-batches
            # doubles its compile time (tests/distribute covers it).
            model = tfmemopt.Model.wrap(
                lm,
                accumulation_steps=1 if SMOKE else 2,
                shard_parameters=True,
            )
        else:
            model = lm
        optimizer = keras.optimizers.AdamW(LR)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
    state = bytes_per_device(
        strategy, list(model.trainable_variables) + list(optimizer.variables)
    )
    if not fit:
        return state, None, model
    history = model.fit(
        x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0
    )
    return state, history.history["loss"][-1], model


def main():
    if len(_GPUS) >= 2:
        strategy = tf.distribute.MirroredStrategy()
    else:
        strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
    replicas = strategy.num_replicas_in_sync
    data, vocab = text_data()
    keras.utils.set_random_seed(0)
    initial = make_lm(vocab).get_weights()
    params = sum(int(np.prod(w.shape)) for w in initial)
    whole, whole_loss, _ = train(
        strategy, False, initial, data, vocab, fit=not SMOKE
    )
    sharded, sharded_loss, model = train(strategy, True, initial, data, vocab)
    # Whole weights come back out of the shards (get_weights, saving).
    shapes_ok = [w.shape for w in model.get_weights()] == [
        w.shape for w in initial
    ]
    print(
        f"GPT-2 (keras-hub, small config): {params} parameters, AdamW, "
        f"{len(data[1]) // BATCH} steps of batch {BATCH}, R = {replicas} "
        f"({'GPUs' if len(_GPUS) >= 2 else 'logical CPUs'})"
    )
    print(f"{'device':<12}{'whole MiB':>12}{'sharded MiB':>14}{'ratio':>8}")
    for device in sorted(whole):
        a, b = whole[device] / 2**20, sharded.get(device, 0) / 2**20
        print(f"{device:<12}{a:>12.3f}{b:>14.3f}{b / a:>8.3f}")
    if whole_loss is None:
        print(f"loss after training: sharded {sharded_loss:.5f}")
    else:
        print(
            f"loss after training: whole {whole_loss:.5f}, sharded "
            f"{sharded_loss:.5f}"
        )
    print(f"get_weights gives whole arrays: {shapes_ok}")


if __name__ == "__main__":
    main()
