"""Recurrent layers' while loops in the estimator (estimate/_while_loops)."""

import keras
import pytest

from tfmemopt import estimate_memory

F32 = 4


def test_lstm_loop_is_sized_from_its_accumulators():
    T, F, U, B = 20, 8, 16, 32
    inp = keras.Input((T, F))
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.LSTM(U)(inp)))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = estimate_memory(model, B)
    # Keras's tape: per time step the four gate activations, tanh(c), the
    # previous h and c, and the step's input (its accumulator, for the
    # kernel's gradient); plus the one-element output list. The unstacked
    # input list is read only by the gradient of the model's input, which
    # is pruned before the step runs.
    per_step = (7 * U + F) * B * F32
    assert dict(est.layers)["lstm"] == T * per_step + B * U * F32 + 8
    assert not any("time steps" in n for n in est.notes)  # no rule needed
    # tfmemopt.Model's step takes one gradient of one loss with a
    # non-persistent tape, as Keras does: the loop costs the same.
    tfm = estimate_memory(model, B, trainer="tfmemopt")
    assert tfm.settings["trainer"] == "tfmemopt"
    assert tfm.total == est.total


def test_unknown_trainer_is_refused():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="trainer='keras'"):
        estimate_memory(model, 8, trainer="jax")
