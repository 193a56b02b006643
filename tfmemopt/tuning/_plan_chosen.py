"""The `Plan` made from the candidate `plan` chose, and its `why`: the
settings it changes, what the long-sequence options take away, and the
optimizer-state change that made room."""

from __future__ import annotations

from tfmemopt._utils import format_bytes
from tfmemopt._utils import format_mib as _mib
from tfmemopt.tuning import _state_options as state_options
from tfmemopt.tuning._plan import Plan


def _settings_text(c) -> str:
    """A candidate's settings in a few words."""
    parts = [c["policy"]]
    if c["accumulation_steps"] > 1:
        parts.append(f"{c['accumulation_steps']} accumulation steps")
    if c["checkpointing"] is not None:
        parts.append(f"checkpointing {c['checkpointing']!r}")
    if c.get("chunked_loss"):
        parts.append("chunked_loss")
    if c.get("attention"):
        parts.append(f"attention={c['attention']!r}")
    if c.get("optimizer"):
        parts.append(c["optimizer"])
    if c.get("sharding"):
        parts.append(f"ShardedOptimizer stage {c['sharding']}")
    if c.get("shard_parameters"):
        parts.append("shard_parameters")
    return ", ".join(parts)


def _traded_text(best, considered, limit) -> str:
    """What the choice traded: its estimated step time against the next
    fastest candidate that fits (other settings)."""
    if limit is None:
        return ""
    chosen = _settings_text(best)
    others = [
        c
        for c in considered
        if c.get("fit", c["peak"]) <= limit and _settings_text(c) != chosen
    ]
    if not others:
        return ""
    runner = min(others, key=lambda c: (c["time"], c["peak"]))
    return (
        f"; estimated step time {best['time']:.2f}x the whole batch's in "
        f"float32 (estimated peak {_mib(best['peak'])}), the next fastest "
        f"that fits {runner['time']:.2f}x ({_settings_text(runner)}, "
        f"{_mib(runner['peak'])})"
    )


def _make_plan(
    best, global_batch_size, replicas, budget, considered=(), limit=None
):
    steps, ckpt, policy = (
        best["accumulation_steps"],
        best["checkpointing"],
        best["policy"],
    )
    parts = []
    if steps > 1:
        parts.append(
            f"{steps} accumulation steps of {best['micro_batch_size']}"
        )
    if ckpt is not None:
        parts.append(f"checkpointing {ckpt!r}")
    if policy.startswith("mixed"):
        parts.append(policy)
    if best.get("chunked_loss") or best.get("attention"):
        parts.insert(0, _long_sequence_text(best, considered))
    why = (
        "the whole batch fits as it is"
        if not parts
        else "the fastest combination that fits: " + ", ".join(parts)
    )
    if best.get("run_ahead"):
        why += (
            f"; the peak may be up to {_mib(best['run_ahead'])} above the "
            "estimate where recurrent layers' backward loops run ahead in "
            "the accumulation window: the estimate plus that fits the budget"
        )
    kept = [c for c in considered if not _changes_state(c)]
    if kept and _changes_state(best):
        before = min(kept, key=lambda c: c["peak"])
        change = state_options.state_change_text(before, best, replicas)
        why = f"{change}; with it, {why}"
    why += _traded_text(best, considered, limit)
    return Plan(
        global_batch_size=global_batch_size,
        micro_batch_size=best["micro_batch_size"],
        accumulation_steps=steps,
        replicas=replicas,
        checkpointing=ckpt,
        policy=policy,
        estimated_peak=best["peak"],
        relative_step_time=best["time"],
        memory_budget=budget,
        why=why,
        optimizer=best.get("optimizer"),
        sharding=best.get("sharding"),
        base_optimizer=best.get("optimizer_name", ""),
        shard_parameters=bool(best.get("shard_parameters")),
        chunked_loss=bool(best.get("chunked_loss")),
        attention=best.get("attention"),
    )


def _long_sequence_text(best, considered) -> str:
    """What the long-sequence options take away, from the plain step's
    terms (`MemoryEstimate.terms`)."""
    plain = [c for c in considered if not c.get("chunked_loss")]
    plain = [c for c in plain if not c.get("attention")] or considered
    # A checkpointed step keeps no scores inside its recomputed segments.
    plain = [c for c in plain if c["checkpointing"] is None] or plain
    terms = min(plain, key=lambda c: c["peak"]).get("terms", {})
    logits = format_bytes(terms.get("logits", 0))
    scores = format_bytes(terms.get("attention_scores", 0))
    said = []
    if best.get("chunked_loss"):
        said.append(
            "chunked_loss=True (the loss from the head's input in chunks: "
            f"the {logits} the head and the loss keep "
            "for the logits are never formed"
            + (
                "; compiled without its metrics, "
                f"{', '.join(best['drops_metrics'])}, which read the logits: "
                "model.evaluate still computes them)"
                if best.get("drops_metrics")
                else ")"
            )
        )
    if best.get("attention"):
        said.append(
            "attention='chunked' (exact attention in query blocks: the "
            f"{scores} the attention layers "
            "keep are not)"
        )
    return (
        " and ".join(said)
        + ", the same update within float32 rounding, at some step time "
        "(docs/long_sequences.md)"
    )


def _changes_state(c) -> bool:
    """Whether a candidate changes the optimizer or shards the state."""
    return bool(c["optimizer"] or c["sharding"] or c.get("shard_parameters"))
