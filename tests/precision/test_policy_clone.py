"""Estimating under another dtype policy (precision/_policy_clone.py)."""

import keras

import tfmemopt
from tfmemopt import estimate_memory

F32 = 4


def _bn_model():
    inp = keras.Input((64,))
    x = keras.layers.Dense(256)(inp)
    x = keras.layers.BatchNormalization()(x)
    return keras.Model(inp, keras.layers.Dense(4)(x))


def test_policy_is_traced_on_the_model_rebuilt_under_it():
    plain = _bn_model()
    est = estimate_memory(plain, 512, policy="mixed_bfloat16")
    with tfmemopt.mixed_precision.configure("mixed_bfloat16"):
        native = _bn_model()
    direct = estimate_memory(native, 512)
    assert est.total == direct.total
    assert any("rebuilt under the policy" in n for n in est.notes)
    # BatchNorm computes in float32: its [512, 256] float32 input copy is
    # kept, so the activations are not half of float32's.
    f32 = estimate_memory(plain, 512)
    assert est.activations > 0.5 * f32.activations + 512 * 256 * F32 / 2
