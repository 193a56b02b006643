"""Weights saved by a `tfmemopt.Model` load into a plain `keras.Model` of the
same architecture (deployment without tfmemopt). With random layers, the
saved seed states (`seed_<i>`, which make dropout resume exactly) are
entries a plain Keras model does not expect: it loads them with
`skip_mismatch=True`, as docs/pitfalls.md says."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import tfmemopt


def build(cls, dropout):
    keras.utils.set_random_seed(0)
    i = keras.Input((4,))
    h = keras.layers.Dense(8, name="d0")(i)
    if dropout:
        h = keras.layers.Dropout(0.3, name="drop")(h)
    return cls(i, keras.layers.Dense(2, name="d1")(h))


def trained(dropout, path):
    m = build(tfmemopt.Model, dropout)
    m.compile("adam", "mse")
    m.fit(np.ones((8, 4)), np.ones((8, 2)), verbose=0)
    m.save_weights(path)
    return m


def max_diff(a, b):
    return max(
        float(np.abs(x - y).max())
        for x, y in zip(a.get_weights(), b.get_weights())
    )


def test_without_random_layers_plain_keras_loads_as_is(tmp_path):
    path = str(tmp_path / "w.weights.h5")
    m = trained(False, path)
    plain = build(keras.Model, False)
    plain.load_weights(path)
    assert max_diff(plain, m) == 0.0


def test_with_dropout_plain_keras_needs_skip_mismatch(tmp_path):
    path = str(tmp_path / "w.weights.h5")
    m = trained(True, path)
    plain = build(keras.Model, True)
    with pytest.raises(ValueError, match="expected 0 variables"):
        plain.load_weights(path)
    plain = build(keras.Model, True)
    with pytest.warns(UserWarning, match="could not be loaded"):
        plain.load_weights(path, skip_mismatch=True)
    assert max_diff(plain, m) == 0.0
