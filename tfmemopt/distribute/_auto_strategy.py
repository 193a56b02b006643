"""`auto_strategy()`: one call picks the `tf.distribute` strategy.

The decision (`plan_strategy`) is a pure function of an `Environment`, so
every branch is tested on a CPU by injecting what would be detected; building
the strategy is a separate, small step.
"""

from __future__ import annotations

import dataclasses
import logging

import tensorflow as tf

from tfmemopt import _compat
from tfmemopt.distribute._environment import Environment
from tfmemopt.distribute._environment import detect_environment
from tfmemopt.distribute._keras_distribution import check_keras_distribution

logger = logging.getLogger("tfmemopt.distribute")

KINDS = ("active", "tpu", "multi_worker", "mirrored", "default")


@dataclasses.dataclass(frozen=True)
class StrategyPlan:
    """Which strategy to build and why (the output of `plan_strategy`)."""

    kind: str
    reason: str
    tpu: str | None = None
    devices: tuple = ()


def plan_strategy(env: Environment, tpu: str | None = None) -> StrategyPlan:
    """Chooses a strategy kind from `env`; never touches a device or network.

    Order: an active strategy wins; then TPU (explicit `tpu=`, `TPU_NAME`,
    or local TPU devices, resolved as `"local"`); then `TF_CONFIG` with two
    or more workers; then two or more GPUs; else the default strategy.
    """
    if tpu is not None and not isinstance(tpu, str):
        raise TypeError(
            "`tpu` must be a string: a TPU name, a `grpc://host:port` "
            "address, or 'local' on a TPU VM. Received: "
            f"tpu={tpu!r} (of type {type(tpu).__name__})."
        )
    if env.active_strategy is not None:
        return StrategyPlan(
            "active",
            f"a {type(env.active_strategy).__name__} scope is active; "
            "it is used as is",
        )
    if tpu:
        return StrategyPlan("tpu", f"tpu={tpu!r} was passed", tpu=tpu)
    if env.tpu_name:
        return StrategyPlan(
            "tpu", f"TPU_NAME={env.tpu_name!r} is set", tpu=env.tpu_name
        )
    if env.tpu_devices:
        return StrategyPlan(
            "tpu",
            f"{env.tpu_devices} TPU device(s) are visible locally",
            tpu="local",
        )
    if env.cluster_has_ps:
        raise ValueError(
            "`TF_CONFIG` describes a parameter-server cluster (it has `ps` "
            "tasks); tfmemopt supports synchronous data parallelism only. "
            "Use a cluster of `worker` (and optionally `chief`) tasks, or "
            "build `tf.distribute.experimental.ParameterServerStrategy` "
            "yourself. Received cluster: "
            f"{env.tf_config.get('cluster')!r}."
        )
    if env.cluster_workers >= 2:
        return StrategyPlan(
            "multi_worker",
            f"TF_CONFIG lists {env.cluster_workers} workers",
        )
    if len(env.gpus) >= 2:
        return StrategyPlan(
            "mirrored",
            f"{len(env.gpus)} GPUs are visible on this host",
            devices=tuple(env.gpus),
        )
    if len(env.gpus) == 1:
        reason = "one GPU is visible; no distribution needed"
    elif env.cluster_workers == 1:
        reason = "TF_CONFIG lists a single worker and no accelerator"
    else:
        reason = "no TPU, no multi-worker TF_CONFIG and fewer than two GPUs"
    return StrategyPlan("default", reason)


def _build_tpu(plan, cross_device_ops):
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=plan.tpu)
    if plan.tpu != "local":
        tf.config.experimental_connect_to_cluster(resolver)
    try:
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except tf.errors.NotFoundError as e:
        raise RuntimeError(
            f"No TPU was found for tpu={plan.tpu!r} ({plan.reason}). On a "
            "Cloud TPU VM pass tpu='local'; on a TPU node pass its name or "
            "`grpc://host:8470` address; elsewhere unset `TPU_NAME` and do "
            "not pass `tpu=`."
        ) from e
    return tf.distribute.TPUStrategy(resolver)


def _build_multi_worker(plan, cross_device_ops):
    return tf.distribute.MultiWorkerMirroredStrategy()


def _build_mirrored(plan, cross_device_ops):
    return tf.distribute.MirroredStrategy(cross_device_ops=cross_device_ops)


def _build_default(plan, cross_device_ops):
    return tf.distribute.get_strategy()


BUILDERS = {
    "tpu": _build_tpu,
    "multi_worker": _build_multi_worker,
    "mirrored": _build_mirrored,
    "default": _build_default,
}


def auto_strategy(
    tpu: str | None = None,
    cross_device_ops=None,
    *,
    environment: Environment | None = None,
):
    """Picks and builds the `tf.distribute` strategy for this machine.

    Decides, in this order: a strategy whose `scope()` is active wins; then
    a TPU (an explicit `tpu=`, the `TPU_NAME` environment variable, or TPU
    devices visible locally, resolved as `tpu="local"`); then `TF_CONFIG`
    listing two or more workers gives `MultiWorkerMirroredStrategy`; then two
    or more GPUs give `MirroredStrategy`; else the default (single-device)
    strategy. It logs the choice and the reason on the `tfmemopt.distribute`
    logger (`describe(strategy)` says the same afterwards).

    Cost: reading local state only. It never contacts a network address on
    its own: a gRPC address is contacted only when passed as `tpu=` or set
    in `TPU_NAME`. Building a multi-worker strategy starts this worker's
    server and, at the first collective, waits for the other workers.

    Batch semantics: `batch_size` in `fit` is global. Each of the
    `strategy.num_replicas_in_sync` replicas gets `batch_size / replicas`
    samples and a `tfmemopt.Model` splits that into `accumulation_steps`
    micro-batches, so one update sees `batch_size` samples and costs one
    all-reduce.

    Args:
        tpu: String or `None`, defaults to `None`. A TPU name, a
            `grpc://host:port` address, or `"local"` on a Cloud TPU VM.
        cross_device_ops: `tf.distribute.CrossDeviceOps` or `None`, defaults
            to `None` (TensorFlow's choice). Passed to `MirroredStrategy`;
            `tf.distribute.ReductionToOneDevice()` makes
            `steps_per_execution > 1` work with Keras (keras#19246).
        environment: `tfmemopt.distribute.Environment` or `None`, defaults
            to `None` (detect). What to decide on; tests inject it.

    Returns:
        A `tf.distribute.Strategy`. Build the model and compile it inside
        `strategy.scope()`.

    Raises:
        ValueError: `keras.distribution` is set (it does nothing on the
            TensorFlow backend), or `TF_CONFIG` is malformed or describes a
            parameter-server cluster.
        TypeError: `tpu` is not a string, or `environment` is not an
            `Environment`.
        RuntimeError: a TPU was asked for (or `TPU_NAME` is set) and none
            was found.

    Example:

    ```python
    strategy = tfmemopt.distribute.auto_strategy()
    with strategy.scope():
        model = tfmemopt.Model(inputs, outputs, accumulation_steps=4)
        model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=64)  # 64 per update, across all replicas
    ```
    """
    check_keras_distribution()
    if environment is not None and not isinstance(environment, Environment):
        raise TypeError(
            "environment must be a tfmemopt.distribute.Environment or None "
            f"(detect). Received: environment={environment!r} (of type "
            f"{type(environment).__name__}). Leave it out to detect the "
            "devices, TF_CONFIG and TPU."
        )
    env = environment if environment is not None else detect_environment()
    plan = plan_strategy(env, tpu=tpu)
    if plan.kind == "active":
        strategy = env.active_strategy
    else:
        strategy = BUILDERS[plan.kind](plan, cross_device_ops)
    logger.info("auto_strategy: %s because %s", describe(strategy), plan.reason)
    return strategy


def _public_name(strategy) -> str:
    # Internal aliases (CollectiveAllReduceStrategy, TPUStrategyV2) get the
    # name users wrote.
    for cls, public in (
        (tf.distribute.TPUStrategy, "TPUStrategy"),
        (
            tf.distribute.MultiWorkerMirroredStrategy,
            "MultiWorkerMirroredStrategy",
        ),
        (tf.distribute.MirroredStrategy, "MirroredStrategy"),
        (tf.distribute.OneDeviceStrategy, "OneDeviceStrategy"),
    ):
        if isinstance(strategy, cls):
            return public
    name = type(strategy).__name__
    return "default strategy" if name.startswith("_Default") else name


def describe(strategy=None) -> str:
    """One line saying what a strategy is: kind, replicas, devices, workers.

    Cost: reads attributes only; no device work.

    Args:
        strategy: `tf.distribute.Strategy` or `None`, defaults to `None`
            (the current strategy, `tf.distribute.get_strategy()`).

    Returns:
        A string such as `"MirroredStrategy: 2 replicas on 1 worker
        (/job:localhost/replica:0/task:0/device:CPU:0, ...);
        cross-device ops: CollectiveAllReduce"`.

    Raises:
        TypeError: `strategy` is not a `tf.distribute.Strategy`.

    Example:

    ```python
    print(tfmemopt.distribute.describe(tf.distribute.get_strategy()))
    # default strategy: 1 replica on 1 worker (...)
    ```
    """
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(
            "`describe` expects a `tf.distribute.Strategy`. Received: "
            f"strategy={strategy!r} (of type {type(strategy).__name__})."
        )
    name = _public_name(strategy)
    replicas = strategy.num_replicas_in_sync
    try:
        devices = tuple(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError, NotImplementedError):
        devices = ()  # the default strategy has none
    workers = 1
    resolver = getattr(strategy, "cluster_resolver", None)
    task = ""
    if resolver is not None:
        try:
            jobs = resolver.cluster_spec().as_dict()
            workers = max(
                1, len(jobs.get("worker", [])) + len(jobs.get("chief", []))
            )
            if resolver.task_type is not None:
                task = f", this is {resolver.task_type} {resolver.task_id}"
        except (ValueError, KeyError, AttributeError):
            pass
    text = (
        f"{name}: {replicas} replica{'s' if replicas != 1 else ''} on "
        f"{workers} worker{'s' if workers != 1 else ''}{task}"
    )
    if devices:
        text += f" (local devices: {', '.join(devices)})"
    ops = _compat.cross_device_ops(strategy)
    if ops is not None:
        text += f"; cross-device ops: {type(ops).__name__}"
    return text
