"""Keras's weight decay in the estimate (#23): the decay runs before the
gradients are made, and copies a weight whose forward read the backward
pass still holds (copy-on-write in `AssignSubVariableOp`)."""

from __future__ import annotations

import keras
import pytest
from conftest import run_in_subprocess

import tfmemopt
from tfmemopt import estimate_memory
from tfmemopt.estimate._update import decayed_early

MIB = 2**20


def _weights():
    layer = keras.layers.Dense(8)
    layer.build((None, 4))
    return [layer.kernel, layer.bias]


def _decayed(optimizer, accumulating=False, replicas=1, sharded=False):
    rule = decayed_early(
        optimizer, accumulating, replicas, lambda v: 100, sharded=sharded
    )
    return None if rule is None else rule(_weights())


def test_only_an_optimizer_with_weight_decay_copies():
    assert _decayed(keras.optimizers.Adam()) is None
    assert _decayed(keras.optimizers.SGD(momentum=0.9)) is None
    assert _decayed(keras.optimizers.AdamW()) == [100, 100]
    assert _decayed(keras.optimizers.Adam(weight_decay=0.01)) == [100, 100]


def test_excluded_variables_are_not_copied():
    opt = keras.optimizers.AdamW()
    opt.exclude_from_weight_decay(var_names=["bias"])
    assert _decayed(opt) == [100, 0]


@pytest.mark.parametrize(
    "make, kwargs",
    [
        # the inner apply runs in a cond on the gradients' finiteness
        (
            lambda: keras.optimizers.LossScaleOptimizer(
                keras.optimizers.AdamW()
            ),
            {},
        ),
        # the window's apply waits for its micro-steps
        (
            lambda: tfmemopt.AccumulatingOptimizer(keras.optimizers.AdamW(), 2),
            {},
        ),
        (keras.optimizers.AdamW, {"accumulating": True}),
        (keras.optimizers.AdamW, {"replicas": 2}),
        (keras.optimizers.AdamW, {"sharded": True}),
    ],
)
def test_a_decay_that_waits_for_the_gradients_copies_nothing(make, kwargs):
    assert _decayed(make(), **kwargs) is None


def test_tfmemopt_optimizers_copy_the_float32_weights_keras_decays():
    assert _decayed(tfmemopt.optimizers.AdamW8bit()) == [100, 100]
    # A 16-bit weight's decay is folded into the compiled update.
    layer = keras.layers.Dense(8, dtype="bfloat16")
    layer.build((None, 4))
    opt = tfmemopt.optimizers.AdamW8bit(bf16_update="stochastic")
    rule = decayed_early(opt, False, 1, lambda v: 100)
    assert rule([layer.kernel, layer.bias]) == [0, 0]


def _mlp(first_only=False):
    inp = keras.Input((256,))
    x = keras.layers.Dense(1024, activation="relu")(inp)
    if not first_only:
        x = keras.layers.Dense(1024, activation="relu")(x)
    return keras.Model(inp, keras.layers.Dense(10)(x))


def test_a_weight_the_backward_pass_reads_is_counted_twice():
    # The second 1024x1024 kernel (4 MiB) is read by its input's gradient
    # (the first layer is trained): AdamW copies it at the step's start.
    adam = estimate_memory(_mlp(), 8, optimizer="adam")
    adamw = estimate_memory(_mlp(), 8, optimizer="adamw")
    extra = adamw.total - adam.total
    # The copy is alive at AdamW's peak; Adam's peak, without it, may come
    # at another moment, so the totals can differ by less than the copy
    # (2 MiB since an update frees its gradient before its second
    # temporary beside the backward pass).
    assert 2 * MIB <= extra <= 6 * MIB, extra / MIB
    copied = [note for note in adamw.notes if "copy-on-write" in note]
    assert copied and "4.0 MiB at the step's peak" in copied[0], copied
    assert not any("copy-on-write" in note for note in adam.notes)


def test_a_weight_no_backward_op_reads_is_not_copied():
    # The first layer's kernel: the gradient of the model's input is
    # pruned, so its read is freed in the forward pass; the 1024x10
    # kernel's copy is below the CPU view's 256 KiB floor.
    adam = estimate_memory(_mlp(first_only=True), 8, optimizer="adam")
    adamw = estimate_memory(_mlp(first_only=True), 8, optimizer="adamw")
    assert adamw.total == adam.total


def test_excluding_the_weights_from_decay_removes_the_copy():
    opt = keras.optimizers.AdamW()
    opt.exclude_from_weight_decay(var_names=["kernel", "bias"])
    adam = estimate_memory(_mlp(), 8, optimizer="adam")
    assert estimate_memory(_mlp(), 8, optimizer=opt).total == adam.total


_MEASURE = """
import statistics
import keras, numpy as np
import tfmemopt
from tfmemopt.memory import device_memory, reset_peak

def mlp():
    inp = keras.Input((256,))
    x = keras.layers.Dense(2048, activation="relu")(inp)
    x = keras.layers.Dense(2048, activation="relu")(x)
    return tfmemopt.Model(inp, keras.layers.Dense(10)(x))

out = []
for name in ("adam", "adamw"):
    keras.utils.set_random_seed(0)
    base = device_memory()["current"]
    model = mlp()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(name, loss)
    rng = np.random.default_rng(0)
    x = rng.random((2048, 256), dtype="float32")
    y = rng.integers(0, 10, size=(2048,)).astype("int32")
    model.train_on_batch(x, y)
    peaks = []
    for _ in range(5):
        reset_peak()
        model.train_on_batch(x, y)
        peaks.append(device_memory()["peak"] - base)
    est = tfmemopt.estimate_memory(mlp(), 2048, optimizer=name)
    out.append([statistics.median(peaks), est.total])
    del model
emit(out)
"""


@pytest.mark.slow
def test_the_copy_is_estimated_within_the_measured_peak():
    """The step's peak on CPU in a fresh process, Adam then AdamW, on an
    MLP whose 2048x2048 kernel (16 MiB) the backward pass reads, at batch
    2048. Whether the copy meets the peak depends on timing: on a quiet
    machine AdamW measured 152.0 MiB against Adam's 136.0 (estimated 152.3
    and 136.3); in a CI run beside another test worker 134.0 against
    136.0. So the estimate keeps the copy (`adamw_est - adam_est`), and is
    checked against the measured AdamW peak with room for either."""
    (adam, adam_est), (adamw, adamw_est) = run_in_subprocess(_MEASURE, n_cpus=1)
    kernel = 2048 * 2048 * 4
    assert adamw_est - adam_est >= 0.9 * kernel, (adam_est, adamw_est)
    assert abs(adamw_est - adamw) <= 0.15 * adamw, (adamw_est, adamw)
    assert abs(adam_est - adam) <= 0.15 * adam, (adam_est, adam)
