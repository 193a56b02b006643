"""The out-of-memory report: tfmemopt.Model.fit and oom_report()."""

from __future__ import annotations

import pickle

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfmemopt
from tfmemopt.tuning._oom import OutOfMemoryError
from tfmemopt.tuning._oom import build_report
from tfmemopt.tuning._oom import fit_batch_size
from tfmemopt.tuning._oom import is_oom
from tfmemopt.tuning._planner import MARGIN


class OOMAtRuntime(keras.layers.Layer):
    """Raises ResourceExhaustedError when run on more than `threshold` rows.

    The check runs in the step (a py_function), not when traced, so the
    estimator can still trace the model at the failing batch size.
    """

    def __init__(self, threshold, **kwargs):
        super().__init__(**kwargs)
        self.threshold = threshold

    def call(self, x):
        def check(n):
            if int(n) > self.threshold:
                # py_function turns MemoryError into ResourceExhaustedError.
                raise MemoryError(
                    f"OOM when allocating tensor with shape[{int(n)},64]"
                )
            return np.float32(0)

        zero = tf.py_function(check, [tf.shape(x)[0]], tf.float32)
        return x + tf.reshape(zero, ())


def layers(threshold=None, width=64):
    inputs = keras.Input((32,))
    h = keras.layers.Dense(width, activation="relu")(inputs)
    if threshold is not None:
        h = OOMAtRuntime(threshold)(h)
    return inputs, keras.layers.Dense(1)(h)


def data(n=64):
    rng = np.random.default_rng(0)
    return (
        rng.normal(size=(n, 32)).astype("float32"),
        rng.normal(size=(n, 1)).astype("float32"),
    )


def test_forced_oom_in_tfmemopt_model_fit_raises_the_report():
    model = tfmemopt.Model(*layers(threshold=16))
    model.compile("adam", "mse")
    x, y = data()
    with pytest.raises(OutOfMemoryError, match="Out of memory on CPU:0") as e:
        model.fit(x, y, batch_size=64, verbose=0)
    assert isinstance(e.value, tf.errors.ResourceExhaustedError)
    report = e.value.report
    assert report.batch_size == 64
    assert "OOM when allocating tensor with shape[64,64]" in report.error
    text = str(e.value)
    assert "batch size: 64" in text
    assert "device memory at failure" in text
    assert "estimated need" in text and "activations kept" in text
    assert report.estimate.settings["batch_size"] == 64
    # The model is usable afterwards at a batch that fits.
    history = model.fit(x, y, batch_size=16, verbose=0)
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_the_report_says_which_regime_the_step_ran_in(jit_compile):
    """#46, #49: the report says which regime the step ran in; under XLA
    the estimate is read from XLA's compiled step, and says so (a layer
    XLA cannot compile, such as the test's `py_function` that raises the
    OOM, gets the executor's estimate: see test_oom_in_xla_... below)."""
    model = tfmemopt.Model(*layers())
    model.compile("adam", "mse", jit_compile=jit_compile)
    error = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating")
    report = build_report(error, model, batch_size=64)
    assert report.regime == ("xla" if jit_compile else "graph")
    if jit_compile:
        assert "step ran under: XLA (jit_compile=True)" in report.text
        assert "buffer assignment of the compiled step" in report.text
        assert report.estimate.compiled["temporary"] > 0
    else:
        assert "step ran under: TensorFlow's graph executor" in report.text
        assert "model the graph executor" not in report.text
    uncompiled = build_report(error, tfmemopt.Model(*layers(threshold=16)), 64)
    assert uncompiled.regime is None and "step ran under" not in uncompiled.text


def test_a_step_xla_cannot_compile_gets_the_executors_estimate():
    model = tfmemopt.Model(*layers(threshold=16))  # a py_function inside
    model.compile("adam", "mse", jit_compile=True)
    error = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating")
    report = build_report(error, model, batch_size=64)
    assert not report.estimate.compiled
    assert "model the graph executor" in report.text
    assert any("not compiled with XLA here" in n for n in report.estimate.notes)


@pytest.mark.parametrize(
    "kwargs, steps",
    [(dict(accumulation_steps=2), 2), (dict(micro_batch_size=32), 2)],
)
def test_the_estimate_is_of_the_models_own_accumulation(kwargs, steps):
    # Micro-batches of 32 still fail at 16 rows: the estimate is of the
    # step that ran, not of one without accumulation.
    model = tfmemopt.Model(*layers(threshold=16), **kwargs)
    model.compile("adam", "mse")
    x, y = data()
    with pytest.raises(OutOfMemoryError) as e:
        model.fit(x, y, batch_size=64, verbose=0)
    assert e.value.report.estimate.settings["accumulation_steps"] == steps
    assert f"accumulation_steps={steps}" in str(e.value)


@pytest.mark.parametrize(
    "batch, replicas, micro, steps",
    [
        (64, 1, 16, 4),  # divides: exact
        (64, 1, 24, 2),  # 24 + 24 + 16 ran; estimated as 32 x 2
        (96, 2, 40, 1),  # 40 + 8 per replica; estimated as 48
        (10, 4, 1, 3),  # the largest replica has 3 samples
    ],
)
def test_micro_batch_size_is_estimated_no_smaller(
    batch, replicas, micro, steps
):
    from tfmemopt.estimate._settings import own_accumulation

    model = tfmemopt.Model(*layers(), micro_batch_size=micro)
    assert own_accumulation(model, batch, replicas) == steps
    per_replica = -(-batch // replicas)
    assert -(-per_replica // steps) >= min(micro, per_replica)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(batch_size=-1), ValueError, "batch_size"),
        (dict(batch_size=8.0), TypeError, "batch_size"),
        (dict(memory_budget="lots"), ValueError, "memory_budget"),
        (dict(replicas=0), ValueError, "replicas"),
        (dict(device=0), TypeError, "device"),
    ],
)
def test_bad_arguments_are_refused_when_the_block_starts(kwargs, error, match):
    ran = []
    with pytest.raises(error, match=match):
        with tfmemopt.oom_report(**kwargs):
            ran.append(True)
    assert not ran


def test_oom_report_around_keras_fit_plans_what_fits():
    model = keras.Model(*layers(threshold=16, width=1024))
    model.compile("adam", "mse")
    x, y = data()
    full = tfmemopt.estimate_memory(model, 64)
    state = full.parameters + full.gradients + full.optimizer_state
    # Below the whole batch's estimate, above what the plan's margin
    # (MARGIN of the budget) leaves for a split batch.
    budget = state + 3 * (full.total - state) // 4
    with pytest.raises(OutOfMemoryError) as e:
        with tfmemopt.oom_report(model, batch_size=64, memory_budget=budget):
            model.fit(x, y, batch_size=64, verbose=0)
    report = e.value.report
    assert report.plan is not None, report.plan_error
    plan = report.plan
    assert plan.global_batch_size == 64
    assert plan.micro_batch_size * plan.accumulation_steps == 64
    assert plan.accumulation_steps > 1
    assert plan.estimated_peak <= (1 - MARGIN) * budget < full.total
    assert "plan that would fit" in str(e.value)
    assert "accumulation_steps=" in str(e.value)
    assert e.value.__cause__ is not None  # raised from TensorFlow's error


def test_without_a_model_the_report_says_what_to_pass():
    with pytest.raises(OutOfMemoryError, match="pass `model` and `batch_size`"):
        with tfmemopt.oom_report():
            raise tf.errors.ResourceExhaustedError(None, None, "OOM here")


def test_a_peak_of_zero_at_the_failure_is_said(monkeypatch):
    # On CPU an error raised before anything was allocated (the trial's
    # simulated OOM) left a peak of 0: "no memory budget" said nothing of it.
    from tfmemopt import memory
    from tfmemopt.tuning._oom import build_report

    monkeypatch.setattr(
        memory, "device_memory", lambda device: {"current": 0, "peak": 0}
    )
    model = tfmemopt.Model(*layers())
    model.compile("adam", "mse")
    error = tf.errors.ResourceExhaustedError(None, None, "OOM here")
    report = build_report(error, model, batch_size=64, device="CPU:0")
    assert report.plan is None and report.estimate is not None
    assert "peak at the failure reads 0 bytes" in report.plan_error
    assert "pass `memory_budget`" in report.plan_error


def test_other_errors_pass_through_untouched():
    with pytest.raises(ValueError, match="not memory"):
        with tfmemopt.oom_report():
            raise ValueError("not memory")


def test_is_oom():
    assert is_oom(tf.errors.ResourceExhaustedError(None, None, "x"))
    assert is_oom(tf.errors.InternalError(None, None, "CUDA out of memory"))
    assert not is_oom(tf.errors.InternalError(None, None, "bad kernel"))
    assert not is_oom(tf.errors.InvalidArgumentError(None, None, "OOM?"))
    assert not is_oom(MemoryError("host"))


def test_fit_batch_size():
    x = np.zeros((10, 2))
    ds = tf.data.Dataset.from_tensor_slices((x, x)).batch(5)
    assert fit_batch_size((x, x), {"batch_size": 8}) == 8
    assert fit_batch_size((x, x, 4), {}) == 4
    assert fit_batch_size((x, x), {}) == 32  # Keras's default
    assert fit_batch_size((ds,), {}) is None  # last batch may be short
    fixed = (
        ds.batch(5, drop_remainder=True).unbatch().batch(5, drop_remainder=True)
    )
    assert fit_batch_size((fixed,), {}) == 5


def test_the_error_pickles_with_its_report():
    with pytest.raises(OutOfMemoryError) as e:
        with tfmemopt.oom_report(batch_size=8):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM now")
    again = pickle.loads(pickle.dumps(e.value))
    assert again.report.batch_size == 8
    assert "OOM now" in str(again)
