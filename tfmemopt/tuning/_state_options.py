"""Optimizer-state options for `plan`: sharding and smaller states.

When the weights, gradients and optimizer state leave too little of the
budget, accumulation, checkpointing and precision cannot help (they shrink
activations). Two things shrink the state itself: `ShardedOptimizer` keeps
1/R of it per replica (the same updates), and `tfmemopt.optimizers` keep
less of it (8-bit moments, factored second moments; other updates). The
planner tries them in that order, least change first; this module lists
them, builds them from the user's optimizer, and describes what they save
in bytes per parameter measured by the estimator's own counting.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import keras

from tfmemopt._utils import format_bytes
from tfmemopt.distribute import ShardedOptimizer
from tfmemopt.estimate import optimizer_state_bytes

BF16 = "bfloat16"
SHARDING = "sharding"
# `tfmemopt.Model(shard_parameters=True)`: weights, gradients and optimizer
# state 1/R per replica (FSDP); an `alternatives` entry's third item.
PARAMETERS = "parameters"
OPTIMIZER_STATE = "optimizer_state"

# 8-bit twins of Keras's Adam-like optimizers (same arguments).
_EIGHT_BIT = {"Adam": "Adam8bit", "AdamW": "AdamW8bit"}
# Not elementwise over a parameter: ShardedOptimizer refuses them.
_UNSHARDABLE = ("Adafactor", "Lamb", "Muon", "ScheduleFreeAdamW")


def strategy_replicas() -> int:
    """Replicas of the active `tf.distribute` strategy (1 outside one)."""
    import tensorflow as tf

    try:
        return int(tf.distribute.get_strategy().num_replicas_in_sync)
    except Exception:  # noqa: BLE001 - planning must not fail on probing
        return 1


def replicas_of(model) -> int:
    """Replicas of the strategy `model` was built under (Keras keeps it as
    `model.distribute_strategy`), else of the active strategy."""
    strategy = getattr(model, "distribute_strategy", None)
    count = getattr(strategy, "num_replicas_in_sync", None)
    return int(count) if count else strategy_replicas()


def unwrap(optimizer):
    """The optimizer that keeps the state (inside LossScale/Sharded)."""
    while isinstance(
        getattr(optimizer, "inner_optimizer", None), keras.optimizers.Optimizer
    ):
        optimizer = optimizer.inner_optimizer
    return optimizer


class Alternative(NamedTuple):
    """One change of the model state `plan` may try: tfmemopt's optimizer
    `name` (None: keep it), `ShardedOptimizer`'s `stage`, the weights
    sharded (`shard_parameters`) or stored in `policy` ("bfloat16")."""

    name: str | None = None
    stage: int | None = None
    shard_parameters: bool = False
    policy: str | None = None


def alternatives(optimizer, allow, replicas, policy="float32") -> list:
    """The `Alternative`s to try, least change first: the optimizer state
    sharded as it is (same updates), the weights sharded too
    (`shard_parameters`, same updates, one all-gather per weight read, per
    micro-batch with accumulation), 8-bit twin, 8-bit sharded, 8-bit with
    the weights sharded, Adafactor (the least state), then, when no
    float32-weight state fits, bfloat16 weights with the 8-bit twin
    (stochastic rounding; a float32 `policy` and 'mixed_precision'
    allowed)."""
    base = unwrap(optimizer)
    name = type(base).__name__
    already = isinstance(optimizer, ShardedOptimizer)
    shard = (
        SHARDING in allow
        and replicas > 1
        and not already
        and name not in _UNSHARDABLE
    )
    small = OPTIMIZER_STATE in allow
    out = []
    if shard:
        out += [Alternative(stage=1), Alternative(shard_parameters=True)]
    if small and name in _EIGHT_BIT:
        twin = _EIGHT_BIT[name]
        out.append(Alternative(twin))
        if shard:
            out.append(Alternative(twin, stage=1))
            out.append(Alternative(twin, shard_parameters=True))
    no_state = name == "SGD" and not base.get_config().get("momentum")
    if small and name != "Adafactor" and not no_state:
        out.append(Alternative("Adafactor"))
    if small and name in _EIGHT_BIT and "mixed_precision" in allow:
        if policy == "float32":  # when no float32-weight state fits
            out.append(Alternative(_EIGHT_BIT[name], policy=BF16))
    return out


def make_optimizer(optimizer, name=None, stage=None):
    """A fresh optimizer: `optimizer`'s class, or tfmemopt's `name` with
    the arguments the two share (learning rate and its schedule, betas,
    epsilon, weight decay, clipping, EMA), wrapped in `ShardedOptimizer`
    when `stage` is set."""
    from tfmemopt import optimizers

    base = unwrap(optimizer)
    config = base.get_config()
    if name is None:
        new = type(base).from_config(config)
    else:
        cls = getattr(optimizers, name)
        accepted = _arguments(cls)
        accepted -= {"name", "gradient_accumulation_steps"}
        if name == "Adafactor":
            # Its defaults: no first moment (the least state), its own
            # second-moment decay and epsilons.
            accepted -= {"beta_1", "beta_2", "epsilon"}
        shared = {k: v for k, v in config.items() if k in accepted}
        new = cls.from_config(shared)
    if stage:
        new = ShardedOptimizer(new, stage=stage)
    return new


def _arguments(cls) -> set:
    """Named arguments of `cls.__init__`, following `**kwargs` into the
    base classes it forwards to (`AdamW8bit(learning_rate, weight_decay,
    *args, **kwargs)` takes Adam8bit's)."""
    names = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names |= {
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names - {"self"}


def describe(optimizer, name=None, stage=None) -> str:
    """`"ShardedOptimizer(Adam, stage=1)"`, `"AdamW8bit"`..."""
    inner = name or type(unwrap(optimizer)).__name__
    return f"ShardedOptimizer({inner}, stage={stage})" if stage else inner


def per_parameter(candidate) -> dict:
    """Bytes per trainable parameter of a candidate's model state."""
    count = max(1, candidate.get("parameter_count", 0))
    state = candidate["optimizer_state"] / count
    rest = (candidate["state"] - candidate["optimizer_state"]) / count
    return {"other": rest, "optimizer_state": state, "total": rest + state}


def state_change_text(before, after, replicas) -> str:
    """Why the optimizer changes, in bytes per parameter per device."""
    b, a = per_parameter(before), per_parameter(after)
    if after["policy"] == BF16 and before["policy"] != BF16:
        return (
            f"the model state with {before['optimizer_name']} "
            f"({b['total']:.2f} bytes per parameter: {b['other']:.2f} "
            f"weights and gradients + {b['optimizer_state']:.2f} optimizer "
            "state) leaves too little of the budget, also with 8-bit "
            "state; bfloat16 weights (policy 'bfloat16') with "
            f"tfmemopt.optimizers.{after['optimizer']} (bf16_update "
            f"stochastic) keep {a['total']:.2f} bytes per parameter "
            f"({a['other']:.2f} weights and gradients + "
            f"{a['optimizer_state']:.2f} optimizer state). What it costs: "
            "2-byte gradients and bfloat16 compute, and weights rounded to "
            "bfloat16 at each update: stochastic rounding reached the "
            "float32-weight loss within the seed spread on the benchmarks "
            "of docs/optimizers.md (an MLP, a small LM), not proven for "
            "every model: compare a few epochs with float32 weights first"
        )
    if after.get("shard_parameters"):
        label = "shard_parameters=True" + (
            f" with {after['optimizer']}" if after["optimizer"] else ""
        )
        return (
            f"the model state with {before['optimizer_name']} "
            f"({b['total']:.2f} bytes per parameter: {b['other']:.2f} "
            f"weights and gradients + {b['optimizer_state']:.2f} optimizer "
            f"state) leaves too little of the budget; {label} keeps 1/"
            f"{replicas} of the weights, gradients and optimizer state per "
            f"replica: {a['total']:.2f} bytes per parameter per replica, "
            "plus the whole weights gathered for the step "
            f"({format_bytes(after.get('gathered', 0))} alive at the peak; "
            "costs one all-gather per weight read, per micro-batch with "
            "accumulation; "
            "see docs/sharding.md)"
        )
    label = describe(None, after["optimizer"], after["sharding"])
    if after["optimizer"] is None:
        label = f"ShardedOptimizer({before['optimizer_name']}, stage=1)"
    text = (
        f"the model state with {before['optimizer_name']} "
        f"({b['total']:.2f} bytes per parameter: {b['other']:.2f} weights "
        f"and gradients + {b['optimizer_state']:.2f} optimizer state) leaves "
        f"too little of the budget; {label} keeps "
        f"{a['optimizer_state']:.2f}"
    )
    if after["sharding"]:
        grads = 4.0  # float32 gradients (parameter_count = gradients / 4)
        full = a["optimizer_state"] * replicas
        text += (
            f" ({full:.2f}/{replicas}, 1/{replicas} per replica): "
            f"{a['total']:.2f} bytes per parameter per replica (stage 2 "
            "would also keep 1/R of the summed gradient, "
            f"{a['other'] - grads:.2f} + {grads + full:.2f}/{replicas} "
            f"= {a['other'] - grads + (grads + full) / replicas:.2f} on "
            "paper; see docs/sharding.md)"
        )
    else:
        text += f": {a['total']:.2f} bytes per parameter"
    return text


def sharding_per_parameter(optimizer="adam", replicas=2) -> dict:
    """The estimator's bytes per float32 parameter per replica, unwrapped
    and sharded (`16 -> 4 + 4 + 8/R` for Adam at stage 1, `4 + 12/R` for
    stage 2 on paper): for `tfmemopt doctor`."""
    opt = keras.optimizers.get(optimizer)
    n = 4096 * replicas
    whole, _ = optimizer_state_bytes(opt, [((n,), "float32")])
    part, _ = optimizer_state_bytes(opt, [((n // replicas,), "float32")])
    state, sharded = whole / n, part / n
    return {
        "optimizer": type(opt).__name__,
        "replicas": replicas,
        "weights": 4.0,
        "gradients": 4.0,
        "optimizer_state": state,
        "unwrapped": 8.0 + state,
        "stage_1": 8.0 + sharded,
        "stage_2": 4.0 + (4.0 + state) / replicas,
        # weights and gradients 1/R each, the state built on the shards
        "shard_parameters": 8.0 / replicas + sharded,
    }


def sharding_lines(s: dict) -> list[str]:
    """`tfmemopt doctor`'s lines for `sharding_per_parameter`'s dict."""
    r = s["replicas"]
    return [
        f"{r} accelerators: under MirroredStrategy each holds the whole "
        f"model state ({s['optimizer']}, float32: {s['unwrapped']:.2f} "
        "bytes per parameter).",
        f"  tfmemopt.ShardedOptimizer keeps 1/{r} of the optimizer state per "
        f"replica: {s['unwrapped']:.2f} -> {s['stage_1']:.2f} bytes per "
        f"parameter (stage 1: {s['weights']:.2f} + {s['gradients']:.2f} + "
        f"{s['optimizer_state']:.2f}/{r}; stage 2 on paper "
        f"{s['weights']:.2f} + "
        f"{s['gradients'] + s['optimizer_state']:.2f}/{r} = "
        f"{s['stage_2']:.2f}).",
        "  tfmemopt.Model(..., shard_parameters=True) shards the weights "
        f"and gradients too (FSDP): {s['unwrapped']:.2f} -> "
        f"{s['shard_parameters']:.2f} bytes per parameter "
        f"({s['unwrapped']:.2f}/{r}), plus the whole weights gathered for "
        "the step (all of them without checkpointing; with it, those "
        "outside the segments and the largest segment's); with "
        "accumulation, float32 accumulators of the shards.",
        "  tfmemopt.plan(model, batch, budget) proposes them when the model "
        "state leaves too little memory (allow 'sharding').",
    ]
