"""Keras's private attributes that tfmemopt reads still exist and behave.

`tfmemopt/_compat.py` is the one module that reads Keras's private layer
and optimizer attributes (each function is checked below); the other private
names listed in `_OTHER_PRIVATE` are read, or overridden, where they are
used (each with its module). When a Keras release renames one, the test
names it, instead of a training step failing somewhere deep.
"""

from __future__ import annotations

import inspect

import keras
import numpy as np
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


class _CompileLoss:
    """Stands for the object `model.compile` keeps as `_compile_loss`."""


class _Masked:
    """Stands for an eager tensor that a masking layer returned."""


# Private names read outside _compat: (where, object, attribute).
_OTHER_PRIVATE = [
    # Overridden: the EMA step in float32 for 16-bit weights.
    (
        "optimizers/_common",
        keras.optimizers.Optimizer,
        "_update_model_variables_moving_average",
    ),
    (
        "optimizers/_common",
        keras.optimizers.Optimizer,
        "_overwrite_model_variables_with_average_value",
    ),
    (
        "checkpointing, precision/_advice, estimate/_long_sequences",
        keras.KerasTensor,
        "_keras_history",
    ),
    ("accumulation/_loss_normalization", keras.Model, "_compile_loss"),
    (
        "checkpointing/_apply, estimate/_long_sequences",
        keras.layers.Layer,
        "_inbound_nodes",
    ),
    (
        "longseq/_enable",
        keras.layers.MultiHeadAttention,
        "_compute_attention",
    ),
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
    # Without it the hook silently stops clipping after the all-reduce.
    (
        "accumulation/_accumulation_hooks",
        keras.optimizers.Optimizer,
        "_all_reduce_sum_gradients",
    ),
    ("accumulation/_window", keras.Model, "_loss_tracker"),
    ("accumulation/_window", keras.Model, "_call_has_training_arg"),
    ("accumulation/_window, _loss_normalization", _CompileLoss, "_flat_losses"),
    ("accumulation/_loss_normalization", _CompileLoss, "_user_loss"),
    ("accumulation/_loss_normalization", _Masked, "_keras_mask"),
    (
        "accumulation/_accumulating_optimizer",
        keras.optimizers.Optimizer,
        "_track_variable",
    ),
    (
        "accumulation/_accumulating_optimizer",
        keras.optimizers.Optimizer,
        "_variables",
    ),
    (
        "accumulation/_accumulating_optimizer, optimizers/_common",
        keras.optimizers.Optimizer,
        "_get_variable_index",
    ),
    (
        "optimizers/_common",
        keras.optimizers.Optimizer,
        "_overwrite_variable_with_gradient",
    ),
    # Overridden by optimizers/_common (StateOptimizer): a rename would
    # decay bfloat16 weights twice (in bfloat16, then in float32).
    ("optimizers/_common", keras.optimizers.Optimizer, "_apply_weight_decay"),
    ("checkpointing/_recompute", keras.Variable, "_value"),
    # Overridden by distribute/_keras_fixes (MultiWorkerFitFixes): a rename
    # would silently skip the multi-worker fix.
    ("distribute/_keras_fixes", keras.Model, "_maybe_symbolic_build"),
    ("distribute/_keras_fixes", keras.Model, "_symbolic_build"),
]


def _instance_attributes():
    model, _ = _nested_model()
    model.compile("sgd", "mse")
    model.build((None, 3))
    dense = model.get_layer("head")
    model.compute_loss(y=tf.ones((2, 1)), y_pred=tf.ones((2, 1)))
    return {
        keras.KerasTensor: keras.Input((2,)),
        keras.Model: model,
        keras.layers.Layer: dense,
        keras.Variable: keras.Variable(1.0),
        _CompileLoss: model._compile_loss,
        _Masked: keras.layers.Masking()(tf.ones((2, 3, 1))),
        keras.optimizers.Optimizer: keras.optimizers.SGD(),
        keras.layers.MultiHeadAttention: keras.layers.MultiHeadAttention(
            num_heads=2, key_dim=2
        ),
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
    # _compat.extended_multi_worker_mode
    assert hasattr(strategy.extended, "_in_multi_worker_mode")
    # _compat.cross_device_ops
    mirrored = tf.distribute.MirroredStrategy(["CPU:0"])
    assert hasattr(mirrored.extended, "_cross_device_ops")
    assert _compat.cross_device_ops(mirrored) is not None
    assert _compat.cross_device_ops(strategy) is None
    assert _compat.extended_multi_worker_mode(mirrored) is False
    # distribute/_multi_step sets it, as Keras's own multi-step loop does.
    empty = tf.experimental.Optional.empty(tf.TensorSpec([], tf.float32))
    assert hasattr(empty, "_element_spec")
    # _compat.local_initial_values: MultiWorkerMirroredStrategy's extended
    # overrides the method that broadcasts initial values.
    import sys

    module = sys.modules[tf.distribute.MultiWorkerMirroredStrategy.__module__]
    name = "_get_variable_creator_initial_value"
    assert name in vars(module.CollectiveAllReduceExtended)
    assert hasattr(mirrored.extended, name)


class _Extended:
    """A multi-worker extended: its initial values are 'broadcast'."""

    def _in_multi_worker_mode(self):
        return True

    def _get_variable_creator_initial_value(self, replica_id, **kwargs):
        return ("broadcast", replica_id)


def test_local_initial_values_skips_only_the_first_replicas_broadcast():
    strategy = type("S", (), {"extended": _Extended()})()
    ext = strategy.extended
    kwargs = {"device": "CPU:0", "primary_var": None, "initial_value": 7}
    with _compat.local_initial_values(strategy):
        assert ext._get_variable_creator_initial_value(0, **kwargs) == 7
        assert ext._get_variable_creator_initial_value(1, **kwargs) == (
            "broadcast",
            1,
        )
    assert ext._get_variable_creator_initial_value(0, **kwargs) == (
        "broadcast",
        0,
    )
    assert "_get_variable_creator_initial_value" not in vars(ext)
    # One worker: nothing changes.
    mirrored = tf.distribute.MirroredStrategy(["CPU:0"])
    with _compat.local_initial_values(mirrored):
        assert not vars(mirrored.extended).get(
            "_get_variable_creator_initial_value"
        )


# The optimizer internals behind _compat's optimizer functions, each read by
# distribute/sharding.py: (function, optimizer, attribute).
_OPTIMIZER_PRIVATE = [
    ("var_key", "sgd", "_var_key"),
    ("uses_weight_decay", "adamw", "_use_weight_decay"),
    ("optimizer_strategy", "sgd", "_distribution_strategy"),
    ("trainable_variables_of", "sgd", "_trainable_variables"),
    ("nadam_u_product", "nadam", "_u_product"),
    ("ema_averages", "ema", "_model_variables_moving_average"),
    ("ema_slots", "ema", "_model_variables_moving_average"),
    ("update_ema", "ema", "_update_model_variables_moving_average"),
    ("skip_optimizer_all_reduce", "sgd", "_all_reduce_sum_gradients"),
    ("skip_optimizer_all_reduce", "sgd", "_clip_gradients"),
]


def _built_optimizer(kind):
    make = {
        "sgd": lambda: keras.optimizers.SGD(0.1),
        "adamw": lambda: keras.optimizers.AdamW(0.1, weight_decay=0.5),
        "nadam": lambda: keras.optimizers.Nadam(0.1),
        "ema": lambda: keras.optimizers.SGD(
            0.1, use_ema=True, ema_momentum=0.5
        ),
    }
    optimizer = make[kind]()
    variables = [
        keras.Variable([1.0, 2.0], name="kernel"),
        keras.Variable([3.0], name="bias"),
    ]
    optimizer.build(variables)
    return optimizer, variables


@pytest.mark.parametrize(
    "function, kind, attribute",
    _OPTIMIZER_PRIVATE,
    ids=[f for f, _, _ in _OPTIMIZER_PRIVATE],
)
def test_optimizer_private_attributes_still_exist(function, kind, attribute):
    optimizer, _ = _built_optimizer(kind)
    assert hasattr(optimizer, attribute), (
        f"Keras {keras.__version__} has no {type(optimizer).__name__}."
        f"{attribute}, which tfmemopt._compat.{function} reads "
        "(for ShardedOptimizer)."
    )


def test_optimizer_functions_behave():
    sgd, (kernel, bias) = _built_optimizer("sgd")
    assert _compat.var_key(sgd, kernel) != _compat.var_key(sgd, bias)
    assert _compat.var_key(sgd, kernel) == _compat.var_key(sgd, kernel)
    assert _compat.optimizer_strategy(sgd) is tf.distribute.get_strategy()
    assert _compat.optimizer_strategy(object(), "none") == "none"
    assert _compat.trainable_variables_of(sgd) == [kernel, bias]
    assert _compat.ema_averages(sgd) == []

    adamw = keras.optimizers.AdamW(0.1, weight_decay=0.5)
    adamw.exclude_from_weight_decay(var_names=["bias"])
    adamw.build([kernel, bias])
    assert _compat.uses_weight_decay(adamw, kernel)
    assert not _compat.uses_weight_decay(adamw, bias)

    nadam, _ = _built_optimizer("nadam")
    assert float(_compat.nadam_u_product(nadam).numpy()) == 1.0

    ema, (kernel, bias) = _built_optimizer("ema")
    averages = _compat.ema_averages(ema)
    assert [a.numpy().tolist() for a in averages] == [[0.0, 0.0], [0.0]]
    kernel.assign([3.0, 4.0])
    _compat.update_ema(ema, [kernel, bias])
    # Keras's first EMA step (iterations == 0) copies the variable; later
    # ones move by `ema_momentum`.
    np.testing.assert_allclose(averages[0].numpy(), [3.0, 4.0])
    ema.iterations.assign(1)
    kernel.assign([5.0, 6.0])
    _compat.update_ema(ema, [kernel, bias])
    np.testing.assert_allclose(averages[0].numpy(), [4.0, 5.0])


def test_model_strategy_is_none_outside_a_scope():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert _compat.model_strategy(model) is None
    with tf.distribute.MirroredStrategy(["CPU:0"]).scope():
        inside = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert isinstance(
        _compat.model_strategy(inside), tf.distribute.MirroredStrategy
    )


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


class _Storage:
    """Stands for a sharded weight's storage (distribute/_fsdp)."""

    dtype = tf.float32
    shape = tf.TensorShape([2])

    def __init__(self):
        self.assigned = None

    def assign(self, value):
        self.assigned = np.asarray(value)


tf.register_tensor_conversion_function(
    _Storage, lambda v, dtype=None, name=None, as_ref=False: tf.ones([2])
)


def test_replace_storage_makes_the_variable_read_and_write_it():
    # tfmemopt.Model(shard_parameters=True) relies on Keras reading and
    # writing a variable only through `_value`.
    variable = keras.Variable([5.0, 6.0], name="w")
    storage = _Storage()
    _compat.replace_storage(variable, storage)
    assert _compat.storage(variable) is storage
    assert np.array_equal(keras.ops.convert_to_numpy(variable * 2.0), [2, 2])
    variable.assign([3.0, 4.0])
    assert np.array_equal(storage.assigned, [3.0, 4.0])


def test_in_symbolic_scope_sees_keras_symbolic_scope():
    assert not _compat.in_symbolic_scope()
    with keras.SymbolicScope():
        assert _compat.in_symbolic_scope()
    seen = []

    class Probe(keras.layers.Layer):
        def call(self, x):
            seen.append(_compat.in_symbolic_scope())
            return x

    Probe()(keras.Input((2,)))  # traced by compute_output_spec
    Probe()(np.ones((1, 2), "float32"))
    assert seen == [True, False] and not _compat.in_symbolic_scope()


def test_skip_optimizer_all_reduce_leaves_gradients_as_given():
    sgd, (kernel, bias) = _built_optimizer("sgd")
    sgd.global_clipnorm = 1e-3
    _compat.skip_optimizer_all_reduce(sgd)
    pairs = [(tf.constant([1.0, 1.0]), kernel)]
    assert sgd._all_reduce_sum_gradients(pairs) == pairs
    assert sgd._clip_gradients(["g"]) == ["g"]


def test_train_step_function_is_the_one_keras_runs():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    assert _compat.train_step_function(model) is None  # not made yet
    model.make_train_function()
    step = _compat.train_step_function(model)
    data = tf.data.Dataset.from_tensor_slices(
        (np.ones((4, 3), "float32"), np.ones((4, 2), "float32"))
    ).batch(4)
    graph = step.get_concrete_function(data.element_spec).graph
    assert any(op.type == "MatMul" for op in graph.get_operations())
    model.fit(data, verbose=0, shuffle=False)
    # fit ran the function traced above: no second trace.
    assert step.experimental_get_tracing_count() == 1
    model.compile("sgd", "mse", run_eagerly=True)
    model.make_train_function()
    assert _compat.train_step_function(model) is None
