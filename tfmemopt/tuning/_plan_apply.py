"""Turning a `Plan` into a model: precision, checkpointing, accumulation."""

from __future__ import annotations

import gc
import warnings

import keras

from tfmemopt._compat import compiled_metric_names
from tfmemopt.precision import swap_policy


def _policy_name(model) -> str:
    policy = getattr(model, "dtype_policy", None)
    return getattr(policy, "name", None) or keras.config.dtype_policy().name


def rebuild(model: keras.Model, policy: str) -> keras.Model:
    """A copy of `model` whose layers compute under `policy`, same weights.

    Output layers keep their policy, so outputs (and softmax) stay float32.
    """
    old = _policy_name(model)
    try:
        config = model.get_config()
        keep = set()
        if isinstance(model, keras.Sequential):
            keep = {model.layers[-1].name} if model.layers else set()
        else:
            outputs = config.get("output_layers") or []
            if outputs and isinstance(outputs[0], str):
                outputs = [outputs]  # a single output: [name, 0, 0]
            keep = {entry[0] for entry in outputs}
        config = swap_policy(config, old, policy, keep)
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(policy)
        try:
            copy = type(model).from_config(config)
        finally:
            keras.config.set_dtype_policy(previous)
        copy.set_weights(model.get_weights())
    except Exception as e:  # noqa: BLE001 - explained below
        raise ValueError(
            f"Cannot rebuild {type(model).__name__} {model.name!r} under "
            f"policy {policy!r} ({type(e).__name__}: {e}). Build the model "
            f"inside `tfmemopt.mixed_precision.configure({policy!r})` and "
            "call `plan.apply(model)` again, or plan with allow=("
            "'accumulation', 'checkpointing')."
        ) from e
    return copy


def apply_plan(plan, model: keras.Model, copy: bool = False) -> keras.Model:
    """See `Plan.apply`; `copy=True` never touches `model` (for verify)."""
    from tfmemopt.accumulation import Model

    if not isinstance(model, keras.Model) or not model.built:
        raise ValueError(
            "`plan.apply` needs a built keras.Model. Received: "
            f"{type(model).__name__}"
            + (" (not built: call it on a batch first)." if model else ".")
        )
    compile_config = None
    if getattr(model, "compiled", False):
        compile_config = _compile_config(plan, model)
        if plan.model_kwargs.get("chunked_loss"):
            compile_config = _without_metrics(compile_config, model)
    elif plan.optimizer or plan.sharding:
        raise ValueError(
            f"The plan switches the optimizer to {plan.optimizer_name}, "
            "built from the model's compiled optimizer, but the model is not "
            "compiled. Compile it first (model.compile(optimizer=..., "
            "loss=...)), then call plan.apply(model)."
        )
    base = model
    if copy or plan.policy != _policy_name(model):
        base = rebuild(model, plan.policy)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(plan.policy)
    try:
        extra = {
            k: v
            for k, v in plan.model_kwargs.items()
            if k in ("shard_parameters", "chunked_loss", "attention")
        }
        # Checkpointing through the wrapper, not on `base` directly: the
        # wrapper saves it in its config, so the model loads with it (a
        # plan applied in place came back from `load_model` without it).
        wrapped = Model.wrap(
            base,
            accumulation_steps=plan.accumulation_steps,
            checkpointing=plan.checkpointing,
            **extra,
        )
        if compile_config is not None:
            wrapped.compile_from_config(compile_config)
    finally:
        keras.config.set_dtype_policy(previous)
    return wrapped


def _without_metrics(config, model) -> dict:
    """`config` without metrics: `chunked_loss` never forms the logits they
    read (its first fit refuses them). Said in `Plan.why` and here."""
    names = compiled_metric_names(model)
    if not names:
        return config
    warnings.warn(
        f"plan.apply: the plan computes the loss in chunks (chunked_loss="
        f"True), which never forms the logits the compiled metrics "
        f"({', '.join(names)}) read, so the model is compiled without "
        "them; model.evaluate (full logits) still computes them.",
        stacklevel=3,
    )
    return dict(config, metrics=None, weighted_metrics=None)


def _compile_config(plan, model) -> dict:
    """`model`'s compile config, with the plan's optimizer when it has one
    (built from the compiled optimizer's arguments)."""
    from tfmemopt.tuning import _state_options as state_options

    config = model.get_compile_config()
    if not (plan.optimizer or plan.sharding):
        return config
    replicas = state_options.strategy_replicas()
    if plan.sharding and replicas != plan.replicas:
        raise ValueError(
            f"The plan shards the optimizer state over {plan.replicas} "
            f"replicas, but the active strategy has {replicas}. Call "
            "plan.apply(model) inside `strategy.scope()` of the strategy the "
            "plan was made for (ShardedOptimizer must be created there)."
        )
    new = state_options.make_optimizer(
        model.optimizer, plan.optimizer, plan.sharding
    )
    config = dict(config)
    config["optimizer"] = keras.optimizers.serialize(new)
    return config


def measure_plan(plan, model: keras.Model, data) -> int | None:
    """Peak bytes of a few steps of `plan` applied to a copy of `model`."""
    from tfmemopt.tuning._errors import is_oom
    from tfmemopt.tuning._trials import TrialRunner

    applied = apply_plan(plan, model, copy=True)
    try:
        with TrialRunner(applied, data, steps=2) as runner:
            if not runner.stats:
                return None
            peak, oom = runner.run(plan.global_batch_size // plan.replicas)
    except Exception as e:  # noqa: BLE001
        if not is_oom(e):
            raise
        peak, oom = None, str(e)
    finally:
        del applied
        gc.collect()
    if oom:
        return plan.memory_budget + 1
    return peak
