"""How close AdamW8bit with accumulation stays to whole-batch training: the
bound docs/optimizers.md states ("Accumulation and 8-bit state").

The accumulated gradient equals the whole batch's up to float rounding
(Keras's AdamW carries that: ~1e-4 of the displacement after one update,
less after); AdamW8bit may flip a moment's 8-bit code on that rounding, and
the flip moves the moment by one step of the map. The bound stated there,
over the first 32 updates, is 2e-2 of the displacement (measured with
`benchmarks/accumulation_8bit.py`: at most 1.0e-2 over 5 seeds, and two
whole-batch runs that differ only in summation order land as far apart).
This is that benchmark's model and data, seed 2 (a code flips at the
third update).

A constant factor on the gradient (the sum for the mean) cancels in Adam's
m / sqrt(v), so the controls here break the window's direction instead: one
micro-batch counted twice, or the last one dropped. Both must land well
outside the bound, or the bound tells nothing.
"""

import keras
import numpy as np
import pytest

import tfmemopt
from tfmemopt.optimizers import AdamW8bit

N = 4
BATCH = 64
SAMPLES = 512
UPDATES = 32
BOUND_8BIT = 2e-2  # docs/optimizers.md, up to 32 updates
BOUND_FLOAT = 2e-4  # float32 rounding of the weights, Keras AdamW


def data(seed=2):
    rng = np.random.default_rng(100 + seed)
    x = rng.normal(size=(SAMPLES, 32)).astype("float32")
    teacher = rng.normal(size=(32, 10)).astype("float32")
    y = np.argmax(x @ teacher + rng.normal(size=(SAMPLES, 10)), axis=1)
    return x, y


def build(seed=2):
    # the two hidden kernels (4096 and 16384 values) get 8-bit moments at
    # the default min_8bit_size and block_size; the rest keep float32
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((32,))
    h = keras.layers.Dense(128, activation="relu")(inputs)
    h = keras.layers.Dense(128, activation="relu")(h)
    return inputs, keras.layers.Dense(10)(h)


class Trajectory(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append(self.model.get_weights())


def train(optimizer, steps=1, sample_weight=None):
    keras.backend.clear_session()
    model = tfmemopt.Model(*build(), accumulation_steps=steps)
    w0 = model.get_weights()
    model.compile(optimizer(), keras.losses.SparseCategoricalCrossentropy(True))
    x, y = data()
    path = Trajectory()
    model.fit(x, y, sample_weight=sample_weight, batch_size=BATCH,
              epochs=UPDATES * BATCH // SAMPLES, shuffle=False, verbose=0,
              callbacks=[path])  # fmt: skip
    assert int(model.optimizer.iterations) == UPDATES
    return w0, path.weights


def distances(run, full, w0):
    """max |w - w_full| / max |w_full - w_init| after each update."""
    out = []
    for w, ref in zip(run, full):
        moved = max(np.abs(a - b).max() for a, b in zip(ref, w0))
        out.append(max(np.abs(a - b).max() for a, b in zip(w, ref)) / moved)
    return np.array(out)


def micro_batch_weights(first, last):
    """Per-sample weights that scale the first and the last micro-batch of
    every window (a whole-batch run that mimics a broken window)."""
    w = np.ones(SAMPLES, "float32").reshape(-1, N, BATCH // N)
    w[:, 0], w[:, -1] = first, last
    return w.reshape(-1)


@pytest.fixture(scope="module")
def runs_8bit():
    def make():
        return AdamW8bit(1e-3)

    w0, full = train(make)
    _, acc = train(make, steps=N)
    _, twice = train(make, sample_weight=micro_batch_weights(2.0, 1.0))
    _, dropped = train(make, sample_weight=micro_batch_weights(1.0, 0.0))
    return w0, full, acc, twice, dropped


def test_adamw8bit_accumulation_within_the_stated_bound(runs_8bit):
    w0, full, acc, _, _ = runs_8bit
    d = distances(acc, full, w0)
    assert d.max() <= BOUND_8BIT, d  # measured 1.06e-2


@pytest.mark.parametrize("control", ["micro_batch_twice", "last_dropped"])
def test_a_broken_window_lands_outside_the_bound(runs_8bit, control):
    w0, full, _, twice, dropped = runs_8bit
    run = twice if control == "micro_batch_twice" else dropped
    d = distances(run, full, w0)
    assert d[-1] >= 10 * BOUND_8BIT, d  # measured 0.50 and 0.81


def test_keras_adamw_accumulation_equals_whole_batch_to_rounding():
    def make():
        return keras.optimizers.AdamW(1e-3)

    w0, full = train(make)
    _, acc = train(make, steps=N)
    d = distances(acc, full, w0)
    assert d.max() <= BOUND_FLOAT, d
    # the relative distance falls as the displacement grows: rounding of
    # the weights, not a drift
    assert d[-1] <= d[0] / 4, d
