"""Compiled metrics in the estimate (#47, item 4).

Keras's step (and `tfmemopt.Model`'s micro-step) updates the compiled
metrics from the model's output after the gradient, so on a language
model's logits the logits stay alive through the backward pass, beside the
metric's own temporaries (Keras's TensorFlow `argmax`, for its
flush-to-zero fix, makes output-sized ones). keras-hub compiles its causal
LMs with `SparseCategoricalAccuracy` when it makes them: the estimate of a
plain keras-hub LM was about half its `fit` step (Llama, 1 x 2048 tokens:
684 MiB estimated, 1336 measured) until the metrics were traced.
"""

import keras
import pytest
from conftest import run_in_subprocess

import tfmemopt

VOCAB, T, B = 2000, 128, 16

_MEASURE = """
import sys
sys.path.insert(0, "tests")  # the test module imports conftest
import gc, keras, numpy as np, tensorflow as tf, tfmemopt
from tfmemopt.memory import device_memory, reset_peak
from tests.estimate.test_estimate_metrics import lm
x = np.random.default_rng(0).integers(0, {vocab}, ({b}, {t})).astype("int32")
out = {{}}
for metrics in ([], ["sparse_categorical_accuracy"]):
    keras.backend.clear_session()
    gc.collect()
    tf.constant(0.0) + 1.0
    # From before the model is built: weights and state in, as the
    # estimate's total counts them.
    base = device_memory()["current"]
    model = lm(metrics)
    model.train_on_batch(x, x)
    peaks = []
    for _ in range(3):
        reset_peak()
        model.train_on_batch(x, x)
        peaks.append(device_memory()["peak"] - base)
    out[str(metrics)] = (
        sorted(peaks)[1],
        tfmemopt.estimate_memory(model, {b}).total,
    )
    del model
emit(out)
"""


def lm(metrics=(), weighted_metrics=None):
    """The fresh-user trial's model: [16, 128, 2000] logits."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 32)(inputs)
    a = keras.layers.MultiHeadAttention(4, 8)(h, h, use_causal_mask=True)
    model = keras.Model(inputs, keras.layers.Dense(VOCAB)(h + a))
    model.compile(
        "adam",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=list(metrics),
        weighted_metrics=weighted_metrics,
    )
    return model


@pytest.mark.slow
def test_the_estimate_counts_what_a_metric_keeps():
    """Measured in a fresh process (a trial: 65.0 MiB with the metric,
    28.0 without, estimated 27.6 for both before the metrics were traced;
    here 62.4 and 22.8, estimated 63.7 and 25.4)."""
    out = run_in_subprocess(
        _MEASURE.format(vocab=VOCAB, b=B, t=T), n_cpus=1, timeout=300
    )
    (plain, plain_est), (metric, metric_est) = (
        out["[]"],
        out["['sparse_categorical_accuracy']"],
    )
    logits = B * T * VOCAB * 4
    assert metric - plain > logits, out  # what the estimate must see
    assert metric_est - plain_est > logits, out
    assert abs(metric_est - metric) <= 0.2 * metric, out
    assert abs(plain_est - plain) <= 0.25 * plain, out


def test_the_metrics_keras_still_runs_after_a_compile_with_none():
    """Keras 3.15 keeps an earlier compile's metrics when `compile` gets
    `weighted_metrics=None` (as keras-hub's tasks, compiled when made,
    meet a user's `compile(..., weighted_metrics=None)`), while the
    compile config says None; the estimate follows the step, and `[]`
    drops them."""
    model = lm(
        weighted_metrics=[keras.metrics.SparseTopKCategoricalAccuracy(2)]
    )
    model.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    assert model.get_compile_config()["weighted_metrics"] is None
    kept = tfmemopt.estimate_memory(model, 2)
    (note,) = [n for n in kept.notes if n.startswith("compiled metrics")]
    assert "sparse_top_k_categorical_accuracy" in note, note
    assert "weighted_metrics=[]" in note, note
    model.compile(
        "adam",
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[],
    )
    dropped = tfmemopt.estimate_memory(model, 2)
    assert not [n for n in dropped.notes if "compiled metrics" in n]
    assert dropped.total < kept.total


def test_a_plan_with_chunked_loss_drops_the_metrics_and_says_so():
    """`chunked_loss` never forms the logits a compiled metric reads, and
    its first fit refuses metrics: a plan that chose it on a model
    compiled with one (every keras-hub causal LM as made) failed when
    applied. The plan now compiles without them, in `why` and a warning."""
    import inspect

    import numpy as np

    margin = inspect.signature(tfmemopt.plan).parameters["margin"].default
    model = lm(["sparse_categorical_accuracy"])
    chunked = tfmemopt.estimate_memory(model, 4, chunked_loss=True)
    budget = int(chunked.total * 1.02 / (1 - margin))
    p = tfmemopt.plan(model, 4, budget, allow=("long_sequences",))
    assert p.chunked_loss, p
    assert "compiled without its metrics, sparse_categorical_accuracy" in p.why
    with pytest.warns(UserWarning, match="compiled without them"):
        applied = p.apply(model)
    x = np.random.default_rng(0).integers(0, VOCAB, (4, T)).astype("int32")
    logs = applied.train_on_batch(x, x, return_dict=True)
    assert set(logs) == {"loss"}, logs
