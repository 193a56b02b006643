"""The one clipping (`tfmemopt.distribute._gradients.clip`) clips as Keras.

`tfmemopt.Model` (clipping after the all-reduce) and `ShardedOptimizer`
(clipping each replica's partition of the summed gradient with the norms of
the whole sums) both call `clip`; here it is compared with what Keras's own
optimizer does to the same gradients, read through the public API: SGD with
learning rate 1 from zero weights leaves `-clipped(g)` in the weights.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfmemopt.distribute import _gradients

# Large and small gradients, a zero one and a missing one.
GRADS = [
    np.array([[3.0, -4.0], [12.0, 0.5]], np.float32),
    np.array([0.1, -0.2, 0.05], np.float32),
    np.zeros((2,), np.float32),
    None,
    np.array([-7.0], np.float32),
]
SETTINGS = [
    ("clipnorm", 1.5),
    ("clipnorm", 100.0),
    ("global_clipnorm", 2.0),
    ("global_clipnorm", 100.0),
    ("clipvalue", 0.15),
]


def _keras_clipped(kind, value, grads=GRADS):
    """What Keras's SGD applies for `grads` under the setting."""
    optimizer = keras.optimizers.SGD(1.0, **{kind: value})
    variables = [
        keras.Variable(np.zeros(g.shape, np.float32))
        for g in grads
        if g is not None
    ]
    present = [tf.constant(g) for g in grads if g is not None]
    optimizer.apply_gradients(zip(present, variables))
    out = iter([-v.numpy() for v in variables])
    return [None if g is None else next(out) for g in grads]


def _ours(setting, grads=GRADS, **kwargs):
    clipped = _gradients.clip(
        [None if g is None else tf.constant(g) for g in grads],
        setting,
        **kwargs,
    )
    return [None if c is None else c.numpy() for c in clipped]


def _assert_same(actual, expected, rtol=1e-6):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        if e is None:
            assert a is None
        else:
            np.testing.assert_allclose(a, e, rtol=rtol, atol=1e-7)


@pytest.mark.parametrize(
    "kind, value", SETTINGS, ids=[f"{k}={v}" for k, v in SETTINGS]
)
def test_clip_equals_keras_optimizer(kind, value):
    optimizer = keras.optimizers.SGD(1.0, **{kind: value})
    setting = _gradients.clipping_of(optimizer)
    assert setting == (kind, value)
    _assert_same(_ours(setting), _keras_clipped(kind, value))


@pytest.mark.parametrize(
    "kind, value", SETTINGS, ids=[f"{k}={v}" for k, v in SETTINGS]
)
def test_clip_of_parts_with_whole_norms_equals_whole(kind, value):
    """ShardedOptimizer's use: each replica clips its partition of every
    summed gradient with the sums of squares of the whole gradients."""
    grads = [g for g in GRADS if g is not None]
    whole = _ours((kind, value), grads)
    squares = [_gradients.sum_of_squares(tf.constant(g)) for g in grads]
    halves = [np.array_split(g.reshape(-1), 2) for g in grads]
    for q in range(2):
        part = [h[q] for h in halves]
        clipped = _ours((kind, value), part, squares=squares)
        expected = [np.array_split(w.reshape(-1), 2)[q] for w in whole]
        _assert_same(clipped, expected)


@pytest.mark.parametrize(
    "kind, value", SETTINGS, ids=[f"{k}={v}" for k, v in SETTINGS]
)
def test_clip_of_loss_scaled_gradients(kind, value):
    """Thresholds apply to the unscaled gradients (`LossScaleOptimizer`
    unscales before the inner optimizer clips)."""
    scale = 1024.0
    scaled = [None if g is None else g * scale for g in GRADS]
    clipped = _ours((kind, value), scaled, scale=tf.constant(scale))
    unscaled = [None if c is None else c / scale for c in clipped]
    _assert_same(unscaled, _keras_clipped(kind, value))


def test_options_are_read_in_keras_order():
    """Keras's constructor takes only one option; set as attributes later,
    `clipnorm` wins over `global_clipnorm`, which wins over `clipvalue`,
    in Keras's optimizer and in `clipping_of` alike."""
    for first, later in (
        (("clipnorm", 1.5), ("global_clipnorm", 2.0)),
        (("clipnorm", 1.5), ("clipvalue", 0.15)),
        (("global_clipnorm", 2.0), ("clipvalue", 0.15)),
    ):
        grads = [g for g in GRADS if g is not None]
        optimizer = keras.optimizers.SGD(1.0, **{first[0]: first[1]})
        setattr(optimizer, *later)
        variables = [
            keras.Variable(np.zeros(g.shape, np.float32)) for g in grads
        ]
        optimizer.apply_gradients(
            zip([tf.constant(g) for g in grads], variables)
        )
        assert _gradients.clipping_of(optimizer) == first
        _assert_same(
            _ours(_gradients.clipping_of(optimizer), grads),
            [-v.numpy() for v in variables],
        )
    loss_scaled = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(global_clipnorm=2.0)
    )
    assert _gradients.clipping_of(loss_scaled) == ("global_clipnorm", 2.0)
    assert _gradients.clipping_of(keras.optimizers.SGD()) is None


@pytest.mark.parametrize("kind", ["clipnorm", "global_clipnorm"])
def test_non_finite_gradients_stay_non_finite(kind):
    grads = [tf.constant([1.0, np.inf]), tf.constant([2.0])]
    clipped = _gradients.clip(grads, (kind, 1.0))
    assert float(_gradients.count_non_finite(clipped)) >= 1.0
    assert float(_gradients.count_non_finite(grads)) == 1.0


def test_count_non_finite_reads_sparse_values_and_skips_none():
    sparse = tf.IndexedSlices(
        tf.constant([[np.nan, 1.0]]), tf.constant([0]), tf.constant([3, 2])
    )
    grads = [sparse, None, tf.constant([np.inf, -np.inf, 0.0])]
    assert float(_gradients.count_non_finite(grads)) == 3.0
    assert float(_gradients.count_non_finite([None])) == 0.0
