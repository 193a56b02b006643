"""The measurements made on each client (tests and benchmarks/clients.py).

Each returns a number or a flag; the tests assert bounds on them and the
benchmark prints them as the clients table.
"""

from __future__ import annotations

import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import tfmemopt

from .models import CLIENTS
from .models import compile_kwargs
from .models import loss_grads

STEPS = 2  # fit steps compared
N = 4  # micro-batches


def _fit(model, client, data, callbacks=()):
    x, y, sw = keras.utils.unpack_x_y_sample_weight(data)
    model.compile(**compile_kwargs(client))
    return model.fit(
        x,
        y,
        sample_weight=sw,
        batch_size=client.batch,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=list(callbacks),
    )


def accumulation(name: str) -> dict:
    """Plain Keras against `Model.wrap(model, N)` at the same batch.

    Returns `rel_diff` (max |w - w_plain| over the largest weight change of
    plain Keras), `monitor_keys` (the `memory/...` keys MemoryMonitor put
    in the logs) and `save_diff` (largest prediction difference after a
    `.keras` round trip of the trained wrapper).
    """
    client = CLIENTS[name]
    data = client.fit_data(client.batch * STEPS)
    keras.backend.clear_session()
    plain = client.model()
    w0 = plain.get_weights()
    _fit(plain, client, data)
    ref = plain.get_weights()

    keras.backend.clear_session()
    ours = tfmemopt.Model.wrap(client.model(), N)
    monitor = tfmemopt.callbacks.MemoryMonitor()
    history = _fit(ours, client, data, [monitor])
    got = ours.get_weights()
    change = max(float(np.max(np.abs(a - b))) for a, b in zip(ref, w0))
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(ref, got))
    keys = sorted(k for k in history.history if k.startswith("memory/"))

    x = data[0]
    before = ours.predict(x, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.keras")
        ours.save(path)
        loaded = keras.saving.load_model(path)
    after = loaded.predict(x, verbose=0)
    save_diff = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(tf.nest.flatten(before), tf.nest.flatten(after))
    )
    return {
        "rel_diff": diff / change,
        "change": change,
        "monitor_keys": keys,
        "save_diff": save_diff,
        "loaded_type": type(loaded).__name__,
    }


def checkpointing(name: str) -> dict:
    """`enable_checkpointing(model, "auto")` against the plain model.

    Returns `loss_diff`, `grad_rel_diff` (max |g - g_plain| over the
    largest plain gradient) and the report.
    """
    client = CLIENTS[name]
    data = client.fit_data(client.batch)
    keras.backend.clear_session()
    plain = client.model()
    plain.compile(**compile_kwargs(client))
    loss0, g0 = loss_grads(plain, data)
    keras.backend.clear_session()
    model = client.model()
    model.compile(**compile_kwargs(client))
    report = tfmemopt.enable_checkpointing(model, "auto")
    loss1, g1 = loss_grads(model, data)
    scale = max(float(np.max(np.abs(g))) for g in g0)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(g0, g1))
    return {
        "loss_diff": abs(loss0 - loss1),
        "grad_rel_diff": diff / scale,
        "report": report,
    }


def step_peak(
    name: str, mode: str, batch: int | None = None, jit_compile=False
) -> int:
    """Peak bytes above the baseline of one training step (median of 3).

    Run it in a fresh process per (client, mode): TensorFlow's allocator
    keeps what an earlier model freed. `jit_compile=True`: the step
    compiled with XLA, TensorFlow's CPU allocator grown first (XLA's few
    large buffers then count at their own sizes, as a GPU counts them;
    docs/xla.md).
    """
    from tfmemopt.memory import measure_peak

    if jit_compile:
        grown = tf.raw_ops.Empty(shape=[1 << 30], dtype=tf.float32, init=False)
        del grown
    client = CLIENTS[name]
    batch = batch or client.ckpt_batch or client.peak_batch
    data = client.fit_data(batch)
    x, y, sw = keras.utils.unpack_x_y_sample_weight(data)
    model = client.model()
    model.compile(
        **compile_kwargs(client, keras.optimizers.SGD(0.01)),
        jit_compile=jit_compile,
    )
    if mode == "ckpt":
        tfmemopt.enable_checkpointing(model, "auto")
    elif mode != "plain":
        raise ValueError(f"mode must be 'plain' or 'ckpt', got {mode!r}")
    model.train_on_batch(x, y, sample_weight=sw)  # trace
    peaks = []
    for _ in range(3):
        peak, _ = measure_peak(
            lambda: model.train_on_batch(x, y, sample_weight=sw)
        )
        peaks.append(peak)
    return int(np.median(peaks))
