"""The table of benchmarks/estimator_accuracy.py, and its CPU-specific rows."""

from __future__ import annotations

import statistics

MIB = 2**20


# Cases where the CPU itself, not the estimate, sets the measured peak. They
# are measured and shown, and summarised apart; the estimator models what an
# accelerator does and is not bent towards them.
CPU_SPECIFIC = {
    "bf16": (
        "no 16-bit kernels on this CPU (oneDNN has none without AVX-512; "
        "TensorFlow falls back to Eigen, which computes in float32 "
        "temporaries), so the measured mixed_bfloat16 peak is not the 2-byte "
        "model's, which is what accelerators with 16-bit kernels do: see the "
        "`/ base` column ({bf16_range} of the float32 step outside the "
        "LSTM), no rule that would make a principled CPU correction"
    ),
    "rnn": (
        "CPU allocator: oneDNN's allocator statistics do not count "
        "allocations below 256 KiB (measured by hand: a 255 KiB tensor adds "
        "0 to `current`, a 256 KiB one adds 256 KiB); the LSTM's while loop "
        "allocates one time step at a time (states of batch x 128 floats: "
        "64 KiB at batch 128; gates of batch x 512 floats reach 256 KiB only "
        "at batch 128), so much of its memory is invisible to the "
        "measurement and its peaks jump with the batch"
    ),
}


def cpu_specific(row):
    """The CPU_SPECIFIC keys that explain `row` (", "-joined), or None."""
    tags = []
    if row["model"] == "lstm":
        tags.append("rnn")
    if row["variant"] == "mixed_bfloat16":
        tags.append("bf16")
    return ", ".join(tags) or None


def _summary(errors):
    if not errors:
        return "no cases"
    return (
        f"{len(errors)} cases, median absolute error "
        f"{statistics.median(errors):.1%}, worst {max(errors):.1%}; "
        f"{sum(e <= 0.15 for e in errors)} within 15%, "
        f"{sum(e <= 0.35 for e in errors)} within 35%"
    )


def write_table(rows, models):
    """Writes the `estimator_accuracy` section of BENCHMARKS.md."""
    from _report import table
    from _report import write_section

    body, errors, general, special = [], [], [], []
    base = {
        (r["model"], r["batch"]): r["measured"]
        for r in rows
        if r["variant"] == "base"
    }
    for r in rows:
        m = r["measured"]
        tag = cpu_specific(r)
        if not m:
            body.append(
                [r["model"], r["variant"], r["batch"]]
                + ["-"] * 4
                + [r["error"] or "not measured"]
            )
            continue
        err = (r["estimate"] - m) / m
        errors.append(abs(err))
        (general if tag is None else special).append(abs(err))
        spread = (max(r["peaks"]) - min(r["peaks"])) / m
        f32 = base.get((r["model"], r["batch"]))
        ratio = f"{m / f32:.2f}" if f32 and r["variant"] != "base" else ""
        note = f"CPU-specific ({tag})" if tag else ""
        if r["error"]:
            note = f"{note} {r['error']}".strip()
        body.append(
            [
                r["model"],
                r["variant"],
                r["batch"],
                f"{m / MIB:.1f}",
                f"{r['estimate'] / MIB:.1f}",
                f"{err:+.1%}",
                f"{spread:.0%}",
                ratio,
                note,
            ]
        )
    missing = [m for m in models if m not in {r["model"] for r in rows}]
    summary = (
        (
            f"Not measured in this run: {', '.join(missing)}.\n\n"
            if missing
            else ""
        )
        + f"- **Excluding the CPU-specific cases** (below): "
        f"{_summary(general)}.\n"
        f"- All cases, CPU-specific ones included: {_summary(errors)}.\n"
        f"- CPU-specific cases alone: {_summary(special)}.\n"
    )
    ratios = [
        r["measured"] / base[(r["model"], r["batch"])]
        for r in rows
        if r["variant"] == "mixed_bfloat16"
        and r["model"] != "lstm"
        and r["measured"]
        and base.get((r["model"], r["batch"]))
    ]
    bf16_range = (
        f"{min(ratios):.2f}x to {max(ratios):.2f}x" if ratios else "n/a"
    )
    notes = "".join(
        f"- CPU-specific ({k}): {v.format(bf16_range=bf16_range)}.\n"
        for k, v in CPU_SPECIFIC.items()
    )
    small = {}
    for r in rows:
        for n in r["breakdown"].get("notes", []):
            if n.startswith("small_state="):
                small[r["model"]] = int(n.split("=")[1])
    if small:
        notes += (
            "- Every row: the same allocator statistics miss allocations "
            "below 256 KiB, and the estimate counts them. Model state "
            "(weights, gradients, Adam slots) in such allocations: "
            + ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in small.items())
            + "; activations below 256 KiB are missed too at the smallest "
            "batches. This pushes the error up at small batch sizes; the "
            "errors above are not corrected for it.\n"
        )
    text = (
        "Estimated total against the measured peak of one training step "
        "(CPU allocator via oneDNN, median of 3 steps after a warm-up, above "
        "the usage before the model was built; Adam; `tfmemopt.Model`, "
        "micro-batches strictly one at a time). Variants at the middle batch "
        "size. `spread`: range of the 3 peaks; `/ base`: the variant's "
        "measured peak over the plain float32 step at the same batch. "
        "Measured on a shared 2-core machine, other jobs running.\n\n"
        + summary
        + "\n"
        + notes
        + "\n"
        + table(
            [
                "model",
                "variant",
                "batch",
                "measured MiB",
                "estimate MiB",
                "error",
                "spread",
                "/ base",
                "note",
            ],
            body,
        )
    )
    write_section("estimator_accuracy", text)
