"""Checkpointed gradients of convolutional models: equal up to a measured
float32 bound, not bit for bit (docs/checkpointing.md states the bound).

Dense and transformer stacks give bit-equal gradients (0.0, the other
checkpointing tests). A convolution's backward in the recomputed segment
runs in another graph and accumulates in another order: a plain Conv2D
stack already differs by ~1e-7 of the largest gradient (with or without
BatchNorm, residual adds, grappler's remapper or oneDNN). ResNet50 at batch
4 on 32x32 images measured 3.3e-6 (2.0e-6 with oneDNN off): BatchNorm over
1x1 feature maps of 4 samples makes its backward ill-conditioned (largest
gradient ~9e3), which scales the rounding up.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfmemopt


def _relative_difference(model, x, y):
    """max |g_ckpt - g_plain| / max |g_plain| of one training step."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    start = [v.numpy() for v in model.variables]

    def gradients():
        for v, w in zip(model.variables, start):
            v.assign(w)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            return tape.gradient(loss, model.trainable_variables)

        return [g.numpy() for g in step(x, y)]

    plain = gradients()
    report = tfmemopt.enable_checkpointing(model, "auto")
    assert report is not None
    checkpointed = gradients()
    diff = max(np.max(np.abs(a - b)) for a, b in zip(plain, checkpointed))
    return diff / max(np.max(np.abs(a)) for a in plain)


def _residual_convnet():
    inputs = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(16, 3, padding="same")(inputs)
    for _ in range(6):
        y = keras.layers.Conv2D(16, 3, padding="same")(h)
        y = keras.layers.BatchNormalization()(y)
        y = keras.layers.Activation("relu")(y)
        h = keras.layers.Add()([h, y])
    h = keras.layers.GlobalAveragePooling2D()(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    return keras.Model(inputs, outputs)


def test_conv_bn_residual_stack_within_1e_6():
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype("float32")
    rel = _relative_difference(_residual_convnet(), x, np.arange(4))
    assert rel <= 1e-6, rel  # measured 1.9e-7


@pytest.mark.slow
@pytest.mark.extended(
    reason="the documented bound measured on ResNet50; make test checks "
    "a conv/batch-norm residual stack to 1e-6 and MobileNetV2 (#51)"
)
def test_resnet50_within_the_documented_bound():
    model = keras.applications.ResNet50(
        weights=None, input_shape=(32, 32, 3), classes=10
    )
    x = np.random.default_rng(0).normal(size=(4, 32, 32, 3)).astype("float32")
    rel = _relative_difference(model, x, np.arange(4))
    assert rel <= 1e-5, rel  # measured 3.3e-6 (docs/checkpointing.md)
