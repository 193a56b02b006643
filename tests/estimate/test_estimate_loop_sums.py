"""Grappler's rewrite of large gradient sums, and the accumulation
window's loop (#23): the micro-steps of `tfmemopt.Model` run as the body
of a while loop, where Grappler's memory optimizer rewrites no sum."""

from __future__ import annotations

import keras
import pytest
from conftest import run_in_subprocess

import tfmemopt
from tfmemopt.estimate import CPU_STATS_MIN_BYTES
from tfmemopt.estimate._step_graph import trace_step

MIB = 2**20


def _sliced():
    """A `TimeDistributed` layer over 100 steps after a trained layer: the
    input's gradient sums 100 slices' gradients, each [batch, 100, 256]
    (3.1 MiB at batch 32), about 310 MiB at once."""
    inp = keras.Input((100, 16))
    x = keras.layers.Dense(256)(inp)
    dense = keras.layers.TimeDistributed(keras.layers.Dense(16))
    return keras.Model(inp, dense(x))


def test_a_step_in_a_loop_has_no_grappler_peak_to_rewrite_by():
    model = _sliced()
    plain = trace_step(model, 32, min_counted_bytes=CPU_STATS_MIN_BYTES)
    looped = trace_step(
        model, 32, min_counted_bytes=CPU_STATS_MIN_BYTES, in_loop=True
    )
    assert plain.grappler_peak > 0.8 * 256 * MIB  # the rewrite's threshold
    assert looped.grappler_peak == 0
    # the sum's 100 inputs alive together, not added as they come
    assert looped.peak - plain.peak > 150 * MIB


def test_the_window_keeps_the_sum_the_plain_step_rewrites():
    model = _sliced()
    model.compile("adam", "mse")
    floor = CPU_STATS_MIN_BYTES
    plain = tfmemopt.estimate_memory(model, 32, min_counted_bytes=floor)
    window = tfmemopt.estimate_memory(
        model, 128, accumulation_steps=4, min_counted_bytes=floor
    )
    assert any("Grappler rewrites" in note for note in plain.notes)
    assert not any("Grappler rewrites" in note for note in window.notes)
    # the 100 slices' gradients alive together: about 310 MiB
    assert window.total - plain.total > 150 * MIB


_MEASURE = """
import keras, numpy as np
import tfmemopt
from tfmemopt.memory import device_memory, reset_peak
from tfmemopt.estimate import CPU_STATS_MIN_BYTES

def layers():
    inp = keras.Input((100, 16))
    x = keras.layers.Dense(256)(inp)
    return inp, keras.layers.TimeDistributed(keras.layers.Dense(16))(x)

out = []
for batch, steps in ((128, 4),):
    keras.utils.set_random_seed(0)
    base = device_memory()["current"]
    model = tfmemopt.Model(*layers(), accumulation_steps=steps)
    model.compile("adam", "mse")
    rng = np.random.default_rng(0)
    x = rng.random((batch, 100, 16), dtype="float32")
    y = rng.random((batch, 100, 16), dtype="float32")
    model.train_on_batch(x, y)
    peaks = []
    for _ in range(3):
        reset_peak()
        model.train_on_batch(x, y)
        peaks.append(device_memory()["peak"] - base)
    plain = keras.Model(*layers())
    plain.compile("adam", "mse")
    est = tfmemopt.estimate_memory(
        plain, batch, accumulation_steps=steps,
        min_counted_bytes=CPU_STATS_MIN_BYTES,
    )
    out.append([max(peaks), est.total])
    del model
emit(out)
"""


@pytest.mark.slow
def test_the_window_measures_what_it_is_estimated_at():
    """On CPU in a fresh process, 4 micro-batches of 32: measured 325-329
    MiB, the 100 slices' gradients alive together (estimated 323.2; the
    LSTM autoencoder of the twelfth held-out set, the same pattern, was
    estimated at 155.7 MiB with the rewrite and measured 342.6). The plain
    step at batch 32 measured 153-315 MiB in different processes: whether
    Grappler rewrites its sum is not fixed, so it is not asserted."""
    ((window, estimate),) = run_in_subprocess(_MEASURE, n_cpus=1)
    slices = 100 * 32 * 100 * 256 * 4  # 100 gradients of [32, 100, 256]
    assert window > 0.8 * slices, window / MIB
    assert abs(estimate - window) <= 0.12 * window, (estimate, window)
