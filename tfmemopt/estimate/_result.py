"""What `estimate_memory` returns."""

from __future__ import annotations

import dataclasses

from tfmemopt._utils import format_bytes

_FIELDS = (
    "parameters",
    "gradients",
    "optimizer_state",
    "accumulation",
    "inputs",
    "activations",
    "temporaries",
    "gathered",
)
_LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "accumulation": "accumulation buffers",
    "inputs": "input batch",
    "activations": "activations kept for backward",
    "temporaries": "backward temporaries",
    "gathered": "gathered weights",
}


@dataclasses.dataclass
class MemoryEstimate:
    """Estimated memory of one training step on one device, in bytes.

    Attributes:
        parameters: Int, all model weights (trainable and not).
        gradients: Int, one gradient per trainable weight.
        optimizer_state: Int, the optimizer's slots (e.g. Adam: 2 per
            weight).
        accumulation: Int, float32 gradient accumulators
            (`accumulation_steps > 1`), and the sparse rows kept for
            embedding gradients.
        inputs: Int, the input batch and the micro-batch being processed.
        activations: Int, forward tensors kept for the backward pass.
        temporaries: Int, what the backward pass (or the optimizer's
            update) needs on top at its peak, including what the
            allocator's whole chunks add (`min_counted_bytes > 0`).
        terms: Dict of named parts of `activations` (bytes, not added to
            the total again): `"logits"`, what the language-model head and
            the loss keep for the backward pass, and `"attention_scores"`,
            what the `MultiHeadAttention` layers keep (what
            `chunked_loss` and `attention="chunked"` act on), read from
            the traced step (with checkpointing, the checkpointed step:
            the scores of attention layers inside a recomputed segment
            are not kept).
        gathered: Int, the whole weights gathered from their shards that
            are alive at the peak (`shard_parameters`; else 0).
        freed: Int, what of the gradients counted above is already freed
            at the peak: the optimizer updates each weight as soon as its
            gradient is made and frees the gradient (or adds it into its
            accumulator), so not every gradient is alive beside the
            activations. Subtracted from the total.
        total: Int, the sum, less `freed`: the estimated peak.
        run_ahead: Int, how much above `total` the peak may go, at most,
            where the step's timing decides it (not in `total`): with
            accumulation, the weight gradients of recurrent layers'
            backward loops whose iterations run ahead of their sums
            (docs/estimator.md); else 0 (and 0 under `shard_parameters`,
            whose micro-batches run one after another, not in a while
            loop). `tfmemopt.plan` keeps
            `total + run_ahead` within the budget.
        compiled: Dict, empty unless the step was compiled with XLA
            (`jit_compile`): XLA's buffer assignment in bytes
            (`"arguments"`, `"temporary"`, `"outputs"`, `"largest"`
            temporary allocation), `"gradients"` (one float32 gradient per
            trainable weight, inside the temporary buffer, for reference)
            and `"compile_seconds"`.
        settings: Dict, the settings the estimate was made for.
        layers: List of `(layer, bytes)`: activations kept, per layer.
        notes: List of str: assumptions and warnings.
    """

    parameters: int
    gradients: int
    optimizer_state: int
    accumulation: int
    inputs: int
    activations: int
    temporaries: int
    settings: dict = dataclasses.field(default_factory=dict)
    layers: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    freed: int = 0
    gathered: int = 0
    terms: dict = dataclasses.field(default_factory=dict)
    run_ahead: int = 0
    compiled: dict = dataclasses.field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(getattr(self, f) for f in _FIELDS) - self.freed

    def to_dict(self) -> dict:
        """Plain-Python dict (JSON-serialisable) with every field, bytes."""
        out = {f: int(getattr(self, f)) for f in _FIELDS}
        out["freed"] = int(self.freed)
        out["terms"] = {k: int(v) for k, v in self.terms.items()}
        out["total"] = int(self.total)
        out["run_ahead"] = int(self.run_ahead)
        out["settings"] = dict(self.settings)
        out["layers"] = [[name, int(n)] for name, n in self.layers]
        out["notes"] = list(self.notes)
        if self.compiled:
            out["compiled"] = dict(self.compiled)
        return out

    def table(self, top: int = 5) -> str:
        """Human-readable breakdown (KiB/MiB/GiB), largest layers, notes."""
        width = max(len(v) for v in _LABELS.values())
        lines = [
            "Estimated training-step memory per device ("
            + ", ".join(f"{k}={v}" for k, v in self.settings.items())
            + ")"
        ]
        for f in _FIELDS:
            if f == "gathered" and not self.gathered:
                continue
            lines.append(
                f"  {_LABELS[f]:<{width}}  {format_bytes(getattr(self, f)):>11}"
            )
            if f == "activations":
                for name, n in self.terms.items():
                    if n:
                        label = "  of which " + name.replace("_", " ")
                        lines.append(
                            f"  {label:<{width}}  {format_bytes(n):>11}"
                        )
        if self.freed:
            freed = "-" + format_bytes(self.freed)
            lines.append(f"  {'freed before the peak':<{width}}  {freed:>11}")
        lines.append(f"  {'total':<{width}}  {format_bytes(self.total):>11}")
        if self.run_ahead:
            more = "+" + format_bytes(self.run_ahead)
            lines.append(f"  {'at most, run ahead':<{width}}  {more:>11}")
        if self.layers and top:
            lines.append("Largest activations kept, by layer:")
            for name, n in sorted(self.layers, key=lambda x: -x[1])[:top]:
                lines.append(f"  {name:<{width}}  {format_bytes(n):>11}")
        for note in self.notes:
            lines.append(f"Note: {note}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
