"""`Plan`: the settings `tfmemopt.plan` chose, and how to apply them."""

from __future__ import annotations

import dataclasses

import keras

from tfmemopt._utils import format_bytes
from tfmemopt.tuning._plan_apply import apply_plan


@dataclasses.dataclass
class Plan:
    """Settings that train `global_batch_size` within `memory_budget`.

    Attributes:
        global_batch_size: Int, micro_batch_size x accumulation_steps x
            replicas, exactly as requested.
        micro_batch_size: Int, samples per forward/backward pass per replica.
        accumulation_steps: Int, micro-batches per optimizer update.
        replicas: Int, data-parallel replicas.
        checkpointing: `None` or the checkpointing policy (`"auto"`).
        policy: Str, the dtype policy (`"float32"`, `"mixed_bfloat16"`...).
        estimated_peak: Int, bytes per device (`tfmemopt.estimate_memory`).
        relative_step_time: Float, estimated step time relative to the
            whole batch in float32 without checkpointing (a model, not a
            measurement: see docs/batch_size.md).
        memory_budget: Int, bytes.
        why: Str, why this combination was chosen.
        measured_peak: Int or `None`, bytes measured by `verify=True`.
        considered: List of dicts, every combination estimated.
        optimizer: `None` (keep the optimizer) or the name of the
            `tfmemopt.optimizers` class that replaces it (`"AdamW8bit"`,
            `"Adam8bit"`, `"Adafactor"`), with the shared arguments.
        sharding: `None` or the `tfmemopt.ShardedOptimizer` stage (`1`)
            that wraps the optimizer: 1/`replicas` of its state per replica.
        shard_parameters: Bool, whether the plan shards the weights too
            (`tfmemopt.Model(..., shard_parameters=True)`, FSDP): 1/`replicas`
            of the weights, gradients and optimizer state per replica; in
            `model_kwargs` when set.
        chunked_loss: Bool, whether the plan computes the loss from the
            head's input in chunks (`tfmemopt.Model(..., chunked_loss=
            True)`); in `model_kwargs` when set.
        attention: `None` or `"chunked"` (`tfmemopt.Model(...,
            attention="chunked")`); in `model_kwargs` when set.

    Example:

    >>> p = tfmemopt.plan(model, 256, "16GiB")  # doctest: +SKIP
    >>> p.micro_batch_size * p.accumulation_steps * p.replicas  # doctest: +SKIP
    256
    >>> trainable = p.apply(model)  # doctest: +SKIP
    """

    global_batch_size: int
    micro_batch_size: int
    accumulation_steps: int
    replicas: int
    checkpointing: object
    policy: str
    estimated_peak: int
    relative_step_time: float
    memory_budget: int
    why: str = ""
    measured_peak: int | None = None
    considered: list = dataclasses.field(default_factory=list)
    optimizer: str | None = None
    sharding: int | None = None
    base_optimizer: str = dataclasses.field(default="", repr=False)
    shard_parameters: bool = False
    chunked_loss: bool = False
    attention: str | None = None

    @property
    def model_kwargs(self) -> dict:
        """Arguments for `tfmemopt.Model(...)` / `tfmemopt.Model.wrap(...)`."""
        kwargs = {
            "accumulation_steps": self.accumulation_steps,
            "checkpointing": self.checkpointing,
        }
        if self.shard_parameters:
            kwargs["shard_parameters"] = True
        if self.chunked_loss:
            kwargs["chunked_loss"] = True
        if self.attention:
            kwargs["attention"] = self.attention
        return kwargs

    def apply(self, model: keras.Model) -> keras.Model:
        """A `tfmemopt.Model` that trains `model` with this plan.

        Rebuilds `model` under the plan's dtype policy when it differs
        (weights copied; the last layer keeps its policy so outputs stay
        float32), enables checkpointing on it in place, wraps it with the
        accumulation steps and compiles it as `model` was compiled. Fit the
        result with `batch_size=plan.global_batch_size // plan.replicas`
        per replica (the global batch under a distribution strategy).
        With `optimizer` or `sharding` set it compiles with the new
        optimizer, built from the compiled one's arguments; with `sharding`
        call it inside the strategy's scope; with `shard_parameters` too
        (the weights are sharded when the result is compiled, inside the
        scope).
        """
        return apply_plan(self, model)

    def __str__(self) -> str:
        lines = [
            f"micro_batch_size={self.micro_batch_size} x accumulation_steps="
            f"{self.accumulation_steps} x replicas={self.replicas} = "
            f"global batch {self.global_batch_size}",
            f"checkpointing={self.checkpointing!r}, policy={self.policy!r}"
            + (
                f", optimizer={self.optimizer_name}"
                if self.optimizer or self.sharding
                else ""
            )
            + (", shard_parameters=True" if self.shard_parameters else "")
            + (", chunked_loss=True" if self.chunked_loss else "")
            + (f", attention={self.attention!r}" if self.attention else ""),
            f"estimated peak {format_bytes(self.estimated_peak)} of budget "
            f"{format_bytes(self.memory_budget)}"
            + (
                f", measured {format_bytes(self.measured_peak)}"
                if self.measured_peak is not None
                else ""
            ),
            f"relative step time {self.relative_step_time:.2f}",
            f"why: {self.why}",
        ]
        return "\n".join(lines)

    @property
    def optimizer_name(self) -> str | None:
        """`"ShardedOptimizer(AdamW8bit, stage=1)"`, ... or `None`."""
        if not (self.optimizer or self.sharding):
            return None
        inner = self.optimizer or self.base_optimizer or "the optimizer"
        if self.sharding:
            return f"tfmemopt.ShardedOptimizer({inner}, stage={self.sharding})"
        return f"tfmemopt.optimizers.{inner}"
