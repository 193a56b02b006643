"""How far one case's measured peak moves between processes, beside its
estimate: is an error over 12% the estimator's, or the measurement's?

`estimator_accuracy.py` measures each held-out case in 3 fresh processes
(each the median of 3 steps) and compares the estimate with the median of
the 3. On the CPU a step's peak is not one number: the executor runs
independent ops in an order the threads decide, and the allocator hands
out whole chunks whose layout depends on what ran before, so the same
step of the same model reads different peaks in different processes
(examples/long_context_gpt2.py's wrapped step: 56-57 MiB in every local
process, 72.5 in one CI run).

This script measures more processes of the same cases, without touching
`estimator_accuracy.json`: every held-out case whose stored error is over
12%, and a control sample of as many held-out cases within 12% (chosen
by a fixed seed, the same each run). For each it reports the runs (the 3
stored and `--runs` new ones, each one process's median of 3 steps), the
estimate's error against the median of all of them, and whether the
estimate lies within the runs' range. It writes
`benchmarks/estimator_spread.json` and the section `estimator_spread` of
BENCHMARKS.md. Nothing is estimated: the estimates are those stored in
`estimator_accuracy.json` (`--table` takes them again after a change to
the rules; the cases stay those first selected).

    python benchmarks/estimator_spread.py [--runs 4] [--control 20]
    python benchmarks/estimator_spread.py --table  # from the stored JSON
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MIB = 2**20
LIMIT = 0.12  # the goal of issue #23: worst |error| <= 12%


def _key(r):
    return (r["model"], r["variant"], r["batch"])


def _error(estimate, measured):
    return (estimate - measured) / measured


def select(rows, control):
    """The held-out cases over `LIMIT` and `control` of those within it."""
    held = [
        r
        for r in rows
        if r["set"] != "design" and r.get("estimate") and r.get("measured")
    ]
    over = [
        r for r in held if abs(_error(r["estimate"], r["measured"])) > LIMIT
    ]
    within = [r for r in held if r not in over]
    random.Random(0).shuffle(within)
    return over, within[:control]


def measure(name, variant, batch):
    """One fresh process's median of 3 steps (bytes), or None."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child", name, variant, str(batch)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("@@")]
    if not lines:
        print(proc.stderr[-2000:], flush=True)
        return None
    return json.loads(lines[-1][2:])


def child(name, variant, batch):
    sys.path.insert(0, HERE)
    import estimator_accuracy as ea

    # Measure only: the stored estimate is the one compared.
    ea.MEASURE_ONLY = ("design", *ea.HELDOUT_SETS)
    (row,) = ea.run_model(name, [(variant, batch)])
    print("@@" + json.dumps(row["measured"]))


def summary(rows):
    stored = [abs(r["stored_error"]) for r in rows]
    now = [abs(r["error"]) for r in rows]
    return (
        f"{len(rows)} cases: |error| against the 3 stored runs median "
        f"{statistics.median(stored):.1%}, worst {max(stored):.1%}, "
        f"{sum(e <= LIMIT for e in stored)} within 12%; against all "
        f"runs median {statistics.median(now):.1%}, worst {max(now):.1%}, "
        f"{sum(e <= LIMIT for e in now)} within 12%; the estimate within "
        f"the runs' range in {sum(r['inside'] for r in rows)}; runs' "
        f"spread (max/min) median "
        f"{statistics.median(r['spread'] for r in rows):.2f}x, "
        f"{sum(r['spread'] > 1 + LIMIT for r in rows)} over "
        f"{1 + LIMIT:.2f}x; {unreachable(rows)}"
    )


def unreachable(rows):
    """What no estimate could do on these cases: the measurement's own part.

    A case whose largest run is over (1 + LIMIT) / (1 - LIMIT) times its
    smallest has no number within `LIMIT` of every run. And an estimator
    that returned each case's median of all runs (the best a rule could
    aim at) would still read, against the stored median of 3, the
    distance between the two medians.
    """
    wide = [r for r in rows if r["spread"] > (1 + LIMIT) / (1 - LIMIT)]
    moved = [
        abs(statistics.median(r["runs"][:3]) / statistics.median(r["runs"]) - 1)
        for r in rows
    ]
    return (
        f"no number within 12% of every run in {len(wide)}; the median of "
        "all runs as the estimate would read, against the 3 stored runs, "
        f"{sum(m > LIMIT for m in moved)} over 12% (worst {max(moved):.1%})"
    )


def write(rows, new_runs):
    sys.path.insert(0, HERE)
    from _report import table
    from _report import write_section

    body = [
        "Run by hand: `python benchmarks/estimator_spread.py`. The "
        "held-out cases of `estimator_accuracy` whose error is over 12%, "
        "and a control sample of as many within 12% (fixed seed), each "
        f"measured in {new_runs} more fresh processes (each the median of "
        "3 steps) beside its 3 stored runs. The cases were selected by "
        "their errors when the runs were measured; the estimates are "
        "those of `estimator_accuracy.json` when the table was written "
        "(`--table` takes them again after a change to the rules). "
        "`error`: the estimate against the median of all runs; "
        "`inside`: the estimate lies between the smallest and the largest "
        "run.",
        "",
    ]
    for group in ("over 12%", "control"):
        some = [r for r in rows if r["group"] == group]
        body.append(f"- **{group}**: {summary(some)}.")
    body.append("")
    out = []
    for r in sorted(rows, key=lambda r: (r["group"], -abs(r["stored_error"]))):
        runs = ", ".join(f"{m / MIB:.1f}" for m in r["runs"])
        out.append(
            (
                r["group"],
                r["set"],
                r["model"],
                r["variant"],
                r["batch"],
                runs,
                f"{r['spread']:.2f}x",
                f"{r['estimate'] / MIB:.1f}",
                f"{r['stored_error']:+.1%}",
                f"{r['error']:+.1%}",
                "yes" if r["inside"] else "no",
            )
        )
    headers = (
        "group",
        "set",
        "model",
        "variant",
        "batch",
        "runs (MiB, stored 3 first)",
        "spread",
        "estimate (MiB)",
        "error (3 stored)",
        "error (all runs)",
        "inside",
    )
    body.append(table(headers, out))
    write_section("estimator_spread", "\n".join(body))


def row_of(r, group, runs):
    med = statistics.median(runs)
    return {
        "group": group,
        "set": r["set"],
        "model": r["model"],
        "variant": r["variant"],
        "batch": r["batch"],
        "runs": runs,
        "estimate": r["estimate"],
        "stored_error": _error(r["estimate"], r["measured"]),
        "error": _error(r["estimate"], med),
        "inside": min(runs) <= r["estimate"] <= max(runs),
        "spread": max(runs) / min(runs),
    }


def main():
    path = os.path.join(HERE, "estimator_spread.json")
    if "--table" in sys.argv:
        with open(path) as f:
            stored = json.load(f)
        # The estimates as `estimator_accuracy.json` has them now (after a
        # change to the rules); the cases stay those first selected.
        with open(os.path.join(HERE, "estimator_accuracy.json")) as f:
            now = {_key(r): r for r in json.load(f) if r.get("estimate")}
        rows = []
        for r in stored["rows"]:
            again = now.get(_key(r), r)
            fresh = dict(again, measured=statistics.median(r["runs"][:3]))
            rows.append(row_of(fresh, r["group"], r["runs"]))
        with open(path, "w") as f:
            json.dump(dict(stored, rows=rows), f, indent=1)
        write(rows, stored["new_runs"])
        return
    new_runs = int(_arg("--runs", 4))
    with open(os.path.join(HERE, "estimator_accuracy.json")) as f:
        rows = json.load(f)
    over, control = select(rows, int(_arg("--control", 20)))
    out = []
    for group, some in (("over 12%", over), ("control", control)):
        for r in some:
            t0 = time.time()
            got = [
                measure(r["model"], r["variant"], r["batch"])
                for _ in range(new_runs)
            ]
            runs = list(r["runs"]) + [m for m in got if m]
            out.append(row_of(r, group, runs))
            print(
                f"{group:9s} {r['model']:20s} {r['variant']:18s} "
                f"B={r['batch']:5d} runs="
                f"{[round(m / MIB, 1) for m in runs]} estimate="
                f"{r['estimate'] / MIB:.1f} error "
                f"{out[-1]['stored_error']:+.1%}"
                f" -> {out[-1]['error']:+.1%} ({time.time() - t0:.0f} s)",
                flush=True,
            )
            with open(path, "w") as f:  # kept as it goes
                json.dump({"new_runs": new_runs, "rows": out}, f, indent=1)
    write(out, new_runs)
    for group in ("over 12%", "control"):
        print(group, summary([r for r in out if r["group"] == group]))


def _arg(flag, default):
    if flag in sys.argv:
        return sys.argv[sys.argv.index(flag) + 1]
    return default


if __name__ == "__main__":
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        child(sys.argv[i + 1], sys.argv[i + 2], int(sys.argv[i + 3]))
    else:
        main()
