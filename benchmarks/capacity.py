"""How deep a model trains within a fixed step-memory budget (#47).

The README's headline: at 4 x 1024 tokens and a fixed budget for one
training step (weights, optimizer state, gradients and activations: the
step's peak above what was allocated before the model was built), the
largest depth of a GPT-2-shaped and a Llama-shaped keras-hub causal LM
(width 256, vocabulary 50257 / 32000, random weights, no download, no
dropout: chunked attention refuses attention dropout) whose step fits:

- plain Keras, float32, AdamW;
- plain Keras, `mixed_bfloat16`, AdamW;
- what `tfmemopt.plan(lm, 4, budget, sequence_length=1024)` proposes,
  applied with `plan.apply(lm)` (the plan is told the budget, and measured
  in its own process like the others).

Each cell (model, depth, setting) runs in a fresh process: a warm-up step,
then the median peak of 2 steps. Depths are searched by doubling from 1 and
then bisecting between the last depth that fit and the first that did not.
The recipe's fixed cost (the part of the step that does not grow with
depth) is the intercept of the plan's peaks over depth where its settings
stay the same.

    python benchmarks/capacity.py                     # 1.5 GiB, both models
    TFMEMOPT_BENCH_BUDGET_MIB=1024 TFMEMOPT_BENCH_MODELS=gpt2 \\
        python benchmarks/capacity.py
    python benchmarks/capacity.py --cell gpt2 plan 4   # one cell, printed
    python benchmarks/capacity.py --fixed-cost gpt2    # the recipe's fixed cost

Writes the section `capacity` of BENCHMARKS.md (`capacity_xla` with
`JIT_COMPILE=1`).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _report  # noqa: E402
from _report import fresh_process  # noqa: E402
from _report import table  # noqa: E402
from _report import write_section  # noqa: E402

BUDGET_MIB = int(os.environ.get("TFMEMOPT_BENCH_BUDGET_MIB", "1536"))
TOKENS = int(os.environ.get("TFMEMOPT_BENCH_TOKENS", "1024"))
BATCH = 4
MAX_DEPTH = int(os.environ.get("TFMEMOPT_BENCH_MAX_DEPTH", "64"))
MODELS = os.environ.get("TFMEMOPT_BENCH_MODELS", "gpt2,llama").split(",")
SETTINGS = ("float32", "mixed_bfloat16", "plan")

_CELL = """
import json, statistics, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np, keras, keras_hub, tensorflow as tf
import tfmemopt
from tfmemopt.memory import device_memory, reset_peak
family, setting, depth, tokens, batch, budget_mib, jit = json.loads(
    sys.argv[1])
if jit:  # XLA's few large buffers counted at their own sizes (docs/xla.md)
    t = tf.raw_ops.Empty(shape=[1 << 30], dtype=tf.float32, init=False)
    del t
tf.constant(0.0) + 1.0
base = device_memory()["current"]
keras.utils.set_random_seed(0)
if setting in ("mixed_bfloat16", "bfloat16"):
    keras.config.set_dtype_policy(setting)
elif setting == "recipe":  # bfloat16 weights, 8-bit state, every option
    keras.config.set_dtype_policy("bfloat16")
if family == "gpt2":
    vocab = 50257
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab, num_layers=depth, num_heads=4,
        hidden_dim=256, intermediate_dim=1024, max_sequence_length=tokens,
        dropout=0.0)
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
else:
    vocab = 32000
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=vocab, num_layers=depth, num_query_heads=4,
        num_key_value_heads=2, hidden_dim=256, intermediate_dim=688)
    lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
params = int(sum(np.prod(v.shape) for v in lm.trainable_weights))
lm.compile(optimizer=keras.optimizers.AdamW(1e-4),
           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
           weighted_metrics=[], jit_compile=jit)
rng = np.random.default_rng(0)
x = {"token_ids": rng.integers(0, vocab, (batch, tokens)).astype("int32"),
     "padding_mask": np.ones((batch, tokens), "int32")}
y = rng.integers(0, vocab, (batch, tokens)).astype("int32")
info = {"params": params}
model = lm
if setting == "recipe":
    model = tfmemopt.Model.wrap(lm, checkpointing="auto", chunked_loss=True,
                                attention="chunked")
    model.compile(
        optimizer=tfmemopt.optimizers.AdamW8bit(1e-4,
                                                bf16_update="stochastic"),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit)
if setting == "plan":
    try:
        plan = tfmemopt.plan(lm, batch, budget_mib * 2**20,
                             sequence_length=tokens)
    except ValueError as e:  # nothing fits, by the plan's estimates
        print("@@" + json.dumps({"params": params, "no_plan": str(e)[:300]}))
        sys.exit(0)
    info["plan"] = {
        "policy": plan.policy,
        "accumulation_steps": plan.accumulation_steps,
        "checkpointing": plan.checkpointing,
        "optimizer": plan.optimizer_name,
        "sharding": plan.sharding,
        **{k: v for k, v in plan.model_kwargs.items()
           if k in ("chunked_loss", "attention")},
    }
    info["estimate_mib"] = plan.estimated_peak / 2**20
    model = plan.apply(lm)
model.train_on_batch(x, y)
peaks = []
for _ in range(2):
    reset_peak()
    model.train_on_batch(x, y)
    peaks.append(device_memory()["peak"] - base)
info["peak_mib"] = statistics.median(peaks) / 2**20
print("@@" + json.dumps(info))
"""


def cell(family, setting, depth):
    arg = json.dumps(
        [family, setting, depth, TOKENS, BATCH, BUDGET_MIB, _report.JIT]
    )
    value, stderr = fresh_process(_CELL, arg)
    if value is None:
        print(stderr[-3000:], file=sys.stderr)
    return value


def fits(info) -> bool:
    return (
        info is not None
        and "peak_mib" in info
        and info["peak_mib"] <= BUDGET_MIB
    )


def deepest(family, setting, log):
    """The largest depth whose step fits, and every cell measured."""
    cells = {}

    def measure(depth):
        info = cell(family, setting, depth)
        cells[depth] = info
        log(family, setting, depth, info)
        return fits(info)

    good, bad, depth = 0, None, 1
    while depth <= MAX_DEPTH:
        if not measure(depth):
            bad = depth
            break
        good, depth = depth, depth * 2
    if bad is None:
        return good, cells
    while bad - good > 1:
        mid = (good + bad) // 2
        if measure(mid):
            good = mid
        else:
            bad = mid
    return good, cells


def _describe(plan) -> str:
    if not plan:
        return "-"
    parts = [plan["policy"], f"accumulation {plan['accumulation_steps']}"]
    if plan.get("checkpointing"):
        parts.append(f"checkpointing {plan['checkpointing']!r}")
    if plan.get("optimizer"):
        parts.append(plan["optimizer"])
    if plan.get("chunked_loss"):
        parts.append("chunked_loss")
    if plan.get("attention"):
        parts.append(f"attention {plan['attention']!r}")
    return ", ".join(parts)


def fixed_cost(family, depths=(1, 2, 4, 8)):
    """The recipe's peak at several depths, and the least-squares line
    through them: its intercept is what does not grow with depth."""
    points = []
    for depth in depths:
        info = cell(family, "recipe", depth)
        print(family, "recipe", depth, json.dumps(info), flush=True)
        if info and "peak_mib" in info:
            points.append((depth, info["peak_mib"], info["params"]))
    n = len(points)
    if n < 2:
        raise SystemExit(f"{n} recipe cells measured: no line to fit")
    mx = sum(d for d, _, _ in points) / n
    my = sum(p for _, p, _ in points) / n
    slope = sum((d - mx) * (p - my) for d, p, _ in points) / sum(
        (d - mx) ** 2 for d, _, _ in points
    )
    intercept = my - slope * mx
    rows = [[d, f"{p / 1e6:.1f}M", f"{m:.0f}"] for d, m, p in points]
    return (
        f"The recipe (bfloat16 weights, `AdamW8bit(bf16_update="
        f'"stochastic")`, `Model.wrap(lm, checkpointing="auto", '
        f'chunked_loss=True, attention="chunked")`), {family} shape, '
        f"{BATCH} x {TOKENS} tokens, one fresh process per depth:\n\n"
        + table(["depth", "parameters", "peak MiB"], rows)
        + f"\n\nLeast squares: {intercept:.0f} MiB at depth 0 (what does "
        f"not grow with depth), {slope:.1f} MiB per layer."
    )


def from_logs(paths):
    """`{(family, setting): {depth: info}}` from the lines `main` logs
    (`family setting depth json`), for a run cut short."""
    import re

    found = {}
    for path in paths:
        for line in open(path):
            m = re.match(r"^(\w+) (\w+) (\d+) (\{.*\}|null)$", line.strip())
            if m:
                key = (m.group(1), m.group(2))
                found.setdefault(key, {})[int(m.group(3))] = json.loads(
                    m.group(4)
                )
    return found


def deepest_measured(cells) -> tuple[int, bool]:
    """The deepest depth that fits among `cells`, and whether the next
    depth was measured not to fit (the search was complete)."""
    fit = [d for d, c in cells.items() if fits(c)]
    good = max(fit, default=0)
    return good, (good + 1) in cells and not fits(cells[good + 1])


def main():
    if sys.argv[1:2] == ["--table"]:
        # The section from the logs of runs cut short (`--table LOG ...`).
        write_tables(from_logs(sys.argv[2:]), "capacity")
        return
    if sys.argv[1:2] == ["--cell"]:
        family, setting, depth = sys.argv[2], sys.argv[3], int(sys.argv[4])
        print(json.dumps(cell(family, setting, depth), indent=1))
        return
    if sys.argv[1:2] == ["--fixed-cost"]:
        family = sys.argv[2] if len(sys.argv) > 2 else "gpt2"
        body = fixed_cost(family)
        write_section(_report.section(f"capacity_fixed_cost_{family}"), body)
        print(body)
        return

    def log(family, setting, depth, info):
        print(family, setting, depth, json.dumps(info), flush=True)

    results = {}
    for family in MODELS:
        for setting in SETTINGS:
            _, results[family, setting] = deepest(family, setting, log)
    name = "capacity" if MODELS == ["gpt2", "llama"] else "capacity_"
    name += "_".join(MODELS) if name.endswith("_") else ""
    write_tables(results, name)


def write_tables(results, name):
    rows, detail = [], []
    for (family, setting), cells in results.items():
        depth, complete = deepest_measured(cells)
        info = cells.get(depth) or {}
        rows.append([
            family, setting,
            str(depth) if complete else f">= {depth} (deeper not measured)",
            f"{info.get('params', 0) / 1e6:.1f}M" if depth else "-",
            f"{info['peak_mib']:.0f}" if "peak_mib" in info else "-",
            _describe(info.get("plan")),
        ])  # fmt: skip
        for d in sorted(cells):
            c = cells[d] or {}
            detail.append([
                family, setting, d,
                f"{c['peak_mib']:.0f}" if "peak_mib" in c
                else ("no plan fits" if "no_plan" in c else "failed"),
                f"{c['estimate_mib']:.0f}" if "estimate_mib" in c else "-",
                _describe(c.get("plan")),
            ])  # fmt: skip
    body = (
        f"`benchmarks/capacity.py` ({_report.regime()}): the largest depth "
        f"whose training step fits {BUDGET_MIB} MiB at {BATCH} x {TOKENS} "
        "tokens (keras-hub GPT-2 shape: width 256, 4 heads, vocabulary "
        "50257, no dropout; Llama shape: width 256, 4 query / 2 key-value "
        "heads, vocabulary 32000; AdamW). Peak: weights, optimizer state "
        "and the step, above what was allocated before the model was "
        "built; one fresh process per cell, median of 2 steps after the "
        "first. `plan`: `tfmemopt.plan(lm, 4, budget, sequence_length="
        f"{TOKENS})`, applied; `recipe`: bfloat16 weights, "
        '`AdamW8bit(bf16_update="stochastic")`, `Model.wrap(lm, '
        'checkpointing="auto", chunked_loss=True, attention="chunked")`. '
        f"{_report.machine()}.\n\n"
        + table(
            [
                "model",
                "setting",
                "deepest that fits",
                "parameters",
                "peak MiB",
                "plan",
            ],
            rows,
        )  # fmt: skip
        + "\n\nEvery cell measured:\n\n"
        + table(
            [
                "model",
                "setting",
                "depth",
                "peak MiB",
                "plan's estimate MiB",
                "plan",
            ],
            detail,
        )  # fmt: skip
    )
    write_section(_report.section(name), body)
    print(body)


if __name__ == "__main__":
    main()
