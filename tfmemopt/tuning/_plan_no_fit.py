"""What `tfmemopt.plan` says when nothing fits: the smallest estimate, the
budget that would fit, and the small-state optimizers it could switch to.
"""

from __future__ import annotations

from tfmemopt._utils import format_bytes
from tfmemopt.tuning import _state_options as state_options


def _bytes(n) -> str:
    """`"1.5 MiB (1,572,864 bytes)"`: exact also for budgets under 0.1 MiB
    (`format_mib` printed "0.0 MiB more than 0.0 MiB")."""
    return f"{format_bytes(n)} ({int(n):,} bytes)"


def _small_state_hint(candidate) -> str:
    """Names tfmemopt's small-state optimizers with their estimated state
    (8-bit moments: 2 + 8/256 bytes per parameter; factored: ~0)."""
    count = candidate.get("parameter_count", 0)
    now = candidate.get("optimizer_state", 0)
    eight = int(count * (2 + 8 / 256))
    if not count or now <= eight:
        return " (SGD keeps none)."
    return (
        f": the optimizer keeps {format_bytes(now)}; "
        f"tfmemopt.optimizers.AdamW8bit keeps about {format_bytes(eight)} "
        "(8-bit moments), tfmemopt.optimizers.Adafactor a row and a column "
        "per matrix (factored), SGD none."
    )


def _changes_state(c) -> bool:
    return bool(c["optimizer"] or c["sharding"] or c.get("shard_parameters"))


def _peak(c) -> int:
    return c["peak"]


def _kept(considered) -> list:
    """The candidates that keep the optimizer (all, if none does)."""
    kept = [c for c in considered if not _changes_state(c)]
    return kept or considered


def _optimizer_label(c) -> str:
    """`"Adam8bit"`, `"tfmemopt.ShardedOptimizer(Adam, stage=1)"`, with
    `" with shard_parameters=True"`: the optimizer a candidate tried."""
    label = state_options.describe(
        None, c["optimizer"] or c["optimizer_name"], c["sharding"]
    )
    if c.get("shard_parameters"):
        label += " with shard_parameters=True"
    return label


def _state_label(c) -> str:
    """`"Adam8bit, policy 'bfloat16'"`: how a candidate's state was
    made."""
    return f"{_optimizer_label(c)}, policy {c['policy']!r}"


def _tried_text(considered) -> str:
    """`" Tried too: AdamW8bit (smallest 2.9 MiB), ..."` or `""`."""
    tried = {}
    for c in considered:
        if _changes_state(c):
            label = _optimizer_label(c)
            tried[label] = min(tried.get(label, c["peak"]), c["peak"])
    if not tried:
        return ""
    return " Tried too: " + ", ".join(
        f"{k} (smallest estimate {format_bytes(v)})" for k, v in tried.items()
    )


def raise_no_fit(considered, budget, global_batch_size, scale, margin):
    smallest = min(considered, key=lambda c: c["state"])
    state = smallest["state"]
    least = min(considered, key=lambda c: c.get("fit", c["peak"]))
    # The budget at which the smallest candidate would be chosen (its
    # `"fit"`: its peak, or more where recurrent loops may run ahead).
    needed = least.get("fit", least["peak"]) * scale / (1 - margin)
    if state >= budget:
        own = min(_kept(considered), key=lambda c: c["state"])
        raise ValueError(
            "The model cannot fit at any batch size: its weights, gradients "
            f"and optimizer state alone take {_bytes(own['state'])} "
            "(estimated)"
            + (
                f", {_bytes(state)} with {_state_label(smallest)} (the "
                "smallest state tried)"
                if smallest is not own
                else ""
            )
            + f", more than memory_budget={_bytes(budget)}. Accumulation, "
            "checkpointing and mixed precision only shrink activations. "
            f"Raise memory_budget to at least {format_bytes(needed)} (the "
            f"smallest plan, {_bytes(least['peak'])} estimated"
            + (f" with {_state_label(least)}" if _changes_state(least) else "")
            + f", plus margin={margin}), use more replicas with sharded "
            "state, a smaller model, or an optimizer with less state"
            + _small_state_hint(min(_kept(considered), key=_peak))
            + _tried_text(considered)
        )
    measured = (
        f" (x {scale:.2f}, the ratio measured/estimated by verify)"
        if scale != 1.0
        else ""
    )
    raise ValueError(
        f"No allowed combination trains global_batch_size={global_batch_size}"
        f" within memory_budget={_bytes(budget)}: the smallest estimate is "
        f"{_bytes(least['peak'] * scale)}{measured} (micro-batch "
        f"{least['micro_batch_size']}, "
        f"checkpointing={least['checkpointing']!r}, policy="
        f"{least['policy']!r}"
        + _run_ahead_text(least)
        + f"), more than the budget less margin={margin} "
        f"({_bytes(budget * (1 - margin))}). Raise memory_budget to at least "
        f"{format_bytes(needed)}, lower margin, or allow more techniques "
        f"(tried policies {sorted({c['policy'] for c in considered})}, "
        "checkpointing "
        + ("too" if any(c["checkpointing"] for c in considered) else "off")
        + ")."
        + _state_over_limit(considered, budget * (1 - margin))
    )


def _state_over_limit(considered, limit) -> str:
    """Names the small-state optimizers when the model state alone is over
    the budget less margin (only shrinking activations cannot fit)."""
    kept = min(_kept(considered), key=_peak)
    if kept["state"] <= limit:
        return ""
    return (
        f" The weights, gradients and optimizer state alone take "
        f"{_bytes(kept['state'])}, more than that: allow 'optimizer_state' "
        "or 'sharding', or use an optimizer with less state"
        + _small_state_hint(kept)
        + _tried_text(considered)
    )


def _run_ahead_text(c) -> str:
    """`", and up to X more ..."` where recurrent loops may run ahead."""
    if not c.get("run_ahead"):
        return ""
    return (
        f", and up to {_bytes(c['run_ahead'])} more where recurrent layers' "
        "backward loops run ahead, which must fit the whole budget"
    )
