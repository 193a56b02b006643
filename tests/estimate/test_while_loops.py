"""Recurrent layers' while loops in the estimator (estimate/_while_loops)."""

import keras
import pytest

from tfmemopt import estimate_memory
from tfmemopt.estimate import CPU_STATS_MIN_BYTES

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


def test_loop_lists_under_the_floor_count_by_element():
    # A loop's TensorList holds one allocation per time step. Under
    # `min_counted_bytes` each element is counted or not on its own size:
    # here every element is below 256 KiB although each list is 2 MiB.
    T, F, U = 64, 8, 16
    inp = keras.Input((T, F))
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.LSTM(U)(inp)))
    every = estimate_memory(model, 512)
    per_step = (7 * U + F) * 512 * F32  # 32 KiB per gate, 16 KiB input
    assert dict(every.layers)["lstm"] == T * per_step + 512 * U * F32 + 8
    seen = estimate_memory(model, 512, min_counted_bytes=CPU_STATS_MIN_BYTES)
    assert dict(seen.layers)["lstm"] == 0
    # Batch 4096: the seven (4096, 16) float32 elements per step are 256
    # KiB, counted (and the one-element output list); the step's input,
    # (4096, 8), 128 KiB, is not.
    big = estimate_memory(model, 4096, min_counted_bytes=CPU_STATS_MIN_BYTES)
    gates = T * 7 * U * 4096 * F32
    assert dict(big.layers)["lstm"] == gates + 4096 * U * F32
