"""Under XLA (`jit_compile=True`), where users train on one GPU or a TPU
(#46): checkpointing and accumulation compile once, train like plain Keras
under XLA, and save memory there.

- The step compiles once: a checkpointed segment's weights were read as
  compile-time constants (the recompute's wait on the incoming gradient was
  a slice whose offset XLA takes as a constant, traced back through the
  weights), so the step was compiled again after every update. Counted from
  XLA's own dump of the modules it compiles (`--xla_dump_to`).
- Exact: the weights after two steps equal plain Keras's under XLA within
  the floor measured in the same test (plain Keras under XLA against
  without).
- Memory: one step's peak against plain Keras under XLA, each in a fresh
  process (XLA's buffers go through the CPU allocator the statistics read).
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from conftest import run_in_subprocess

import tfmemopt

pytestmark = pytest.mark.slow

T, D, B = 16, 32, 8


def _block(h, i, dropout=0.0, width=D):
    a = keras.layers.MultiHeadAttention(
        2, width // 2, dropout=dropout, name=f"mha{i}"
    )(h, h)
    h = keras.layers.LayerNormalization(name=f"ln{i}a")(h + a)
    f = keras.layers.Dense(2 * width, activation="relu", name=f"ff{i}a")(h)
    f = keras.layers.Dropout(dropout, name=f"drop{i}")(f)
    f = keras.layers.Dense(width, name=f"ff{i}b")(f)
    return keras.layers.LayerNormalization(name=f"ln{i}b")(h + f)


def _transformer(cls=keras.Model, blocks=1, dropout=0.0, **kwargs):
    """One block unless asked (XLA's compile time grows with the graph);
    `"auto"` still cuts it into three segments that hold weights: mha0;
    the residual adds with ln0a, ff0a and ff0b; ln0b, the pooling and the
    head."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((T, D))
    h = inputs
    for i in range(blocks):
        h = _block(h, i, dropout)
    pooled = keras.layers.GlobalAveragePooling1D()(h)
    outputs = keras.layers.Dense(4, name="head")(pooled)
    if cls is keras.Model:
        return keras.Model(inputs, outputs)
    return tfmemopt.Model(inputs, outputs, **kwargs)


def _data(n=B):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, T, D)).astype("float32")
    y = rng.integers(0, 4, size=(n,)).astype("int32")
    return x, y


def _train(model, jit, steps=2):
    x, y = _data()
    model.compile(
        keras.optimizers.Adam(1e-2),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit,
    )
    losses = [float(model.train_on_batch(x, y)) for _ in range(steps)]
    return losses, [np.array(w) for w in model.get_weights()]


def _diff(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b))


@pytest.fixture(scope="module")
def plain_under_xla():
    """Plain Keras under XLA: losses, weights after two steps, the floor
    (XLA against the graph executor) and the update's size."""
    _, initial = _train(_transformer(), jit=False, steps=0)
    _, graph = _train(_transformer(), jit=False)
    losses, weights = _train(_transformer(), jit=True)
    return losses, weights, _diff(weights, graph), _diff(weights, initial)


@pytest.mark.parametrize(
    "options",
    [
        {"checkpointing": "auto"},
        {"checkpointing": ["mha0", "ff0a"]},
        {"accumulation_steps": 3},  # 8 = 3 + 3 + a tail of 2
        {"accumulation_steps": 4, "checkpointing": "auto"},
    ],
    ids=lambda o: "+".join(f"{k}={v}" for k, v in o.items()),
)
def test_equals_plain_keras_under_xla(options, plain_under_xla):
    want_losses, want, floor, update = plain_under_xla
    got_losses, got = _train(_transformer(tfmemopt.Model, **options), jit=True)
    assert update > 1e-3
    assert _diff(got, want) <= max(4 * floor, 2**-20 * update), (
        _diff(got, want),
        floor,
    )
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)


_COMPILES = """
import glob, os, sys
# XLA reads XLA_FLAGS at its first compilation, not when TensorFlow is
# imported, so the dump is asked for here and the child can be forked from
# the test server (a fresh interpreter spends ~5 s importing). Were the
# flags read earlier, nothing would be dumped and every count would be 0.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_dump_to={dump} --xla_dump_hlo_as_text"
)
sys.path.insert(0, "tests")  # tests/test_xla.py imports conftest
import keras, numpy as np
import tfmemopt
from tests.test_xla import _transformer, _data

def dense(**options):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32,))
    h = inputs
    for i in range(4):
        h = keras.layers.Dense(64, activation="tanh", name=f"d{{i}}")(h)
    return tfmemopt.Model(inputs, keras.layers.Dense(3)(h),
                          **(options or {{"checkpointing": "auto"}}))

x, y = _data()
counts = {{}}
for name, make in [
    ("dense_auto", dense),
    # 8 samples in 3 micro-batches: 3 + 3 + a tail of 2 (the tail's start
    # made XLA take the batch and weights as constants: one compilation
    # per call)
    ("dense_accumulation_uneven", lambda: dense(accumulation_steps=3)),
    ("transformer_auto_dropout",
     lambda: _transformer(tfmemopt.Model, dropout=0.1,
                          checkpointing="auto")),
    ("transformer_accumulation",
     lambda: _transformer(tfmemopt.Model, accumulation_steps=2)),
]:
    model = make()
    model.compile("adam",
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    xs = x.reshape(len(x), -1)[:, :32] if name.startswith("dense") else x
    before = set(glob.glob(os.path.join({dump!r}, "*before_optimizations.txt")))
    for _ in range(3):
        model.train_on_batch(xs, y % 3)
    after = set(glob.glob(os.path.join({dump!r}, "*before_optimizations.txt")))
    counts[name] = sum("train_function" in p or "one_step_on_data" in p
                       for p in after - before)
emit(counts)
"""


def test_the_step_compiles_once(tmp_path):
    """Three steps, one compilation of the step (the weights are arguments,
    not constants); before the fixes the checkpointed steps and the
    accumulation with a short tail micro-batch compiled three times."""
    dump = str(tmp_path / "xla")
    counts = run_in_subprocess(
        _COMPILES.format(dump=dump), n_cpus=1, timeout=300
    )
    assert counts == {
        "dense_auto": 1,
        "dense_accumulation_uneven": 1,
        "transformer_auto_dropout": 1,
        "transformer_accumulation": 1,
    }, counts


_PEAK = """
import sys
sys.path.insert(0, "tests")
import keras, numpy as np, tensorflow as tf
import tfmemopt
from tests.test_xla import _block

T, D, B = 128, 128, 16
keras.utils.set_random_seed(0)
inputs = keras.Input((T, D))
h = _block(inputs, 0, width=D)
outputs = keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(h))
options = {options}
model = (tfmemopt.Model(inputs, outputs, **options) if options
         else keras.Model(inputs, outputs))
model.compile("adam",
              keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              jit_compile=True)
rng = np.random.default_rng(0)
x = rng.normal(size=(B, T, D)).astype("float32")
y = rng.integers(0, 4, size=(B,)).astype("int32")
model.train_on_batch(x, y)
emit(step_peak(lambda: model.train_on_batch(x, y), repeats=2))
"""


def _peak(options):
    return run_in_subprocess(
        _PEAK.format(options=json.dumps(options)), n_cpus=1, timeout=300
    )


def test_memory_under_xla():
    """Peaks under XLA against plain Keras under XLA (one transformer
    block, T=128, D=128, batch 16: activations dominate), each in a fresh
    process. They fail where XLA keeps what the option frees."""
    plain = _peak({})
    ratios = {
        "accumulation 4": _peak({"accumulation_steps": 4}) / plain,
        "checkpointing auto": _peak({"checkpointing": "auto"}) / plain,
    }
    # Measured 0.27 and 0.52 here (33.0 MiB plain; 0.49 and 0.51 with
    # four blocks: XLA allocates each step's temporaries as one buffer, and
    # the allocator's chunks make the peaks coarse). Before the fixes:
    # accumulation padded the batch to 8x its size in the loop, and the
    # recompute was merged back into the forward pass (1.00x; 1.00 here
    # too with the barrier alone as the recompute's wait).
    assert ratios["accumulation 4"] <= 0.65, ratios
    assert ratios["checkpointing auto"] <= 0.65, ratios
