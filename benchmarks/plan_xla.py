"""`tfmemopt.plan` under XLA, judged by what users need (#49): its plan,
applied and measured in a fresh process, stays under the budget, and is
not needlessly cautious.

For each model (six of benchmarks/estimator_xla.py's held-out set, one per
family), in a fresh process with TensorFlow's CPU allocator as a user has
it (not grown first: XLA's temporary buffer may be counted in a larger
chunk, which `plan` allows for on a CPU; see docs/xla.md): plain
Keras's step under XLA is measured; the budget is halfway from what the
weights and optimizer state hold to that peak; `plan(model,
batch, budget)` (compiled with `jit_compile=True`, so each candidate is
compiled and estimated by XLA) chooses; the chosen plan is applied and its
step measured. Reported: the plan, its estimate, the measured peak, the
share of the budget used, and whether it stayed under. A second pass
measures the plan's cheapest rejected neighbour (the candidate with one
step fewer of caution that the plan rejected: fewer micro-batches or no
checkpointing) to show whether it would have fit.

    python benchmarks/plan_xla.py        # writes BENCHMARKS.md
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import fresh_process  # noqa: E402
from _report import table  # noqa: E402
from _report import write_section  # noqa: E402

CASES = {
    "mlp_relu": 1024,
    "cnn_bn": 32,
    "lstm": 64,
    "encoder": 16,
    "emb_pool": 256,
    "gpt2_tiny": 4,
}
SHARE = 0.5

_CHILD = r"""
import json, statistics, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np, keras, tensorflow as tf
import tfmemopt
from tfmemopt.memory import device_memory, reset_peak
name, batch, share, settings = json.loads(sys.argv[1])
tf.constant(0.0) + 1.0
base = device_memory()["current"]
import estimator_xla as held_out
ns = {}
exec(held_out._BUILD, ns)

def build():
    keras.utils.set_random_seed(0)
    m, x, y, _ = ns["build_case"](name, batch, {})
    # plain Keras: the wrapped task, or the functional graph
    m = m.inner if hasattr(m, "inner") else keras.Model(m.inputs, m.outputs)
    return m, x, y

loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
model, x, y = build()
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss,
              metrics=[], weighted_metrics=[], jit_compile=True)

def step_peak(m):
    m.train_on_batch(x, y)
    peaks = []
    for _ in range(2):
        reset_peak()
        m.train_on_batch(x, y)
        peaks.append(device_memory()["peak"] - base)
    return statistics.median(peaks)

if settings is None:
    plain = step_peak(model)
    # Halfway from what the weights and the optimizer state hold (which
    # no plan here changes) to plain Keras's step.
    state = device_memory()["current"] - base
    budget = int(state + share * (plain - state))
    p = tfmemopt.plan(model, batch, budget,
                      allow=("accumulation", "checkpointing"),
                      sequence_length=x["token_ids"].shape[1]
                      if isinstance(x, dict) else None)
    out = {"plain": plain, "budget": budget, "state": state,
           "steps": p.accumulation_steps,
           "checkpointing": p.checkpointing, "estimate": p.estimated_peak,
           "considered": [[c["accumulation_steps"], c["checkpointing"],
                           c["peak"], c.get("fit")] for c in p.considered]}
    del model
    keras.backend.clear_session()
    base = device_memory()["current"]
    model, x, y = build()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss,
                  metrics=[], weighted_metrics=[], jit_compile=True)
    applied = p.apply(model)
    applied.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss,
                    jit_compile=True)
    out["measured"] = step_peak(applied)
else:
    steps, ckpt = settings
    applied = tfmemopt.Model.wrap(model, accumulation_steps=steps,
                                  checkpointing=ckpt)
    applied.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss,
                    jit_compile=True)
    out = {"measured": step_peak(applied)}
print("@@" + json.dumps(out))
"""


def cell(name, settings=None):
    here = os.path.dirname(os.path.abspath(__file__))
    arg = json.dumps([name, CASES[name], SHARE, settings])
    code = f"import sys; sys.path.insert(0, {here!r})\n" + _CHILD
    value, stderr = fresh_process(code, arg, timeout=1800)
    if value is None:
        return {"error": (stderr.strip().splitlines() or ["?"])[-1][:160]}
    return value


def _neighbour(r):
    """The rejected candidate one step less cautious than the plan's, or
    None: fewer micro-batches at the same checkpointing, else the same
    micro-batches without checkpointing."""
    considered = [(s, c, peak, fit) for s, c, peak, fit in r["considered"]]
    fewer = [
        x
        for x in considered
        if x[1] == r["checkpointing"] and x[0] < r["steps"]
    ]
    if fewer:
        return max(fewer, key=lambda x: x[0])
    if r["checkpointing"] is not None:
        same = [x for x in considered if x[0] == r["steps"] and x[1] is None]
        if same:
            return same[0]
    return None


def main():
    rows, under, uses = [], 0, []
    mib = 2**20
    for name in CASES:
        r = cell(name)
        if "error" in r:
            rows.append([name, "-", "-", "-", "-", "-", "-", r["error"]])
            print(rows[-1], flush=True)
            continue
        fits = r["measured"] <= r["budget"]
        under += fits
        use = r["measured"] / r["budget"]
        uses.append(use)
        near = _neighbour(r)
        near_text = "-"
        if near is not None:
            m = cell(name, [near[0], near[1]])
            if "measured" in m:
                near_text = (
                    f"{near[0]} x ckpt={near[1]}: "
                    f"{m['measured'] / mib:.1f} MiB "
                    f"({'fits' if m['measured'] <= r['budget'] else 'over'})"
                )
        rows.append(
            [
                name,
                f"{r['plain'] / mib:.1f}",
                f"{r['budget'] / mib:.1f}",
                f"{r['steps']} x ckpt={r['checkpointing']}",
                f"{r['estimate'] / mib:.1f}",
                f"{r['measured'] / mib:.1f}",
                f"{100 * use:.0f}%{'' if fits else ' OVER'}",
                near_text,
            ]
        )
        print(rows[-1], flush=True)
    body = (
        "## plan_xla\n\n"
        "`tfmemopt.plan` under XLA (each candidate compiled and estimated "
        'by XLA; `allow=("accumulation", "checkpointing")`), budget '
        f"{SHARE:.0%} of the way from the weights and optimizer state to "
        "plain Keras's step under XLA, the plan applied "
        "and measured in a fresh process (the CPU allocator as a user has "
        "it): `python benchmarks/plan_xla.py`. `less cautious`: the "
        "candidate one step less cautious that the plan rejected, "
        "measured.\n\n"
        + table(
            [
                "model",
                "plain MiB",
                "budget MiB",
                "plan",
                "estimated MiB",
                "measured MiB",
                "budget used",
                "less cautious",
            ],
            rows,
        )
        + f"\n\n{under} of {len(uses)} plans under the budget"
        + (
            f"; budget used {100 * min(uses):.0f}% to {100 * max(uses):.0f}%."
            if uses
            else "."
        )
    )
    write_section("plan_xla", body)


if __name__ == "__main__":
    main()
