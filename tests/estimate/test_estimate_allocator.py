"""estimate_memory: the allocator's view (min_counted_bytes), Einsum kernel
copies, mixed policies on models that cannot be rebuilt."""

import math

import keras
import pytest
import tensorflow as tf
from keras import ops

import tfmemopt
from tfmemopt import estimate_memory
from tfmemopt._compat import sublayers
from tfmemopt.estimate import CPU_STATS_MIN_BYTES
from tfmemopt.estimate import _in_place
from tfmemopt.estimate import _kernels
from tfmemopt.estimate import _step_graph
from tfmemopt.estimate import _step_peaks

F32 = 4


def _mlp():
    # Dense(512, 512): a 1 MiB kernel (counted at 256 KiB) and a 2 KiB bias.
    inp = keras.Input((512,))
    h = keras.layers.Dense(512, activation="relu")(inp)
    return keras.Model(inp, keras.layers.Dense(512)(h))


def test_min_counted_bytes_drops_small_allocations():
    model = _mlp()
    every = estimate_memory(model, 64, optimizer="adam")
    floor = estimate_memory(
        model, 64, optimizer="adam", min_counted_bytes=CPU_STATS_MIN_BYTES
    )
    kernels = 2 * 512 * 512 * F32
    assert CPU_STATS_MIN_BYTES == 256 * 1024
    assert every.parameters == kernels + 2 * 512 * F32
    assert floor.parameters == kernels  # the biases are below the floor
    assert floor.gradients == kernels
    assert floor.optimizer_state == 2 * kernels  # Adam: 2 slots per kernel
    # Batch 64 x 512 floats = 128 KiB per activation: none counted.
    assert every.activations > 0 and floor.activations == 0
    assert floor.inputs == 0
    assert floor.settings["min_counted_bytes"] == CPU_STATS_MIN_BYTES
    assert any("not counted" in n for n in floor.notes)
    # At batch 512 every activation is 1 MiB: all counted again.
    big = estimate_memory(model, 512, min_counted_bytes=CPU_STATS_MIN_BYTES)
    assert big.activations == pytest.approx(
        estimate_memory(model, 512).activations, abs=1024
    )


def test_min_counted_bytes_accumulation_counts_the_full_batch_input():
    model = _mlp()
    # Micro-batch of 64 (128 KiB, not counted), full batch of 256 (512 KiB).
    est = estimate_memory(
        model, 256, accumulation_steps=4, min_counted_bytes=CPU_STATS_MIN_BYTES
    )
    assert est.inputs == 256 * 512 * F32 + 256 * 512 * F32  # x and y
    assert est.accumulation == 2 * 512 * 512 * F32  # the kernels' buffers


@pytest.mark.parametrize("bad", [-1, 2.5, "256k", True])
def test_min_counted_bytes_is_checked(bad):
    with pytest.raises(ValueError, match="min_counted_bytes.*Received"):
        estimate_memory(_mlp(), 8, min_counted_bytes=bad)


@pytest.mark.parametrize(
    "equation, copied, out_copied",
    [
        # Measured on CPU (oneDNN), one Einsum in a tf.function at batch 8,
        # 256 tokens, 4 heads of 128: the peak above the inputs was the
        # output plus these copies (24, 12, 4, 1, 12 MiB).
        ("aecd,abcd->acbe", [True, True], True),  # attention scores
        ("acbe,aecd->abcd", [False, True], True),  # scores x values
        ("abc,cde->abde", [False, False], False),  # query projection
        ("abcd,cde->abe", [False, False], False),  # output projection
        ("acbe,abcd->aecd", [False, True], True),  # a gradient
        ("ab,bc->ac", [False, False], False),
        ("...ab,bc->...ac", None, None),  # not modelled
    ],
)
def test_einsum_kernel_copies(equation, copied, out_copied):
    got = _kernels._einsum_copies(equation)
    if copied is None:
        assert got is None
    else:
        assert got == (copied, out_copied)


class _Scores(keras.layers.Layer):
    """Attention scores with MultiHeadAttention's equation, as the Einsum op
    it becomes in the text transformer (keras's ops.einsum turns some
    equations into BatchMatMul and transposes, which the graph shows)."""

    def call(self, x):
        q = ops.reshape(x, (-1, 64, 4, 32))
        return tf.einsum("aecd,abcd->acbe", q, q)


def test_einsum_copies_are_in_the_simulated_peak(monkeypatch):
    inp = keras.Input((64, 128))
    h = keras.layers.Dense(128)(inp)
    h = keras.layers.Flatten()(_Scores()(h))
    model = keras.Model(inp, keras.layers.Dense(1)(h))
    with_copies = _step_graph.trace_step(model, 16).peak
    monkeypatch.setattr(_step_peaks, "_scratch", lambda *a, **k: 0)
    without = _step_graph.trace_step(model, 16).peak
    # Forward: q and k transposed (2 x 128 KiB) and the scores (256 KiB)
    # before their transpose; the gradients' copies are of the same sizes.
    assert with_copies - without >= 2 * 16 * 64 * 128 * F32
    assert with_copies - without <= 6 * 16 * 64 * 64 * 4 * F32


class _NoConfig(keras.layers.Layer):
    """A keras-io style layer: arguments in __init__, no get_config."""

    def __init__(self, units):
        super().__init__()
        self.dense = keras.layers.Dense(units)
        self.norm = keras.layers.LayerNormalization()

    def call(self, x):
        return self.norm(self.dense(x))


def _with_layer_norm(layer):
    inp = keras.Input((256,))
    h = layer(inp)
    return keras.Model(inp, keras.layers.Dense(8)(h))


def test_mixed_policy_on_a_model_that_cannot_be_rebuilt():
    """Layers set to the policy for the trace (LayerNormalization computes
    in float32) and put back; the same as the rebuilt functional twin."""
    odd = _with_layer_norm(_NoConfig(256))
    est = estimate_memory(odd, 512, policy="mixed_bfloat16")
    assert any("with its layers set to" in n for n in est.notes)
    assert {
        layer.dtype_policy.name for layer in sublayers(odd, include_self=True)
    } == {"float32"}
    inp = keras.Input((256,))
    h = keras.layers.LayerNormalization()(keras.layers.Dense(256)(inp))
    twin = keras.Model(inp, keras.layers.Dense(8)(h))
    rebuilt = estimate_memory(twin, 512, policy="mixed_bfloat16")
    assert est.activations == rebuilt.activations
    assert est.total == rebuilt.total
    # The scaling rule would have said half the float32 activations.
    f32 = estimate_memory(odd, 512)
    assert est.activations > f32.activations / 2
    assert math.isclose(est.parameters, f32.parameters)


def test_exported():
    assert tfmemopt.estimate.CPU_STATS_MIN_BYTES == 262144


def _pooled(batch_features=(64, 128)):
    inp = keras.Input(batch_features)
    h = keras.layers.Dense(256, activation="relu")(inp)
    h = keras.layers.GlobalAveragePooling1D()(h)
    return keras.Model(inp, keras.layers.Dense(10)(h))


def test_element_wise_ops_reuse_a_buffer_only_their_own(monkeypatch):
    """The pooling gradient's Tile and RealDiv share one buffer (measured:
    one 128 MiB buffer at batch 2048); inputs with several readers are
    not reused."""
    model = _pooled()
    reused = _step_graph.trace_step(model, 32).peak
    monkeypatch.setattr(_in_place, "_IN_PLACE", set())
    separate = _step_graph.trace_step(model, 32).peak
    buffer = 32 * 64 * 256 * F32  # the second [32, 64, 256] buffer
    assert 0.9 * buffer <= separate - reused <= 1.1 * buffer


def test_optimizer_update_temporaries_of_the_largest_weight():
    # One 4 MiB kernel, a batch of 1: the update, not the step, peaks.
    inp = keras.Input((1024,))
    model = keras.Model(inp, keras.layers.Dense(1024, use_bias=False)(inp))
    kernel = 1024 * 1024 * F32
    for optimizer, copies in (("adam", 2), ("sgd", 1)):
        est = estimate_memory(model, 1, optimizer=optimizer)
        state = est.parameters + est.gradients + est.optimizer_state
        assert est.total >= state + copies * kernel
        assert est.total <= state + copies * kernel + 64 * 1024


class _Float32Only(keras.layers.Layer):
    """Adds a float32 constant: fails when its input is bfloat16."""

    def __init__(self, offset):
        super().__init__()
        self.offset = offset

    def call(self, x):
        return x + tf.constant(self.offset, tf.float32)


def test_mixed_policy_falls_back_to_scaling_when_a_layer_cannot_run_it():
    model = _with_layer_norm(_Float32Only(1.0))
    est = estimate_memory(model, 512, policy="mixed_bfloat16")
    assert any("2-byte activations" in n for n in est.notes)
    assert {
        layer.dtype_policy.name for layer in sublayers(model, include_self=True)
    } == {"float32"}
