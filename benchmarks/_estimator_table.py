"""The table of benchmarks/estimator_accuracy.py."""

from __future__ import annotations

import inspect
import math
import statistics

MIB = 2**20


# What the measurement can and cannot see (measured by hand, see
# estimator_accuracy.py); printed under the table.
NOTES = (
    "Allocator statistics: oneDNN's CPU allocator does not count "
    "allocations below 256 KiB (a 255 KiB tensor adds 0 to `current`, a "
    "256 KiB one 256 KiB), and it counts whole chunks (a 3 MiB tensor "
    "placed in a freed 4 MiB chunk adds 4 MiB), so a peak depends on what "
    "ran before in the process: each case runs in a fresh process (the "
    "mlp's mixed_bfloat16 step at batch 2048 measured 54.6 to 66.7 MiB "
    "after different earlier cases in one process; 80.5 MiB in the "
    "previous run of this table).",
    "LSTM: 32 steps of 512 features, 512 units, batches 128/512/1024, so "
    "that every per-step tensor (batch x 512) is >= 256 KiB at every batch, "
    "in the micro-batches of 128 of the accumulation case and in bfloat16 "
    "at batch 512; the measurement sees them. The estimate sizes the "
    "TensorLists that `while_v2` keeps per time step. tfmemopt.Model's "
    "train step takes its gradient with a non-persistent tape, as Keras "
    "does (until this run it used a persistent tape, with which TensorFlow "
    "keeps every intermediate of the loop body: the LSTM's step measured "
    "799 MiB at batch 512 and 676 MiB with 4 micro-batches, now 327 and "
    "149 MiB).",
    "mixed_bfloat16: estimated on the model rebuilt under the policy (a "
    "model with keras-io layers, which cannot be rebuilt: with the policy "
    "set on its layers for the trace). "
    "Keras keeps BatchNormalization, LayerNormalization, Embedding lookups "
    "and the loss in float32 and the gradient of each cast is a cast: "
    "these float32 copies, not CPU kernels, are why a BatchNorm CNN or an "
    "embedding model saves little. This CPU reports avx512_bf16 and "
    "amx_bf16; single bfloat16 ops run eagerly (MatMul, Conv2D and their "
    "gradients) allocated no float32 copies. Not modelled: in graph mode "
    "oneDNN's fused bfloat16 MatMul+BiasAdd takes a scratchpad of about 3x "
    "its output during the call (found for issue #5), a transient of one "
    "op.",
    "Modelled for issue #16, each found in the allocator's own trace of "
    "measured steps (tf.profiler: every allocation with its op and its "
    "chunk): (1) whole chunks: the BFC allocator hands out a free chunk "
    "whole when it is under twice the request; the embedding model at "
    "batch 64 held its 9.8 MiB update temporaries in 16 MiB chunks and its "
    "table and Adam slots in 9.8 + 16 + 12.5 MiB (68 MiB measured, 50.8 "
    "estimated before). The estimate replays the weights, the optimizer "
    "slots and two steps through a model of the allocator (regions from 2 "
    "MiB, doubling; best fit; split at twice the request; 256-byte units) "
    "and adds what the chunks add at the peak. It replays one order: the "
    "executor's order changes between steps, and with it the chunks (the "
    "text transformer at batch 32 held 16 MiB tensors in 20, 22 and 28 MiB "
    "chunks); (2) each weight's Adam update runs, and frees the weight's "
    "gradient, while the backward pass goes on (ResNet50 checkpointed: "
    "its 88.5 MiB of gradients were never all alive at once); (3) "
    "Grappler's memory optimizer turned the cnn's largest 3-input gradient "
    "sum (AddN, 64 MiB at batch 512) into an accumulation into a temporary "
    "variable whose zeros stay allocated for the whole run "
    "(`AddN_5/tmp_var_zeros`, 64 MiB); it rewrites the sums with an input "
    "alive at its estimated peak when that peak is above 0.8 of the "
    "device's memory, which is 256 MiB for a CPU device (its attributes' "
    "memory_limit, whatever the RAM): not at batches 32 and 128. The "
    "estimate adds the sums alive at its own simulated peak when that "
    "peak is above 0.8 x 256 MiB.",
    "Not modelled: (1) oneDNN's MaxPool keeps "
    "a workspace of 1 byte per output element; (2) the executor runs "
    "independent backward ops on two threads, so more gradient "
    "temporaries are alive at once than one op at a time (the cnn's "
    "BatchNorm gradient branches).",
)


def _summary(errors):
    if not errors:
        return "no cases"
    return (
        f"{len(errors)} cases, median absolute error "
        f"{statistics.median(errors):.1%}, worst {max(errors):.1%}; "
        f"{sum(e <= 0.15 for e in errors)} within 15%, "
        f"{sum(e <= 0.35 for e in errors)} within 35%"
    )


def _signed(r):
    return (r["estimate"] - r["measured"]) / r["measured"]


def distribution(rows, margin):
    """The held-out sets together, as a user planning a budget reads them:
    how many cases are within 5 to 25% of their measured peak, the |error|
    at the 50th to 99th percentile (nearest rank), and how many measured
    peaks fit a budget that `plan` would fill with the estimate: the
    estimate at most `1 - margin` of the budget and, since 9637f64, the
    estimate plus its `run_ahead` bound at most the whole budget."""
    kept = [r for r in rows if r.get("measured") and not r.get("error")]
    if not kept:
        return "no cases"
    absolute = sorted(abs(_signed(r)) for r in kept)
    n = len(absolute)

    def rank(q):
        return absolute[max(0, math.ceil(q * n) - 1)]

    def fits(r):
        est = r["estimate"]
        ahead = r["breakdown"].get("run_ahead", 0)
        budget = max(est / (1 - margin), est + ahead)
        return r["measured"] <= budget

    within = ", ".join(
        f"{sum(e <= t for e in absolute)} within {t:.0%}"
        for t in (0.05, 0.10, 0.12, 0.15, 0.20, 0.25)
    )
    quantiles = ", ".join(
        f"{q:.0%} {rank(q):.1%}" for q in (0.5, 0.9, 0.95, 0.99)
    )
    return (
        f"{n} cases; {within}; |error| by percentile: {quantiles}, worst "
        f"{absolute[-1]:.1%}; the measured peak fits a budget `plan` fills "
        f"at its margin of {margin:.2f} (and `run_ahead`) in "
        f"{sum(fits(r) for r in kept)} of {n}"
    )


def _plan_margin():
    """`tfmemopt.plan`'s default margin, read from its signature."""
    import tfmemopt

    return inspect.signature(tfmemopt.plan).parameters["margin"].default


def summarize(rows):
    """One set's figures: median |error|, worst, signed median and mean
    (bias), how many over and under, how many within 15%. A row with an
    `error` (the setting could not be applied to the measured model, so
    the step measured is not the one estimated) is left out and named."""
    errs = [
        _signed(r) for r in rows if r.get("measured") and not r.get("error")
    ]
    apart = [
        f"{r['model']} {r['variant']} B={r['batch']} ({r['error']})"
        for r in rows
        if r.get("measured") and r.get("error")
    ]
    if not errs:
        return "no cases"
    absolute = [abs(e) for e in errs]
    return (
        f"{len(errs)} cases, median |error| "
        f"{statistics.median(absolute):.1%}, worst {max(absolute):.1%}, "
        f"signed median {statistics.median(errs):+.1%}, "
        f"signed mean {statistics.mean(errs):+.1%} "
        f"({sum(e > 0 for e in errs)} over, {sum(e < 0 for e in errs)} "
        f"under); {sum(e <= 0.15 for e in absolute)} within 15%"
        + (
            f"; left out, the step measured is not the one estimated: "
            f"{', '.join(apart)}"
            if apart
            else ""
        )
    )


SETS = (
    (
        "design",
        "the models the estimator's rules were found and checked on, Adam",
    ),
    (
        "heldout",
        "model families no rule was designed on, Adam and SGD with "
        "momentum 0.9; three defects were found and fixed on it, so it is "
        "no longer unseen; "
        "benchmarks/_estimator_heldout.py says why each is held out",
    ),
    (
        "heldout2",
        "model families in neither set above, fixed before it was "
        "measured, measured once (each case the median of 3 runs in "
        "fresh processes) with the estimator at be52d2f; since used to "
        "find three defects (sparse rows under accumulation, the sparse "
        "update, the T5 checkpointing cut), so it is no longer unseen; "
        "benchmarks/_estimator_heldout2.py says why each is new",
    ),
    (
        "heldout3",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with the rules final "
        "(8b642fb: median 8.1%, worst 27.6%, 14 over / 18 under); since used "
        "to find two defects (Grappler's rewrite, PointNet; the merging of "
        "identical ops, WaveNet and DeBERTa), so it is no longer unseen; "
        "benchmarks/_estimator_heldout3.py says why each is new",
    ),
    (
        "heldout4",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with the rules final "
        "(99d2b63: median 3.4%, worst 21.6%, 5 over / 23 under); since used "
        "to check the merging of identical ops (Gemma's trace), so it is no "
        "longer unseen; benchmarks/_estimator_heldout4.py says why each is "
        "new",
    ),
    (
        "heldout5",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with the rules final "
        "(430888d: median 6.5%, worst 32.6%, 10 over / 19 under); since used "
        "to find one defect (the compiled loss, Falcon under "
        "mixed_bfloat16), so it is no longer unseen; "
        "benchmarks/_estimator_heldout5.py says why each is new; the goal of "
        "issue #23: median |error| <= 6%, worst <= 12%, no one-sided bias",
    ),
    (
        "heldout6",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with the rules final "
        "(3ff4a1e); benchmarks/_estimator_heldout6.py says why each is new; "
        "the goal of issue #23: median |error| <= 6%, worst <= 12%, no "
        "one-sided bias",
    ),
    (
        "heldout7",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with checkpointing traced "
        "(8bd9124); benchmarks/_estimator_heldout7.py says why each is new; "
        "the goal of issue #23: median |error| <= 6%, worst <= 12%, no "
        "one-sided bias",
    ),
    (
        "heldout8",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with 3f3399f's rules "
        "(ed2d973), shown with what needs nothing of the batch replayed "
        "first; benchmarks/_estimator_heldout8.py says why each is new; the "
        "goal of issue #23: median |error| <= 6%, worst <= 12%, no "
        "one-sided bias",
    ),
    (
        "heldout9",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with 9669124's rules "
        "(9ac5365); benchmarks/_estimator_heldout9.py says why each is new; "
        "the goal of issue #23: median |error| <= 6%, worst <= 12%, no "
        "one-sided bias",
    ),
    (
        "heldout10",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with 9669124's rules "
        "(3bc369b: median 5.2%, worst 19.2%, 5 over / 24 under); its AdamW "
        "cases estimated again with the weight decay's copy (4b99103), so "
        "it is no longer unseen; benchmarks/_estimator_heldout10.py says "
        "why each is new; the goal of issue #23: median |error| <= 6%, "
        "worst <= 12%, no one-sided bias",
    ),
    (
        "heldout11",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with 4b99103's rules "
        "(9669124's and the weight decay's copy, added after set 10); "
        "benchmarks/_estimator_heldout11.py says why each is new; the goal "
        "of issue #23: median |error| <= 6%, worst <= 12%, no one-sided bias",
    ),
    (
        "heldout12",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with 8ccfd19's rules (the "
        "same totals as 4b99103's: median 2.9%, worst 54.6%, 10 over / 15 "
        "under); its LSTM autoencoder with accumulation estimated again "
        "with no Grappler rewrite in the window's loop, so it is no longer "
        "unseen; "
        "benchmarks/_estimator_heldout12.py says why each is new; the goal "
        "of issue #23: median |error| <= 6%, worst <= 12%, no one-sided bias",
    ),
    (
        "heldout13",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with 7d9989f's rules (the "
        "last change, no Grappler rewrite in the window's loop, found on "
        "set 12: median 2.7%, worst 23.4%, 11 over / 16 under); its "
        "PSPNet-like net under mixed_bfloat16 traced then, and estimated "
        "again with bf1f4ce's folded constants and forward-pass gradient "
        "ops, so it is no longer unseen; "
        "benchmarks/_estimator_heldout13.py says why each is new; "
        "the goal "
        "of issue #23: median |error| <= 6%, worst <= 12%, no one-sided bias",
    ),
    (
        "heldout14",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with bf1f4ce's rules "
        "(the constants Grappler folds and the gradient ops of the forward "
        "pass, found on set 13); benchmarks/_estimator_heldout14.py says "
        "why each is new; "
        "the goal of issue #23: median |error| <= 6%, worst <= 12%, no "
        "one-sided bias",
    ),
    (
        "heldout15",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), "
        "estimated once with c03d06f's rules (the lingering update, found "
        "on set 14's FlowNetS-like net); "
        "benchmarks/_estimator_heldout15.py says why each is new; "
        "the goal of issue #23: median |error| <= 6%, worst <= 12%, no "
        "one-sided bias",
    ),
    (
        "heldout16",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), "
        "estimated once with c03d06f's rules, as set 15; "
        "benchmarks/_estimator_heldout16.py says why each is new; "
        "the goal of issue #23: median |error| <= 6%, worst <= 12%, no "
        "one-sided bias",
    ),
    (
        "heldout17",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), kept unseen through the review of "
        "c03d06f (d0959d6) and estimated once with b4c786a's rules (those "
        "of d0959d6); benchmarks/_estimator_heldout17.py says "
        "why each is new; the goal of issue #23: median |error| <= 6%, "
        "worst <= 12%, no one-sided bias",
    ),
    (
        "heldout18",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with 8e405a0's rules "
        "(an update beside the backward pass frees its gradient early; "
        "with the rules before it: median 4.8%, worst 43.2%); "
        "benchmarks/_estimator_heldout18.py says "
        "why each is new; the goal of issue #23: median |error| <= 6%, "
        "worst <= 12%, no one-sided bias",
    ),
    (
        "heldout19",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), estimated once with 5c8d643's rules "
        "(a sparse gradient's rows in its update; with the rules before "
        "it the same estimate for every case); "
        "benchmarks/_estimator_heldout19.py says "
        "why each is new; the goal of issue #23: median |error| <= 6%, "
        "worst <= 12%, no one-sided bias",
    ),
    (
        "heldout20",
        "model families in none of the sets above, fixed before it was "
        "measured, measured without an estimate (each case the median of 3 "
        "runs in fresh processes), kept unseen while a rule found on set "
        "19 was tried and dropped, estimated once with 5c8d643's rules "
        "(with the dropped rule: median 4.4%, worst 22.8%); "
        "benchmarks/_estimator_heldout20.py says "
        "why each is new; the goal of issue #23: median |error| <= 6%, "
        "worst <= 12%, no one-sided bias",
    ),
)

# Both sets before and after the changes of issue #23 (the same stored
# measurements, re-estimated), printed above the per-set figures.
HISTORY = """\
Before and after issue #23 (held-out measurements: the median of 3 runs,
each in fresh processes; the same measurements estimated by the estimator
on main before #23, at be52d2f, at 8b642fb, at 99d2b63 (the design,
first and second sets read the same at 99d2b63 as at 8b642fb), at
430888d (identical forward ops merged), at 69641c4 (the compiled
loss traced), at 3ff4a1e (held blocks cut; no stored case moved), at
d8c57ea, at 4b99103 (the weight decay's copy; only AdamW cases moved),
at 7d9989f (no Grappler rewrite in the window's loop; one case moved) and
at bf1f4ce (the constants Grappler folds, the gradient ops of the forward
pass; with 09efac1's review, the same figures, 34 cases moved) and at
c03d06f (the lingering update, 107 cases moved), at d0959d6 (its review:
3 cases moved), at b4c786a (the same rules) and at 8e405a0 (an update
beside the backward pass frees its gradient before its second temporary:
97 cases moved) and at 5c8d643 (the update of a sparse gradient copies
its rows when it reads them twice, and holds them while it runs: 8 cases
moved); "dropped rule": an input whose other readers are its op's
ancestors written over, found on set 19, tried and not kept;
docs/estimator.md says what changed):

| set | estimator | n | median abs | worst | signed median | over/under | <15% |
|---|---|---|---|---|---|---|---|
| design | before #23 | 66 | 3.1% | 13.3% | -2.1% | 18 / 47 | 66 |
| design | be52d2f | 66 | 3.1% | 13.3% | -2.1% | 19 / 46 | 66 |
| design | 8b642fb | 66 | 3.1% | 13.3% | -2.1% | 19 / 46 | 66 |
| held-out | before #23 | 28 | 10.9% | 137.5% | -2.2% | 12 / 16 | 17 |
| held-out | be52d2f | 28 | 8.6% | 24.8% | -4.2% | 6 / 22 | 23 |
| held-out | 8b642fb | 28 | 7.3% | 36.2% | -4.2% | 5 / 23 | 23 |
| held-out 2 | be52d2f | 27 | 3.6% | 23.9% | -2.9% | 7 / 20 | 25 |
| held-out 2 | 8b642fb | 28 | 3.4% | 19.3% | -2.9% | 7 / 21 | 27 |
| held-out 3 | 8b642fb, once | 32 | 8.1% | 27.6% | -3.5% | 14 / 18 | 21 |
| held-out 3 | 99d2b63 | 32 | 8.1% | 27.6% | -3.5% | 14 / 18 | 21 |
| held-out 4 | 99d2b63, once | 28 | 3.4% | 21.6% | -2.8% | 5 / 23 | 23 |
| design | 430888d | 66 | 3.1% | 13.3% | -2.1% | 19 / 46 | 66 |
| held-out 2 | 430888d | 28 | 3.8% | 19.3% | -2.9% | 7 / 21 | 27 |
| held-out 3 | 430888d | 32 | 6.5% | 27.6% | -5.0% | 6 / 26 | 24 |
| held-out 4 | 430888d | 28 | 5.0% | 20.1% | -3.4% | 5 / 23 | 23 |
| held-out 5 | 430888d, once | 29 | 6.5% | 32.6% | -3.2% | 10 / 19 | 20 |
| held-out 4 | 69641c4 | 28 | 4.4% | 20.1% | -3.4% | 4 / 24 | 24 |
| held-out 5 | 69641c4 | 29 | 5.9% | 32.6% | -3.2% | 10 / 19 | 21 |
| held-out 6 | 3ff4a1e, once | 26 | 4.4% | 26.4% | -3.0% | 9 / 17 | 24 |
| held-out 1-10 | d8c57ea | 285 | 4.1% | 36.2% | -2.0% | 92 / 186 | 260 |
| held-out 1-10 | 4b99103 | 285 | 4.1% | 36.2% | -1.9% | 94 / 184 | 261 |
| AdamW cases of 3-10 | d8c57ea | 23 | 3.4% | 19.2% | -3.2% | 4 / 19 | 21 |
| AdamW cases of 3-10 | 4b99103 | 23 | 3.1% | 19.2% | -1.9% | 6 / 17 | 22 |
| design | 4b99103 | 66 | 2.6% | 13.3% | -0.6% | 26 / 40 | 66 |
| held-out 11 | 4b99103, once | 26 | 5.0% | 42.9% | -0.9% | 11 / 15 | 25 |
| held-out 12 | 8ccfd19, once | 26 | 2.9% | 54.6% | -1.1% | 10 / 15 | 23 |
| held-out 12 | 7d9989f | 26 | 2.4% | 23.6% | -1.1% | 10 / 15 | 24 |
| held-out 13 | 7d9989f, once | 27 | 2.7% | 23.4% | -1.0% | 11 / 16 | 24 |
| design | bf1f4ce | 66 | 2.6% | 13.3% | -0.6% | 26 / 40 | 66 |
| held-out 1-13 | 7d9989f | 364 | 3.7% | 42.9% | -1.7% | 126 / 230 | 334 |
| held-out 1-13 | bf1f4ce | 364 | 4.0% | 42.9% | -1.6% | 130 / 227 | 335 |
| held-out 13 | bf1f4ce | 27 | 2.5% | 15.2% | -1.0% | 10 / 17 | 25 |
| held-out 14 | bf1f4ce, once | 26 | 4.1% | 21.6% | -3.8% | 4 / 21 | 23 |
| design | c03d06f | 66 | 2.7% | 13.3% | -0.3% | 29 / 37 | 66 |
| held-out 1-13 | c03d06f | 364 | 4.0% | 42.9% | -1.4% | 138 / 218 | 336 |
| held-out 14 | c03d06f | 26 | 2.9% | 17.4% | -2.9% | 4 / 21 | 25 |
| held-out 15 | c03d06f, once | 24 | 2.9% | 16.0% | -1.8% | 9 / 15 | 23 |
| held-out 16 | c03d06f, once | 24 | 5.0% | 37.5% | -4.2% | 5 / 19 | 21 |
| design | d0959d6 | 66 | 2.7% | 13.3% | -0.3% | 29 / 37 | 66 |
| held-out 1-16 | d0959d6 | 438 | 4.0% | 42.9% | -1.6% | 156 / 273 | 405 |
| held-out 17 | b4c786a, once | 24 | 5.5% | 13.5% | -1.9% | 9 / 15 | 24 |
| held-out 1-17 | b4c786a | 462 | 4.1% | 42.9% | -1.6% | 165 / 288 | 429 |
| design | 8e405a0 | 66 | 2.7% | 13.3% | -0.4% | 28 / 38 | 66 |
| held-out 1-16 | 8e405a0 | 438 | 4.0% | 42.9% | -2.0% | 149 / 280 | 409 |
| held-out 17 | 8e405a0 | 24 | 5.7% | 13.5% | -2.0% | 8 / 16 | 24 |
| held-out 1-17 | 8e405a0 | 462 | 4.1% | 42.9% | -2.0% | 157 / 296 | 433 |
| held-out 18 | c82c33e (not stored) | 24 | 4.8% | 43.2% | -2.1% | 8 / 15 | 17 |
| held-out 18 | 8e405a0, once | 24 | 4.2% | 43.2% | -2.0% | 8 / 15 | 18 |
| held-out 1-18 | 8e405a0 | 486 | 4.1% | 43.2% | -2.0% | 165 / 311 | 451 |
| design | 5c8d643 | 66 | 2.7% | 13.3% | -0.4% | 28 / 38 | 66 |
| held-out 1-18 | 5c8d643 | 486 | 4.0% | 42.9% | -2.0% | 166 / 310 | 453 |
| held-out 19 | 8e405a0, not stored | 24 | 5.3% | 32.4% | +0.1% | 13 / 11 | 19 |
| held-out 19 | 5c8d643, once | 24 | 5.3% | 32.4% | +0.1% | 13 / 11 | 19 |
| held-out 1-19 | 5c8d643 | 510 | 4.1% | 42.9% | -1.9% | 179 / 321 | 472 |
| design | dropped rule | 66 | 2.7% | 13.3% | -0.6% | 27 / 39 | 66 |
| held-out 1-18 | dropped rule | 486 | 4.1% | 42.9% | -2.3% | 157 / 319 | 452 |
| held-out 19 | dropped rule | 24 | 4.2% | 23.9% | -1.0% | 6 / 18 | 22 |
| held-out 20 | dropped rule | 24 | 4.4% | 22.8% | -2.2% | 6 / 17 | 23 |
| held-out 20 | 5c8d643, once | 24 | 3.3% | 22.8% | -1.4% | 8 / 14 | 23 |
| held-out 1-20 | 5c8d643 | 534 | 4.0% | 42.9% | -1.9% | 187 / 335 | 495 |

"""


def write_table(rows, models):
    """Writes the `estimator_accuracy` section of BENCHMARKS.md."""
    from _report import table
    from _report import write_section

    body, errors, per_model = [], [], {}
    base = {
        (r["model"], r["batch"]): r["measured"]
        for r in rows
        if r["variant"] == "base"
    }
    for r in rows:
        m = r["measured"]
        if not m:
            body.append(
                [r.get("set", "design"), r["model"], r["variant"], r["batch"]]
                + ["-"] * 4
                + [r["error"] or "not measured"]
            )
            continue
        err = (r["estimate"] - m) / m
        if not r.get("error"):  # else the step measured is not estimated
            errors.append(abs(err))
            per_model.setdefault(r["model"], []).append(abs(err))
        spread = (max(r["peaks"]) - min(r["peaks"])) / m
        f32 = base.get((r["model"], r["batch"]))
        ratio = f"{m / f32:.2f}" if f32 and r["variant"] != "base" else ""
        body.append(
            [
                r.get("set", "design"),
                r["model"],
                r["variant"],
                r["batch"],
                f"{m / MIB:.1f}",
                f"{r['estimate'] / MIB:.1f}",
                f"{err:+.1%}",
                f"{spread:.0%}",
                ratio,
                r["error"] or "",
            ]
        )
    missing = [m for m in models if m not in {r["model"] for r in rows}]
    summary = (
        (
            f"Not measured in this run: {', '.join(missing)}.\n\n"
            if missing
            else ""
        )
        + "".join(
            f"- **{which} set** ({why}): "
            f"{summarize([r for r in rows if r.get('set') == which])}.\n"
            for which, why in SETS
        )
        + f"- All cases: {_summary(errors)}.\n"
        + "- **Held-out sets together**: "
        + distribution(
            [r for r in rows if r.get("set") != "design"], _plan_margin()
        )
        + ".\n\n"
        + HISTORY
        + "".join(
            f"- {name}: {_summary(errs)}.\n" for name, errs in per_model.items()
        )
    )
    notes = "".join(f"- {n}\n" for n in NOTES)
    small = {}
    for r in rows:
        for n in r["breakdown"].get("notes", []):
            if n.startswith("small_state="):
                small[r["model"]] = int(n.split("=")[1])
    if small:
        notes += (
            "- Every row is estimated as the measurement sees it "
            "(`min_counted_bytes=CPU_STATS_MIN_BYTES`): the allocator "
            "statistics miss allocations below 256 KiB, so the estimate "
            "leaves out every tensor, weight, gradient and optimizer slot "
            "below 256 KiB. Model state in such allocations, which a GPU "
            "would count: "
            + ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in small.items())
            + ". Without the option (the estimate for a GPU) the small "
            "batches' rows are higher by that and by their small "
            "activations.\n"
        )
    text = (
        "Estimated total against the measured peak of one training step "
        "(CPU allocator via oneDNN, median of 3 steps after a warm-up, above "
        "the usage before the model was built; Adam, SGD with momentum 0.9 "
        "in the held-out `sgd_momentum` rows; `tfmemopt.Model`, "
        "micro-batches strictly one at a time; estimated with "
        "`trainer='tfmemopt'` and `min_counted_bytes=CPU_STATS_MIN_BYTES`, "
        "what oneDNN's CPU allocator statistics count: allocations of 256 "
        "KiB and more). One fresh process per case. Variants at the "
        "middle batch size. `spread`: range of the 3 peaks; `/ base`: the "
        "variant's measured peak over the plain float32 step at the same "
        "batch. Memory only: the machine's load (shared, other jobs "
        "running) does not change these numbers.\n\n"
        + summary
        + "\n"
        + notes
        + "\n"
        + table(
            [
                "set",
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
