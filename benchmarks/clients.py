"""Real client models (tests/clients): the table of issue #16.

For each client of `tests/clients/models.py` (keras-io examples adapted at
a tiny size, keras-hub task models from tiny configs, MobileNetV2), in
fresh processes:

- accumulation: `Model.wrap(model, 4)` against plain Keras at the same
  batch, 2 steps of Adam (epsilon 1e-3), max |w - w_plain| over the
  largest weight change of plain Keras;
- checkpointing: `enable_checkpointing(model, "auto")`, largest gradient
  difference over the largest gradient, and the training step's peak
  (CPU:0 allocator, above the baseline, median of 3 steps) against plain
  Keras, one fresh process per measurement;
- MemoryMonitor: its `memory/...` keys are in the fit logs;
- save/load: `.keras` round trip of the trained wrapper, largest
  prediction difference.

Run: python benchmarks/clients.py [client ...] [--write]
(`JIT_COMPILE=1`: the checkpointing step peaks under XLA instead, section
`clients_xla`)

`--memory-tools`: instead, estimate_memory, find_batch_size and plan on
every client in one fresh process (tests/clients/memory_tools.py says what
is measured; the test suite runs three clients of it), printed as JSON and
as the table of docs/clients.md ("The memory tools on the clients").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CHECKS = """
import json
from tests.clients import checks
acc = checks.accumulation({name!r})
ck = checks.checkpointing({name!r})
print("@@" + json.dumps({{
    "acc": acc["rel_diff"], "monitor": bool(acc["monitor_keys"]),
    "save": acc["save_diff"], "grad": ck["grad_rel_diff"],
    "segments": len(ck["report"].segments), "inside": ck["report"].inside,
}}))
"""

PEAK = """
from tests.clients import checks
print("@@" + str(checks.step_peak({name!r}, {mode!r}, jit_compile={jit!r})))
"""


# XLA's memory-minimizing CPU scheduler: the default one (concurrency-
# optimized) puts the zero fills of loop buffers at the start of the step
# (docs/xla.md, "Which scheduler").
MIN_MEMORY = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def measure_xla(name: str) -> dict:
    """The checkpointing step peak against plain Keras, both under XLA,
    with XLA's default CPU scheduler and with its memory-minimizing one."""
    out = {}
    for scheduler, flags in (("default", None), ("min_memory", MIN_MEMORY)):
        row = {
            mode: _run(PEAK.format(name=name, mode=mode, jit=True), flags)
            for mode in ("plain", "ckpt")
        }
        row["ratio"] = row["ckpt"] / row["plain"] if row["plain"] else 0.0
        out[scheduler] = row
    return out


def xla_main(names, write):
    """`JIT_COMPILE=1`: checkpointing `"auto"` on every client under XLA
    (#46: checkpointing compiles and saves memory on models people did not
    write), one fresh process per (client, mode)."""
    from _report import table
    from _report import write_section

    rows = []
    for name in names:
        try:
            r = measure_xla(name)
        except RuntimeError as e:
            print(name, "failed:", str(e)[-600:], flush=True)
            rows.append([name] + ["failed"] + ["-"] * 5)
            continue
        print(name, json.dumps(r), flush=True)
        rows.append(
            [name]
            + [
                cell
                for s in ("default", "min_memory")
                for cell in (
                    _mib(r[s]["plain"]),
                    _mib(r[s]["ckpt"]),
                    f"{r[s]['ratio']:.2f}x",
                )
            ]
        )
    text = table(
        [
            "client",
            "plain Keras (XLA)",
            'checkpointing "auto" (XLA)',
            "ratio",
            "plain, min-memory scheduler",
            '"auto", min-memory scheduler',
            "ratio",
        ],
        rows,
    )
    print(text)
    if write:
        write_section(
            "clients_xla",
            "## Real clients under XLA (`JIT_COMPILE=1 python "
            "benchmarks/clients.py --write`)\n\nThe training step's peak "
            "above the baseline (median of 3 steps), compiled with "
            "`jit_compile=True`, TensorFlow's CPU allocator grown first "
            '(docs/xla.md); `enable_checkpointing(model, "auto")` '
            "against the plain model, SGD, peaks at the batch of the "
            "graph-mode table; one fresh process each. First with XLA's "
            "default CPU scheduler, then with its memory-minimizing one "
            f'(`XLA_FLAGS={MIN_MEMORY}`; docs/xla.md, "Which '
            'scheduler").\n\n' + text,
        )


def _run(code: str, xla_flags: str | None = None):
    env = dict(os.environ)
    if xla_flags:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla_flags).strip()
    env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=900,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("@@")]
    if not lines:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(lines[-1][2:])


def measure(name: str) -> dict:
    out = _run(CHECKS.format(name=name))
    for mode in ("plain", "ckpt"):
        out[mode] = _run(PEAK.format(name=name, mode=mode, jit=False))
    out["ratio"] = out["ckpt"] / out["plain"] if out["plain"] else float("nan")
    return out


MEMORY_TOOLS = """
import json
from tests.clients import memory_tools
print("@@" + json.dumps(memory_tools.all_clients({names!r})))
"""


def _mib(n):
    return f"{n / 2**20:.1f} MiB"


def memory_tools_table(names) -> str:
    out = _run(MEMORY_TOOLS.format(names=names))
    print(json.dumps(out, indent=1))
    rows = []
    for name, r in out.items():
        f, p = r["find"], r["plan"]
        trial = [t for t in f["trials"] if t[0] == r["batch"]]
        rows.append(
            [
                name,
                str(r["batch"]),
                _mib(r["measured"]),
                _mib(r["estimate"]),
                f"{r['error']:+.0%}",
                f"{_mib(f['budget'])}: "
                + (_mib(trial[0][2]) if trial else "-")
                + f" -> {f['batch_size']}",
                f"{p['batch']}, {_mib(p['budget'])}: "
                f"{p['micro_batch_size']} x {p['accumulation_steps']}, "
                f"{_mib(p['estimated_peak'])} / {_mib(p['measured'])}",
                f"{r['seconds']:.0f}",
            ]
        )
    from _report import table

    return table(
        [
            "client",
            "batch",
            "step peak measured",
            "estimate",
            "error",
            "find_batch_size (budget: trial at batch -> result)",
            "plan (batch, budget: plan, estimated / measured)",
            "s",
        ],
        rows,
    )


def main(argv):
    sys.path.insert(0, ROOT)
    from tests.clients.models import CLIENTS

    write = "--write" in argv
    names = [a for a in argv if not a.startswith("--")] or list(CLIENTS)
    if "--memory-tools" in argv:
        print(memory_tools_table(names))
        return
    if os.environ.get("JIT_COMPILE") == "1":
        xla_main(names, write)
        return
    rows = []
    for name in names:
        r = measure(name)
        print(name, json.dumps(r), flush=True)
        rows.append(
            [
                name,
                f"{r['acc']:.1e}",
                f"{r['grad']:.1e}",
                f"{r['ratio']:.2f}x ({r['segments']} seg"
                + (f" in {r['inside'].split('/')[-1]}" if r["inside"] else "")
                + ")",
                "yes" if r["monitor"] else "NO",
                f"yes ({r['save']:.0e})",
            ]
        )
    from _report import table
    from _report import write_section

    text = table(
        [
            "client",
            "accumulation max rel diff",
            "ckpt grad diff",
            "ckpt step peak / plain",
            "MemoryMonitor keys",
            ".keras round trip (pred diff)",
        ],
        rows,
    )
    print(text)
    if write:
        write_section(
            "clients",
            "## Real clients (`benchmarks/clients.py`)\n\n"
            "keras-io examples, keras-hub tasks and MobileNetV2 at tiny "
            "sizes (tests/clients); N=4, Adam (epsilon 1e-3); peaks at "
            "batch 256 (128 for captcha OCR and MobileNetV2), one fresh "
            "process each.\n\n" + text,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
