"""The one module that reads Keras's private layer and optimizer attributes.

Keras 3 has no public API to list the layers tracked inside a layer (only
models have `.layers`, and it is not recursive), to name its `Functional`
class, or to say whether a layer's `call` takes `training` / `mask`. These
helpers do it, each through one private attribute named in its docstring.
The optimizer internals that `ShardedOptimizer` drives (a variable's key,
weight decay per variable, Nadam's running product, the EMA averages, the
strategy an optimizer was made under) and the strategy internals that
`tfmemopt.distribute` reads are reached through functions here as well.
Two more things Keras and TensorFlow do not say publicly live here too:
whether the step being traced is XLA-compiled (`in_xla_function`), and which
`LossScaleOptimizer` wraps an optimizer (`on_loss_scale_optimizer`). Nothing
in tfmemopt reads the call stack.
tests/test_compat.py checks every private attribute tfmemopt reads on the
installed Keras, so a release that renames one fails there, by name.
"""

from __future__ import annotations

import contextlib
import functools

import keras
import tensorflow as tf


def sublayers(
    layer, recursive: bool = True, include_self: bool = False
) -> list:
    """The layers tracked inside `layer` (Keras's `_flatten_layers`).

    Depth first, each once; `recursive=False` gives the direct children.
    Anything without sub-layer tracking (a `keras.Operation` that is not a
    layer) has none.
    """
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is None:
        return [layer] if include_self else []
    return list(flatten(include_self=include_self, recursive=recursive))


def functional_class() -> type:
    """Keras's `Functional` class, found without importing `keras.src`."""
    for subclass in keras.Model.__subclasses__():
        if subclass.__name__ == "Functional":
            return subclass
    inputs = keras.Input((1,))
    return type(keras.Model(inputs, keras.layers.Identity()(inputs)))


def call_takes(layer, argument: str) -> bool:
    """Whether `layer.call` takes `argument` (`"training"` or `"mask"`).

    Keras records it when the layer is made (`_call_has_training_arg`,
    `_call_has_mask_arg`); a layer that did not record it is assumed to
    take `training` and not `mask`, as Keras's own call wrapper does.
    """
    attribute = {
        "training": "_call_has_training_arg",
        "mask": "_call_has_mask_arg",
    }
    return bool(getattr(layer, attribute[argument], argument == "training"))


def in_xla_function() -> bool:
    """Whether the code being traced now will be compiled by XLA.

    True inside a `tf.function(jit_compile=True)` (a Keras model compiled
    with `jit_compile=True` traces its step in one), also when it is nested
    in other functions or in `strategy.run`; False in eager code, in plain
    `tf.function`s and under auto-clustering. TensorFlow enters an
    `XLAControlFlowContext` on the graph that calls a jit-compiled function
    (`OptionalXlaContext` in TF's `polymorphic_function.py`); this walks the
    current graph and its outer graphs (`FuncGraph.outer_graph`) and asks
    each for that context through the private
    `Graph._get_control_flow_context`, as TF's own
    `control_flow_util.GraphOrParentsInXlaContext` does.
    """
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        context = graph._get_control_flow_context()
        while context is not None:
            if type(context).__name__ == "XLAControlFlowContext":
                return True
            context = context.outer_context
        graph = getattr(graph, "outer_graph", None)
    return False


def optimization_barrier(tensors: list) -> list:
    """XLA's optimization barrier over `tensors` (returned, one each).

    Nothing computed from the outputs can be moved before the barrier, nor
    merged with what was computed from the inputs before it: what
    `jax.checkpoint` puts around a recompute's inputs and the incoming
    gradient, so that XLA neither hoists the recompute into the forward
    pass nor merges it with the forward ops it repeats (common-
    subexpression elimination). Only under XLA (`in_xla_function`). It is
    TensorFlow's `XlaOptimizationBarrier`, reached through
    `tensorflow.compiler.tf2xla.python.xla` (not in `tf.raw_ops`).
    """
    from tensorflow.compiler.tf2xla.python import xla

    return list(xla.optimization_barrier(*tensors))


def dynamic_update_slice(tensor, update, starts: list):
    """`tensor` with `update` written at `starts` (XLA's
    DynamicUpdateSlice: in place on a loop's buffer). Only under XLA
    (`in_xla_function`); reached through
    `tensorflow.compiler.tf2xla.python.xla`, as `optimization_barrier`."""
    from tensorflow.compiler.tf2xla.python import xla

    return xla.dynamic_update_slice(tensor, update, tf.stack(starts))


def active_compile_metrics(model):
    """`{"metrics": ..., "weighted_metrics": ...}` that `model`'s train step
    computes (as given to `compile`), or `None` where Keras keeps none.

    Not the compile config: Keras 3.15's `compile(weighted_metrics=None)`
    after an earlier `compile` with metrics keeps the earlier ones (it
    makes a new `CompileMetrics` only when metrics are given), while the
    config says `None`. keras-hub's causal LMs compile themselves with
    `SparseCategoricalAccuracy` when made, so a user's later
    `lm.compile(..., weighted_metrics=None)` still computes it (only
    `weighted_metrics=[]` drops it)."""
    metrics = getattr(model, "_compile_metrics", None)
    if metrics is None:
        return None
    return {
        "metrics": getattr(metrics, "_user_metrics", None),
        "weighted_metrics": getattr(metrics, "_user_weighted_metrics", None),
    }


def compiled_metrics(model) -> dict:
    """`{"metrics": ..., "weighted_metrics": ...}` that `model`'s step
    computes, serialised (`None` for one not given); `{}` if not compiled.

    Read from Keras's compiled metrics, not the compile config, which says
    `None` after a second `compile(weighted_metrics=None)` while the first
    compile's metrics still run (`_compat.active_compile_metrics`)."""
    if not getattr(model, "compiled", False):
        return {}
    active = active_compile_metrics(model)
    if active is None:
        config = model.get_compile_config() or {}
        active = {k: config.get(k) for k in ("metrics", "weighted_metrics")}
    return {
        key: keras.saving.serialize_keras_object(value) or None
        for key, value in active.items()
    }


def compiled_metric_names(model) -> list:
    """Names of the metrics `model`'s step computes (`compiled_metrics`);
    [] where there are none or they cannot be read."""
    try:
        config = compiled_metrics(model)
    except Exception:  # noqa: BLE001 - a config that cannot be serialised
        return []
    names = []

    def collect(item):
        if isinstance(item, dict) and "class_name" in item:  # one, serialised
            inner = item.get("config")
            name = inner.get("name") if isinstance(inner, dict) else None
            names.append(str(name or item["class_name"]))
        elif isinstance(item, dict):  # per output
            for value in item.values():
                collect(value)
        elif isinstance(item, (list, tuple)):
            for value in item:
                collect(value)
        elif item:
            names.append(str(getattr(item, "name", item)))

    collect(list(config.values()))
    return names


def dynamic_slice(tensor, starts, sizes):
    """`tensor[starts : starts + sizes]` (XLA's DynamicSlice). Only under
    XLA (`in_xla_function`).

    Not `tf.slice`: XLA registers its `begin` as a compile-time constant
    input, so a start computed from the step's arguments outside a loop
    (the tail micro-batch's, which waits on the accumulators) made XLA
    take those arguments (the batch and every weight) as constants and
    compile the step again on every call. `XlaDynamicSlice` takes its
    start at run time. It has no registered gradient; the gradient here
    writes the incoming one into zeros.
    """
    from tensorflow.compiler.tf2xla.python import xla

    starts = tf.cast(tf.stack(starts), tf.int32)

    @tf.custom_gradient
    def _slice(t):
        def grad(upstream):
            return xla.dynamic_update_slice(tf.zeros_like(t), upstream, starts)

        return xla.dynamic_slice(t, starts, sizes), grad

    return _slice(tensor)


_LOSS_SCALE_HOOKS: list = []


def on_loss_scale_optimizer(hook) -> None:
    """Calls `hook(lso)` after each `keras.optimizers.LossScaleOptimizer`
    is made (directly, by `compile` under `mixed_float16`, or by
    `from_config` when a model loads).

    Keras offers no way for an optimizer to learn which
    `LossScaleOptimizer` wraps it: `LossScaleOptimizer.__init__` stores
    `inner_optimizer` and sets its `loss_scale_factor` to None without
    naming itself, and its non-finite branch never calls the inner
    optimizer. So the first registration wraps the public
    `LossScaleOptimizer.__init__` once (subclasses reach it through
    `super().__init__`); the hooks run after Keras's own `__init__`, in the
    order registered, each once per hook however often it is registered.
    """
    if hook not in _LOSS_SCALE_HOOKS:
        _LOSS_SCALE_HOOKS.append(hook)
    cls = keras.optimizers.LossScaleOptimizer
    if getattr(cls.__init__, "_tfmemopt_hooks", None) is _LOSS_SCALE_HOOKS:
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        for registered in _LOSS_SCALE_HOOKS:
            registered(self)

    __init__._tfmemopt_hooks = _LOSS_SCALE_HOOKS
    cls.__init__ = __init__


# -- optimizers ---------------------------------------------------------------


def var_key(optimizer, variable) -> str:
    """The key the optimizer files `variable`'s state under (`_var_key`)."""
    return optimizer._var_key(variable)


def uses_weight_decay(optimizer, variable) -> bool:
    """Whether the optimizer decays `variable` (`_use_weight_decay`:
    `exclude_from_weight_decay` and the variable's own setting)."""
    return bool(optimizer._use_weight_decay(variable))


def optimizer_strategy(optimizer, default=None):
    """The `tf.distribute` strategy the optimizer was made under
    (`_distribution_strategy`, set by Keras's TensorFlow optimizer), or
    `default` for an optimizer that records none."""
    return getattr(optimizer, "_distribution_strategy", default)


def trainable_variables_of(optimizer) -> list:
    """The variables the optimizer was built for (`_trainable_variables`)."""
    return optimizer._trainable_variables


def nadam_u_product(optimizer):
    """Nadam's running product of momentum factors (`_u_product`), which it
    advances outside `update_step`."""
    return optimizer._u_product


def ema_averages(optimizer) -> list:
    """The EMA copies of the parameters (`_model_variables_moving_average`),
    empty when `use_ema` is off or the optimizer is not built."""
    averages = getattr(optimizer, "_model_variables_moving_average", None)
    return [a for a in averages or [] if a is not None]


def ema_slots(optimizer) -> list:
    """The EMA copies of the parameters, one per trainable variable, None
    where Keras keeps none (`_model_variables_moving_average`)."""
    return list(optimizer._model_variables_moving_average)


def update_ema(optimizer, variables) -> None:
    """One EMA step of the averages towards `variables`
    (`_update_model_variables_moving_average`)."""
    optimizer._update_model_variables_moving_average(variables)


# -- tf.distribute ------------------------------------------------------------


def model_strategy(model):
    """The strategy `model` was made under, or None when made outside any
    (`_distribute_strategy`; the public `distribute_strategy` falls back to
    the current one)."""
    return model._distribute_strategy


def cross_device_ops(strategy):
    """The strategy's cross-device ops (`extended._cross_device_ops`), or
    None for a strategy that has none."""
    return getattr(strategy.extended, "_cross_device_ops", None)


def extended_multi_worker_mode(strategy):
    """Whether the strategy spans several workers
    (`extended._in_multi_worker_mode()`), or None where TF does not say."""
    probe = getattr(strategy.extended, "_in_multi_worker_mode", None)
    return None if probe is None else bool(probe())


@contextlib.contextmanager
def local_initial_values(strategy):
    """Inside: the variables made under `strategy` take the initial value
    each worker computes, not the chief's broadcast.

    MultiWorkerMirroredStrategy sends every new variable's initial value
    from the chief to the other workers (its extended's
    `_get_variable_creator_initial_value`), and TensorFlow's broadcast
    takes no 8-bit integers (only bool, float16/32/64, int32, int64). Here
    the first replica of each worker takes its own initial value, as
    MirroredStrategy does on one machine; the other replicas of a worker
    still copy it. Only for values every worker computes alike (constants):
    nothing makes them equal otherwise. A no-op for a strategy on one
    worker.
    """
    extended = strategy.extended
    if not extended_multi_worker_mode(strategy):
        yield
        return
    name = "_get_variable_creator_initial_value"
    own = extended.__dict__.get(name)
    broadcast = getattr(extended, name)

    def initial_value(replica_id, device, primary_var, **kwargs):
        if replica_id == 0:
            return kwargs["initial_value"]
        return broadcast(
            replica_id=replica_id,
            device=device,
            primary_var=primary_var,
            **kwargs,
        )

    setattr(extended, name, initial_value)
    try:
        yield
    finally:
        if own is None:
            delattr(extended, name)
        else:
            setattr(extended, name, own)


# -- parameter sharding -------------------------------------------------------


def replace_storage(variable, storage) -> None:
    """Makes a `keras.Variable` read and write `storage` (`_value`), an
    object with `dtype`, `shape`, `numpy()`, `assign()` and a tensor
    conversion: the storage of a weight sharded across replicas."""
    variable._value = storage


def storage(variable):
    """What a `keras.Variable` stores (`_value`): its `tf.Variable` (or
    distributed variable), never autocast, unlike `variable.value`."""
    return variable._value


def in_symbolic_scope() -> bool:
    """Whether Keras is tracing shapes only (inside `keras.SymbolicScope`,
    as `compute_output_spec` and the symbolic build of `fit` are): the
    graph traced there never runs. Read from the module of the public
    `keras.SymbolicScope` (its `in_symbolic_scope`)."""
    import sys

    module = sys.modules[keras.SymbolicScope.__module__]
    return bool(module.in_symbolic_scope())


def set_untracked(obj, name: str, value) -> None:
    """`obj.<name> = value` on the instance, past Keras's attribute
    tracking: the one way tfmemopt sets an attribute on a Keras object it
    did not make (#50).

    Keras's `Layer`, `Model` and `Optimizer` `__setattr__` track what is
    set on them (a layer or variable set as an attribute becomes a child
    whose weights are saved and walked; `Model.__setattr__` refuses
    attributes before `super().__init__`). tfmemopt's own state on a
    user's model (the checkpointing or long-sequence state) and the
    methods it replaces on one instance must stay out of what Keras saves
    and walks. Methods are replaced on an instance only where Keras offers
    no hook: a layer of a model the user built, checkpointed (`call`); a
    keras-hub attention layer's `_compute_attention`; an optimizer's
    `build`, `add_variable_from_reference`, saving and all-reduce under
    sharding (docs/architecture.md, "Where tfmemopt patches Keras").
    """
    object.__setattr__(obj, name, value)


def delete_untracked(obj, name: str) -> None:
    """Undoes `set_untracked` (the instance attribute removed, the class's
    own seen again)."""
    object.__delattr__(obj, name)


def skip_optimizer_all_reduce(optimizer) -> None:
    """Switches off the TensorFlow optimizer's gradient all-reduce
    (`_all_reduce_sum_gradients`) and its per-replica clipping
    (`_clip_gradients`): under parameter sharding each replica's gradient
    is already its part of the sum, clipped with the whole norm."""
    set_untracked(optimizer, "_all_reduce_sum_gradients", list)
    set_untracked(optimizer, "_clip_gradients", lambda grads: grads)


def train_step_function(model):
    """The `tf.function` Keras runs for one train step (`one_step_on_data`
    in the closure of `model.train_function`, which calls
    `strategy.run(train_step)`), or None (run eagerly, or not found)."""
    fn = getattr(model, "train_function", None)
    cells = getattr(fn, "__closure__", None) or ()
    names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
    for name, cell in zip(names, cells):
        if name == "one_step_on_data":
            step = getattr(cell.cell_contents, "__wrapped__", None)
            if hasattr(step, "get_concrete_function"):
                return step
    return None


def auto_jit_compile(model) -> bool:
    """What Keras's `compile(jit_compile="auto")` resolves to for `model`
    on this machine (its private `_resolve_auto_jit_compile`: off on a
    CPU-only machine, under a distribution strategy, with op determinism
    and where a layer does not support XLA), without setting it."""
    return bool(model._resolve_auto_jit_compile())


def compiled_jit_compile(model):
    """The `jit_compile` the model was compiled with (a bool once
    compiled; `None` before): Keras's private `_jit_compile`, read without
    the `jit_compile` property's side effect of resolving it."""
    return getattr(model, "_jit_compile", None)
