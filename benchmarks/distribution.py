"""Distribution: all-reduces per update and samples/s on two logical CPUs.

MirroredStrategy over two logical CPUs (one process). For a global batch B
of 256, `tfmemopt.Model(accumulation_steps=N)` runs N micro-batches per
replica and all-reduces once per update; the alternative with the same
activation memory per micro-batch is a plain `keras.Model` trained with
batch B/N, which all-reduces N times for the same B samples.

All-reduces are counted when the step function is traced (calls of
`ReplicaContext.all_reduce`, each a batched all-reduce, divided by the
number of replicas); none sits inside the micro-batch loop, so the count is
what runs per update. Samples/s is the median over epochs 2..5 (epoch 1
traces). Run: `.venv/bin/python benchmarks/distribution.py` (~3 minutes).
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report  # noqa: E402

import tfmemopt  # noqa: E402

GLOBAL_BATCH = 256
SAMPLES = 4096
EPOCHS = 5
STRATEGY = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
CALLS = {"grads": 0, "scalar": 0}
_original_all_reduce = tf.distribute.ReplicaContext.all_reduce


def _counting_all_reduce(self, reduce_op, value, options=None):
    flat = tf.nest.flatten(value)
    scalar = len(flat) == 1 and flat[0].shape.num_elements() == 1
    CALLS["scalar" if scalar else "grads"] += 1
    return _original_all_reduce(self, reduce_op, value, options=options)


tf.distribute.ReplicaContext.all_reduce = _counting_all_reduce


def _layers():
    inp = keras.Input((128,))
    h = keras.layers.Dense(512, activation="relu")(inp)
    h = keras.layers.Dense(512, activation="relu")(h)
    return inp, keras.layers.Dense(10)(h)


class _EpochTimes(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self.start)


def run(label, accumulation, batch_size, tfmemopt_model=True):
    keras.utils.set_random_seed(0)
    with STRATEGY.scope():
        inp, out = _layers()
        if tfmemopt_model:
            model = tfmemopt.Model(inp, out, accumulation_steps=accumulation)
        else:
            model = keras.Model(inp, out)
        model.compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 128)).astype("float32")
    y = rng.integers(0, 10, size=(SAMPLES,))
    timer = _EpochTimes()
    timer.times = []
    CALLS.update(grads=0, scalar=0)
    model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[timer],
    )
    replicas = STRATEGY.num_replicas_in_sync
    steps_per_global_batch = GLOBAL_BATCH // batch_size
    seconds = _report.median(timer.times[1:])
    return {
        "label": label,
        "micro": batch_size // accumulation // 2,
        "grads": CALLS["grads"] / replicas * steps_per_global_batch,
        "scalar": CALLS["scalar"] / replicas * steps_per_global_batch,
        "sps": SAMPLES / seconds,
    }


def main():
    rows = []
    for n in (1, 4, 8):
        rows.append(run(f"tfmemopt.Model N={n}, batch {GLOBAL_BATCH}", n, 256))
        if n > 1:
            rows.append(
                run(
                    f"keras.Model, batch {GLOBAL_BATCH // n} (same micro)",
                    1,
                    GLOBAL_BATCH // n,
                    tfmemopt_model=False,
                )
            )
        print(rows[-1], flush=True)
    base = rows[0]["sps"]
    table = _report.table(
        [
            "run (MirroredStrategy, 2 logical CPUs)",
            "samples per replica micro-batch",
            f"gradient all-reduces per {GLOBAL_BATCH} samples",
            "scalar all-reduces",
            "samples/s (median)",
            "vs N=1",
        ],
        [
            [
                r["label"],
                r["micro"],
                f"{r['grads']:g}",
                f"{r['scalar']:g}",
                f"{r['sps']:.0f}",
                f"{r['sps'] / base:.2f}x",
            ]
            for r in rows
        ],
    )
    body = (
        "## distribution\n\n"
        "`tfmemopt.Model` under `MirroredStrategy` on two logical CPUs "
        f"(MLP 128-512-512-10, {SAMPLES} samples, SGD with momentum). "
        "Accumulating inside a replica keeps one all-reduce of the "
        f"gradients per update of {GLOBAL_BATCH} samples (plus one scalar: the "
        "global sample count that normalises the loss), whatever N; the "
        "plain model with "
        "the same micro-batch all-reduces its gradients once per small "
        "batch. One run per row, samples/s is the "
        f"median of epochs 2..{EPOCHS}; the machine was shared with other "
        "engineers' jobs while this ran, so compare ratios, not absolute "
        "speed.\n\n" + table
    )
    _report.write_section("distribution", body)


if __name__ == "__main__":
    main()
