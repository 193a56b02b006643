"""`tfmemopt.Model.compile` adds loss scaling by its layers' policy (#23).

Keras wraps the optimizer in `LossScaleOptimizer` only when the model's own
policy is `mixed_float16`; a model rebuilt under a float32 global policy
(what `load_model` does) has float16 layers and a float32 policy of its own.
"""

from __future__ import annotations

import keras

import tfmemopt


def _float16_layers_float32_model():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        inputs = keras.Input((4,))
        outputs = keras.layers.Dense(2)(keras.layers.Dense(8)(inputs))
    finally:
        keras.config.set_dtype_policy("float32")
    model = tfmemopt.Model(inputs, outputs)  # built under float32
    assert model.dtype_policy.name == "float32"
    return model


def test_float16_layers_get_a_loss_scale_optimizer():
    model = _float16_layers_float32_model()
    model.compile(keras.optimizers.Adam(), "mse")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    model = _float16_layers_float32_model()
    model.compile(optimizer="sgd", loss="mse")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_auto_scale_loss_false_is_respected():
    model = _float16_layers_float32_model()
    model.compile(keras.optimizers.Adam(), "mse", auto_scale_loss=False)
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_float32_layers_keep_the_bare_optimizer():
    inputs = keras.Input((4,))
    model = tfmemopt.Model(inputs, keras.layers.Dense(2)(inputs))
    model.compile(keras.optimizers.Adam(), "mse")
    assert isinstance(model.optimizer, keras.optimizers.Adam)
