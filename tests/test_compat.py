"""Keras's private attributes that tfmemopt reads still exist and behave.

`tfmemopt/_compat.py` is the one module that reads Keras's private layer
attributes; the other private names listed below are read where they are
used (each with its module). When a Keras release renames one, the test
names it, instead of a training step failing somewhere deep.
"""

from __future__ import annotations

import inspect

import keras
import pytest
import tensorflow as tf

from tfmemopt import _compat


def _nested_model():
    inner = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)],
        name="inner",
    )
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(1, name="head")(inner(inputs))
    return keras.Model(inputs, outputs, name="outer"), inner


def test_flatten_layers_exists_with_its_arguments():
    params = inspect.signature(keras.layers.Layer._flatten_layers).parameters
    assert {"include_self", "recursive"} <= set(params)


def test_sublayers_walks_nested_models():
    model, inner = _nested_model()
    names = [layer.name for layer in _compat.sublayers(model)]
    assert names[: len(names)] and "inner" in names and "head" in names
    assert set(names) >= {layer.name for layer in inner.layers}
    direct = {layer.name for layer in _compat.sublayers(model, False)}
    assert "inner" in direct and not direct & {
        layer.name for layer in inner.layers
    }
    assert _compat.sublayers(model, include_self=True)[0] is model
    assert _compat.sublayers(object()) == []


def test_functional_class_is_what_keras_builds():
    model, _ = _nested_model()
    cls = _compat.functional_class()
    assert cls.__name__ == "Functional" and type(model) is cls
    assert issubclass(cls, keras.Model)


class _NoTraining(keras.layers.Layer):
    def call(self, x):
        return x


class _WithMask(keras.layers.Layer):
    def call(self, x, training=None, mask=None):
        return x


def test_call_takes_reads_what_keras_records():
    assert not _compat.call_takes(_NoTraining(), "training")
    assert not _compat.call_takes(_NoTraining(), "mask")
    assert _compat.call_takes(_WithMask(), "training")
    assert _compat.call_takes(_WithMask(), "mask")
    assert _compat.call_takes(keras.layers.Dropout(0.5), "training")


# Private names read outside _compat: (where, object, attribute).
_OTHER_PRIVATE = [
    ("accumulation, checkpointing", keras.KerasTensor, "_keras_history"),
    ("accumulation/_loss_normalization", keras.Model, "_compile_loss"),
    ("checkpointing/_apply", keras.layers.Layer, "_inbound_nodes"),
    ("checkpointing/_apply", keras.layers.Layer, "_outbound_nodes"),
    ("checkpointing/_apply", keras.layers.Layer, "_get_call_context"),
    ("estimate/_input_specs", keras.Model, "_build_shapes_dict"),
    (
        "accumulation/_accumulation_hooks",
        keras.optimizers.Optimizer,
        "_clip_gradients",
    ),
    (
        "accumulation/_accumulation_hooks",
        keras.optimizers.LossScaleOptimizer,
        "_stateful_handle_non_finite_grads",
    ),
]


def _instance_attributes():
    model, _ = _nested_model()
    model.compile("sgd", "mse")
    model.build((None, 3))
    dense = model.get_layer("head")
    return {
        keras.KerasTensor: keras.Input((2,)),
        keras.Model: model,
        keras.layers.Layer: dense,
        keras.optimizers.Optimizer: keras.optimizers.SGD(),
        keras.optimizers.LossScaleOptimizer: (
            keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
        ),
    }


@pytest.mark.parametrize(
    "where, cls, attribute",
    _OTHER_PRIVATE,
    ids=[f"{c.__name__}.{a}" for _, c, a in _OTHER_PRIVATE],
)
def test_other_private_attributes_still_exist(where, cls, attribute):
    if cls is keras.Model and attribute == "_build_shapes_dict":
        model, _ = _nested_model()
        assert hasattr(model, attribute), (where, attribute)
        return
    obj = _instance_attributes()[cls]
    assert hasattr(obj, attribute), (
        f"Keras {keras.__version__} has no {cls.__name__}.{attribute}, "
        f"which tfmemopt's {where} reads."
    )


def test_tensorflow_private_attributes_still_exist():
    strategy = tf.distribute.get_strategy()
    # distribute/_auto_strategy, distribute/_keras_fixes
    assert hasattr(strategy.extended, "_in_multi_worker_mode")


def test_in_xla_function_sees_jit_compile_only():
    seen = {}

    @tf.function(jit_compile=True)
    def compiled(x):
        seen["jit"] = _compat.in_xla_function()

        @tf.function
        def nested(y):
            seen["nested in jit"] = _compat.in_xla_function()
            return y

        return nested(x) + 1

    @tf.function
    def plain(x):
        seen["plain"] = _compat.in_xla_function()
        return x + 1

    compiled(tf.ones(2))
    plain(tf.ones(2))
    seen["eager"] = _compat.in_xla_function()
    assert seen == {
        "jit": True,
        "nested in jit": True,
        "plain": False,
        "eager": False,
    }, (
        f"TensorFlow {tf.__version__} no longer marks jit-compiled tracing "
        "with an XLAControlFlowContext (Graph._get_control_flow_context); "
        "tfmemopt's AccumulatingOptimizer reads it to refuse XLA on "
        "mirrored CPUs."
    )


def test_on_loss_scale_optimizer_sees_every_wrapper():
    made = []

    def hook(lso):
        made.append((type(lso).__name__, lso.inner_optimizer.name))

    _compat.on_loss_scale_optimizer(hook)
    _compat.on_loss_scale_optimizer(hook)  # once per hook
    try:
        direct = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(name="direct")
        )

        class Subclass(keras.optimizers.LossScaleOptimizer):
            def __init__(self, inner, **kwargs):
                super().__init__(inner, **kwargs)

        Subclass(keras.optimizers.SGD(name="sub"))
        keras.optimizers.LossScaleOptimizer.from_config(direct.get_config())
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.dtype_policy = "mixed_float16"
        model.compile(keras.optimizers.SGD(name="compiled"), "mse")
    finally:
        _compat._LOSS_SCALE_HOOKS.remove(hook)
    assert made == [
        ("LossScaleOptimizer", "direct"),
        ("Subclass", "sub"),
        ("LossScaleOptimizer", "direct"),  # from_config
        ("LossScaleOptimizer", "compiled"),  # compile's mixed_float16 wrap
    ]
    # Keras's `__init__` ran in full before the hook: the inner optimizer's
    # own loss scaling is off.
    assert direct.inner_optimizer.loss_scale_factor is None
