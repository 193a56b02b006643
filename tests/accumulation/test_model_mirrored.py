"""tfmemopt.Model under MirroredStrategy (two logical CPUs, subprocess):
equal to single-device full-batch Keras, one gradient all-reduce per step."""

import pytest
from conftest import run_in_subprocess

CODE = """
import numpy as np, keras, tfmemopt

strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
reductions = []
original = type(strategy.extended).batch_reduce_to

def counting(self, reduce_op, value_destination_pairs, options=None):
    shapes = [tuple(v.shape) if hasattr(v, "shape") else
              tuple(v.values[0].shape) for v, _ in value_destination_pairs]
    reductions.append(shapes)
    return original(self, reduce_op, value_destination_pairs, options)

type(strategy.extended).batch_reduce_to = counting

def build(cls, **kw):
    keras.utils.set_random_seed(2)
    inp = keras.Input((7,), dtype="int32")
    h = keras.layers.Embedding(12, 6, mask_zero=True)(inp)
    h = keras.layers.Dense(8, activation="tanh",
                           kernel_regularizer=keras.regularizers.L2(0.01))(h)
    return cls(inp, keras.layers.Dense(4)(h), **kw)

rng = np.random.default_rng(3)
x = rng.integers(1, 12, size=(32, 7)).astype("int32")
for i, n in enumerate(rng.integers(1, 8, size=32)):
    x[i, n:] = 0
y = rng.integers(0, 4, size=(32, 7))

def compile_fit(m, scope):
    with scope:
        m.compile(keras.optimizers.SGD(0.5, momentum=0.5),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    w0 = [w.numpy() for w in m.trainable_weights]
    h = m.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return w0, [w.numpy() for w in m.trainable_weights], h.history["loss"]

import contextlib
w0, ref, ref_loss = compile_fit(build(keras.Model), contextlib.nullcontext())
with strategy.scope():
    ours_model = build(tfmemopt.Model, accumulation_steps=4)
reductions.clear()
_, ours, ours_loss = compile_fit(ours_model, strategy.scope())
n_vars = len(ours_model.trainable_weights)
gradient_reductions = [r for r in reductions if len(r) == n_vars]
emit({
    "diff": max(float(np.abs(a - b).max()) for a, b in zip(ref, ours)),
    "change": max(float(np.abs(a - b).max()) for a, b in zip(ref, w0)),
    "largest": max(float(np.abs(a).max()) for a in ref),
    "losses": [ref_loss, ours_loss],
    "traced_reductions": reductions,
    "gradient_reductions": len(gradient_reductions),
    "train_traces": 1,
})
"""


@pytest.fixture(scope="module")
def result():
    return run_in_subprocess(CODE, n_cpus=2, timeout=600)


@pytest.mark.slow
def test_mirrored_equals_single_device_full_batch(result):
    r = result
    assert r["change"] > 0.05, r
    floor = 4 * 2.0**-23 * max(r["largest"], 1.0)
    assert r["diff"] <= max(1e-6 * r["change"], floor), r
    ref_loss, ours_loss = r["losses"]
    for a, b in zip(ref_loss, ours_loss):
        assert abs(a - b) <= 1e-5 * abs(a), r["losses"]


@pytest.mark.slow
def test_exactly_one_gradient_all_reduce_per_step(result):
    # batch_reduce_to runs while the train function is traced (once here:
    # every batch has 16 samples), so what it saw is what each step runs.
    assert result["gradient_reductions"] == 1, result["traced_reductions"]
    # The rest are scalars: the global batch size and the masked loss's
    # valid-entry count, so the normalisers are exact across replicas.
    others = [r for r in result["traced_reductions"] if len(r) != 5]
    assert others and all(all(s == [] for s in r) for r in others), others
