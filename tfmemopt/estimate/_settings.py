"""The arguments of `estimate_memory`, checked and resolved into the
settings of the step it estimates (`Settings`), and `counted`, the one rule
for what an allocator's statistics count (`min_counted_bytes`)."""

from __future__ import annotations

import dataclasses
import math

import keras

from tfmemopt._utils import check_int
from tfmemopt.accumulation import Model
from tfmemopt.distribute import ShardedOptimizer
from tfmemopt.distribute import check_optimizer
from tfmemopt.estimate._optimizer_state import _itemsize
from tfmemopt.estimate._optimizer_state import resolve_optimizer

_POLICIES = (
    "float32",
    "float16",
    "bfloat16",
    "mixed_float16",
    "mixed_bfloat16",
)


_CHECKPOINTING = ("auto", "blocks")


def resolve_policy(policy, model):
    if policy is None:
        return model.dtype_policy
    if isinstance(policy, keras.DTypePolicy):
        return policy
    if isinstance(policy, str) and policy in _POLICIES:
        return keras.DTypePolicy(policy)
    raise ValueError(
        f"Unknown dtype policy {policy!r}. Expected one of "
        f"{', '.join(_POLICIES)}, or a `keras.DTypePolicy`. Fix: pass e.g. "
        "policy='mixed_bfloat16'."
    )


def check_checkpointing(checkpointing):
    if checkpointing in (None, False):
        return None
    if checkpointing is True:
        return "auto"
    if isinstance(checkpointing, str) and checkpointing in _CHECKPOINTING:
        return checkpointing
    if isinstance(checkpointing, int) and not isinstance(checkpointing, bool):
        check_int("checkpointing", checkpointing)
        return checkpointing
    raise ValueError(
        f"Unknown checkpointing policy {checkpointing!r}. Expected None, "
        f"{', '.join(repr(c) for c in _CHECKPOINTING)}, or an integer (layers "
        "per segment). Fix: pass e.g. checkpointing='auto'."
    )


def resolve_settings(
    model,
    batch_size,
    optimizer,
    policy,
    accumulation_steps,
    checkpointing,
    replicas,
    trainer,
    sequence_length,
    min_counted_bytes,
    shard_parameters=None,
) -> Settings:
    """Checks the arguments and resolves them into the step's settings."""
    if accumulation_steps is None:
        accumulation_steps = own_accumulation(model, batch_size, replicas)
    check_counts(model, batch_size, accumulation_steps, replicas)
    trainer = resolve_trainer(trainer, model, accumulation_steps)
    dtype_policy = resolve_policy(policy, model)
    ckpt = check_checkpointing(checkpointing)
    opt, opt_source = resolve_optimizer(optimizer, model)
    per_replica = math.ceil(batch_size / replicas)
    s = Settings(
        policy=dtype_policy,
        checkpointing=ckpt,
        optimizer=opt,
        opt_source=opt_source,
        trainer=trainer,
        accumulation_steps=accumulation_steps,
        per_replica=per_replica,
        micro=math.ceil(per_replica / accumulation_steps),
        compute=_itemsize(dtype_policy.compute_dtype),
        variable=_itemsize(dtype_policy.variable_dtype),
        replicas=replicas,
    )
    if sequence_length is not None:
        check_int("sequence_length", sequence_length)
    s.min_counted_bytes = check_floor(min_counted_bytes)
    s.shard_parameters = check_shard_parameters(shard_parameters, model, s)
    return s


def check_shard_parameters(shard_parameters, model, s):
    """Whether the weights are sharded over the replicas: `None` reads the
    model's own setting; refused where `tfmemopt.Model` refuses it."""
    if shard_parameters is None:
        shard_parameters = bool(getattr(model, "shard_parameters", False))
        if not isinstance(model, Model):
            shard_parameters = False
    if not isinstance(shard_parameters, bool):
        raise TypeError(
            "`shard_parameters` must be None (the model's own setting), True "
            f"or False. Received: shard_parameters={shard_parameters!r} (of "
            f"type {type(shard_parameters).__name__})."
        )
    if not shard_parameters or s.replicas == 1:
        return False  # one replica: nothing is sharded (as in the model)
    if isinstance(s.optimizer, ShardedOptimizer):
        raise ValueError(
            "shard_parameters=True builds the user's own optimizer on the "
            "shards; it does not take a ShardedOptimizer. Fix: pass the "
            "inner optimizer (e.g. optimizer='adamw')."
        )
    inner = s.optimizer
    while isinstance(
        getattr(inner, "inner_optimizer", None), keras.optimizers.Optimizer
    ):
        inner = inner.inner_optimizer
    check_optimizer(inner)
    return True


@dataclasses.dataclass
class Settings:
    """The checked arguments of `estimate_memory` and what follows."""

    policy: keras.DTypePolicy
    checkpointing: object
    optimizer: keras.optimizers.Optimizer
    opt_source: str
    trainer: str
    accumulation_steps: int
    per_replica: int  # samples per replica
    micro: int  # samples per micro-batch
    compute: int  # bytes per activation under the policy
    variable: int  # bytes per float weight under the policy
    replicas: int = 1
    min_counted_bytes: int = 0  # smaller allocations are not counted
    policy_in_place: bool = False  # traced with the policy set on its layers
    shard_parameters: bool = False  # weights sharded over the replicas
    chunked_loss: bool = False  # the loss from the head's input, in chunks
    attention: str | None = None  # "chunked": attention in query blocks
    # How the step was traced checkpointed: "library" (enable_checkpointing
    # applied for the trace), "model" (its own), "refused" (the library
    # refuses the model: no saving), "unbuilt" (traced once to build it,
    # then again checkpointed), None (the rule applies).
    checkpoint_traced: str | None = None
    checkpoint_segments: int = 0  # segments the library made


# oneDNN's CPU allocator (TF_ENABLE_ONEDNN_OPTS=1) serves allocations below
# 256 KiB from a separate small-size allocator that its statistics, read by
# `tf.config.experimental.get_memory_info("CPU:0")`, do not count (measured:
# a 255 KiB tensor adds 0 to `current`, a 256 KiB one 256 KiB).
CPU_STATS_MIN_BYTES = 256 * 1024


def check_floor(min_counted_bytes) -> int:
    if (
        not isinstance(min_counted_bytes, int)
        or isinstance(min_counted_bytes, bool)
        or min_counted_bytes < 0
    ):
        raise ValueError(
            "`min_counted_bytes` must be an int >= 0 (bytes; 0 counts every "
            f"allocation). Received: min_counted_bytes={min_counted_bytes!r}."
            " Fix: pass 0, or CPU_STATS_MIN_BYTES (262144) to compare with "
            "CPU memory statistics."
        )
    return min_counted_bytes


def counted(nbytes: int, s: Settings) -> int:
    """`nbytes` as the allocator's statistics count one allocation."""
    return 0 if nbytes < s.min_counted_bytes else nbytes


def own_accumulation(model, batch_size: int, replicas: int) -> int:
    """The `accumulation_steps` to estimate a `tfmemopt.Model` at: its own,
    or from its `micro_batch_size` `m` the most steps whose micro-batches
    (`ceil(B / steps)`, as the estimate takes them) are no smaller than
    `m` (exact where `m` divides the largest replica's batch `B`, else a
    micro-batch a little larger than `m`, so never an estimate below the
    step that ran); 1 for any other model."""
    if not isinstance(model, Model):
        return 1
    if model.accumulation_steps:
        return int(model.accumulation_steps)
    if model.micro_batch_size:
        per_replica = -(-batch_size // max(1, replicas))
        return max(1, per_replica // model.micro_batch_size)
    return 1


def check_counts(model, batch_size, accumulation_steps, replicas) -> None:
    if not isinstance(model, keras.Model):
        raise TypeError(
            "`model` must be a `keras.Model`. Received: "
            f"model={model!r} (of type {type(model).__name__})."
        )
    check_int("batch_size", batch_size)
    check_int("accumulation_steps", accumulation_steps)
    check_int("replicas", replicas)


def resolve_trainer(trainer, model, accumulation_steps) -> str:
    if trainer is None:
        tfm = isinstance(model, Model) or accumulation_steps > 1
        return "tfmemopt" if tfm else "keras"
    if trainer not in ("keras", "tfmemopt"):
        raise ValueError(
            f"Unknown trainer {trainer!r}. Expected None, 'keras' or "
            "'tfmemopt'. Fix: pass trainer='keras' for `keras.Model.fit`."
        )
    return trainer
