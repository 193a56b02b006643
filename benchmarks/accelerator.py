"""One command that measures what only an accelerator can prove.

Every figure in BENCHMARKS.md was measured on a CPU. When a GPU (or
several) is lent for a short, fixed time, run

    make accelerator-check          # = python benchmarks/accelerator.py

and it measures, in at most about 8 minutes, each part within its own time
budget (benchmarks/_accelerator_parts.py):

- memory: `MemoryMonitor`'s logs against `get_memory_info` and NVML;
- estimator: `estimate_memory`'s error against the measured step peak
  (Adam, AdamW8bit, tfmemopt's Adafactor; MLP, CNN, transformer);
- find_batch_size: the finder's largest batch against the first batch that
  raises `ResourceExhaustedError` (GPU memory capped at
  `--gpu-memory-limit` MiB in that part's process, so the search is
  short), and whether the OOM report appears;
- precision: mixed_float16 (loss scaling) and mixed_bfloat16 step time and
  peak against float32; `check_alignment` before and after padding a
  misaligned Dense, and the step time of both;
- accumulation_checkpointing: peak and time ratios on the device;
- optimizers: AdamW8bit against Keras AdamW, jit_compile off and on, and
  state bytes on the device;
- sharding (two or more GPUs): ShardedOptimizer bytes per device and step
  time against unsharded, and `shard_parameters` where `tfmemopt.Model`
  takes it.

Every part's result goes into `<out>/accelerator.json` as soon as the part
ends (figures as soon as they are measured), with a markdown table
`<out>/accelerator.md` beside it, so a run cut short keeps what it
measured; a part that fails records its error and the run goes on; a part
that cannot run here records why. Each figure comes with its CPU
counterpart from BENCHMARKS.md where one exists.

Modes: on a machine with a GPU or TPU the default is `full`, each part in
its own process (`--isolate`: a fresh allocator per part, and a part that
hangs or crashes is killed at its budget); without one it is `smoke`
(small sizes, in one process, two logical CPUs so that the sharding part
runs): a test that the script works, whose figures are not device figures.
`--mode full` on a CPU runs the device sizes there (slow; the budgets cut
the parts).

Options: `--out DIR` (default `$OUT` if set, else
`benchmarks/accelerator_out/`), `--parts a,b`, `--write-benchmarks` (puts
the table into BENCHMARKS.md under "Measured on an accelerator"; device
runs only), `--fail PART` (or `TFMEMOPT_ACCEL_FAIL=PART`: the part raises
after its first figure, to test that the others go on), `--simulate-oom`
(smoke: run the find_batch_size part against a layer that raises
ResourceExhaustedError), `--total-budget S`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import traceback

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

# Seconds per part: full mode (about 8 minutes in all with the start), and
# smoke mode (the test's small sizes).
BUDGETS = {
    "memory": (35, 25),
    "estimator": (75, 40),
    "find_batch_size": (100, 30),
    "precision": (60, 40),
    "accumulation_checkpointing": (70, 40),
    "optimizers": (55, 30),
    "sharding": (60, 40),
}
ORDER = list(BUDGETS)
TOTAL_BUDGET = {"full": 450, "smoke": 300}
GRACE = 20  # seconds past a budget before a part is killed
SMOKE_NOTE = (
    "SMOKE RUN on CPU: small sizes, to check that the script works. These "
    "are not device figures; nothing here confirms a claim on an "
    "accelerator."
)
CPU_FULL_NOTE = (
    "Device sizes run on a CPU (--mode full without an accelerator): "
    "these are CPU figures, not device figures."
)


class PartTimeout(Exception):
    pass


# -- the CPU counterparts in BENCHMARKS.md ------------------------------------


def _section(text: str, name: str) -> str:
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    if begin not in text or end not in text:
        return ""
    return text.split(begin, 1)[1].split(end, 1)[0]


def _tables(section: str):
    """[(header cells, [row cells])] of the markdown tables in a section."""
    out, current = [], None
    for line in section.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if current is None:
            current = (cells, [])
            out.append(current)
        elif not set("".join(cells)) <= set("-: "):
            current[1].append(cells)
    return out


def counterpart(spec, text: str | None = None) -> str | None:
    """The BENCHMARKS.md cell a figure's CPU counterpart is, or None.

    `spec` is `(section, regex)` (first group of the first match) or
    `(section, row, column)`: `row` a tuple of the first cells of the row,
    `column` a header text or an index; the first table that has both.
    """
    if spec is None:
        return None
    if text is None:
        path = os.path.join(ROOT, "BENCHMARKS.md")
        text = open(path).read() if os.path.exists(path) else ""
    section = _section(text, spec[0])
    if len(spec) == 2:
        m = re.search(spec[1], section, re.S)
        return m.group(1) if m else None
    _, row, column = spec
    for header, rows in _tables(section):
        if isinstance(column, int):
            index = column
        elif column in header:
            index = header.index(column)
        else:
            continue
        for cells in rows:
            if tuple(cells[: len(row)]) == tuple(row) and index < len(cells):
                return cells[index]
    return None


# -- running one part ---------------------------------------------------------


class Context:
    """What a part sees: sizes, budget, device, and where figures go."""

    def __init__(self, name, env, args, budget, flush):
        self.name = name
        self.smoke = args.mode == "smoke"
        self.kind = env["kind"]
        self.device = env["device"]
        self.gpus = env["gpus"]
        self.simulate_oom = args.simulate_oom
        self.gpu_memory_limit_mib = args.gpu_memory_limit
        self.fail = name in args.fail
        self.deadline = time.monotonic() + budget
        self.result = {
            "status": "running",
            "budget_s": budget,
            "figures": [],
            "data": {},
        }
        self._flush = flush
        self._bench = None

    def size(self, full, smoke):
        return smoke if self.smoke else full

    def over(self) -> bool:
        return time.monotonic() > self.deadline

    def cut(self, why: str):
        self.result["cut"] = why
        self._flush()

    def data(self, key, value):
        self.result["data"][key] = value
        self._flush()

    def figure(self, name, value, unit="", cpu=None, note=""):
        if self._bench is None:
            path = os.path.join(ROOT, "BENCHMARKS.md")
            self._bench = open(path).read() if os.path.exists(path) else ""
        try:
            cpu_value = counterpart(cpu, self._bench)
        except Exception as e:  # noqa: BLE001 - a lookup never stops a part
            cpu_value = f"lookup failed: {type(e).__name__}"
        self.result["figures"].append(
            {
                "figure": name,
                "value": value,
                "unit": unit,
                "cpu": cpu_value,
                "cpu_source": None if cpu is None else list(cpu[:1]),
                "note": note,
            }
        )
        self._flush()
        if self.fail:
            self.fail = False
            raise RuntimeError(
                f"failure injected into part {self.name!r} (--fail)"
            )


def run_part(name, env, args, budget, flush) -> dict:
    """Runs one part in this process; never raises."""
    import _accelerator_parts as parts

    ctx = Context(name, env, args, budget, flush)
    flush.ctx = ctx
    start, cpu = time.monotonic(), time.process_time()

    def alarm(signum, frame):
        raise PartTimeout(
            f"stopped {GRACE} s past its budget of {budget:.0f} s (at the "
            "end of the TensorFlow call then running)"
        )

    hard = hasattr(signal, "SIGALRM")
    if hard:
        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, budget + GRACE)
    try:
        parts.PARTS[name](ctx)
        ctx.result["status"] = "cut" if "cut" in ctx.result else "ok"
    except parts.Skip as e:
        ctx.result["status"] = "skipped"
        ctx.result["reason"] = str(e)
    except PartTimeout as e:
        ctx.result["status"] = "cut"
        ctx.result["cut"] = str(e)
    except BaseException as e:  # noqa: BLE001 - recorded; the run goes on
        if isinstance(e, KeyboardInterrupt):
            raise
        ctx.result["status"] = "error"
        ctx.result["error"] = f"{type(e).__name__}: {e}"[:2000]
        ctx.result["traceback"] = traceback.format_exc()[-4000:]
    finally:
        if hard:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    ctx.result["seconds"] = round(time.monotonic() - start, 1)
    ctx.result["cpu_s"] = round(time.process_time() - cpu, 1)
    return ctx.result


def precheck(name, env, args) -> str | None:
    """Why a part cannot run here, known before starting it (or None)."""
    if name == "sharding" and args.mode == "full" and len(env["gpus"]) < 2:
        return f"needs two or more GPUs; this machine has {len(env['gpus'])}"
    if name == "find_batch_size" and env["kind"] == "CPU":
        if not args.simulate_oom:
            import _accelerator_parts as parts

            return parts.NO_OOM_ON_CPU
    if name == "find_batch_size" and env["kind"] == "TPU":
        return "written for GPUs: TPUs are not capped by --gpu-memory-limit"
    return None


def run_isolated(name, env, args, budget) -> dict:
    """Runs one part in a child process, killed at its budget."""
    path = os.path.join(args.out, f"part_{name}.json")
    if os.path.exists(path):
        os.remove(path)
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        name,
        "--budget",
        str(budget),
        "--mode",
        args.mode,
        "--out",
        args.out,
        "--gpu-memory-limit",
        str(args.gpu_memory_limit),
    ]
    if args.fail:
        cmd += ["--fail", ",".join(args.fail)]
    if args.simulate_oom:
        cmd.append("--simulate-oom")
    start = time.monotonic()
    tail = ""
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=budget + 2 * GRACE
        )
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        tail = str(e.stdout or "")[-1500:] + str(e.stderr or "")[-1500:]
    result = _load(path) or {"figures": [], "data": {}}
    if os.path.exists(path):
        # Merged into accelerator.json; the device tool returns few files.
        os.remove(path)
    if result.get("status") in (None, "running"):
        if rc == "timeout":
            result["status"] = "cut"
            result["cut"] = f"process killed at {budget + 2 * GRACE} s"
        else:
            result["status"] = "error"
            result["error"] = f"part process ended with code {rc}"
            result["output_tail"] = tail
    result["seconds"] = round(time.monotonic() - start, 1)
    result["budget_s"] = budget
    return result


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


# -- the environment ----------------------------------------------------------


def detect(args) -> dict:
    """Devices and versions, without starting a GPU (no memory taken)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    tpus = tf.config.list_physical_devices("TPU")
    kind = "GPU" if gpus else "TPU" if tpus else "CPU"
    names = []
    for g in gpus:
        try:
            details = tf.config.experimental.get_device_details(g)
        except Exception:  # noqa: BLE001
            details = {}
        cc = details.get("compute_capability")
        names.append(
            details.get("device_name", g.name)
            + (f" (compute capability {cc[0]}.{cc[1]})" if cc else "")
        )
    build = {}
    try:
        info = tf.sysconfig.get_build_info()
        build = {k: info.get(k) for k in ("cuda_version", "cudnn_version")}
    except Exception:  # noqa: BLE001
        pass
    import keras

    import tfmemopt

    env = {
        "kind": kind,
        "device": f"{kind}:0",
        "gpus": [f"/device:GPU:{i}" for i in range(len(gpus))],
        "device_names": names or [platform.processor() or platform.machine()],
        "tpus": len(tpus),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "tfmemopt": tfmemopt.__version__,
        "cpu_cores": os.cpu_count(),
        "nvml_driver": _nvml_driver(),
        **build,
        "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "TF_FORCE_GPU_ALLOW_GROWTH": os.environ.get(
            "TF_FORCE_GPU_ALLOW_GROWTH", "unset"
        ),
    }
    return env


def _nvml_driver():
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:  # noqa: BLE001 - not installed, no driver
        return None


def setup_devices(args, part=None):
    """Before TensorFlow starts: logical CPUs (smoke) or a GPU cap."""
    import tensorflow as tf

    if args.mode == "smoke" and not tf.config.list_physical_devices("GPU"):
        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
        )
    elif part == "find_batch_size":
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            tf.config.set_logical_device_configuration(
                gpus[0],
                [
                    tf.config.LogicalDeviceConfiguration(
                        memory_limit=args.gpu_memory_limit
                    )
                ],
            )


# -- the report ---------------------------------------------------------------


def _cell(value, unit):
    if value is None:
        return "-"
    if unit in ("", None):
        return str(value)
    return f"{value} {unit}" if unit not in ("x", "%") else f"{value}{unit}"


def markdown(report: dict) -> str:
    env = report["environment"]
    device_run = report["device_run"]
    lines = []
    if report.get("note"):
        lines += [f"**{report['note']}**", ""]
    versions = (
        f"TF {env.get('tensorflow')}, Keras {env.get('keras')}, tfmemopt "
        f"{env.get('tfmemopt')}, Python {env.get('python')}"
    )
    if env.get("cuda_version"):
        versions += (
            f", CUDA {env.get('cuda_version')}, cuDNN "
            f"{env.get('cudnn_version')}"
        )
    if env.get("nvml_driver"):
        versions += f", driver {env['nvml_driver']}"
    lines.append(
        f"Device: {', '.join(env['device_names'])} ({env['kind']}; "
        f"{len(env['gpus'])} GPU(s)). {versions}. Mode {report['mode']}, "
        f"started {report['started']}, {report.get('elapsed_s', '?')} s "
        f"in all."
    )
    lines += [
        "",
        "| part | status | seconds (budget) | why |",
        "|---|---|---|---|",
    ]
    for name, part in report["parts"].items():
        why = part.get("reason") or part.get("error") or part.get("cut") or ""
        why = why.splitlines()[0][:160] if why else ""
        lines.append(
            f"| {name} | {part.get('status')} | {part.get('seconds', '-')} "
            f"({part.get('budget_s', '-')}) | {why.replace('|', '/')} |"
        )
    head = "on this device" if device_run else "this run (not a device)"
    lines += [
        "",
        f"| part | figure | {head} | CPU (BENCHMARKS.md) | note |",
        "|---|---|---|---|---|",
    ]
    for name, part in report["parts"].items():
        for f in part.get("figures", []):
            src = f" ({f['cpu_source'][0]})" if f.get("cpu_source") else ""
            cpu = f"{f['cpu']}{src}" if f.get("cpu") else "-"
            note = str(f.get("note") or "").replace("|", "/")
            figure = str(f["figure"]).replace("|", "/")
            lines.append(
                f"| {name} | {figure} | {_cell(f['value'], f['unit'])} "
                f"| {cpu} | {note} |"
            )
    return "\n".join(lines) + "\n"


def write_report(report, out):
    _write_json(os.path.join(out, "accelerator.json"), report)
    with open(os.path.join(out, "accelerator.md"), "w") as f:
        f.write(markdown(report))


# -- main ---------------------------------------------------------------------


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("auto", "full", "smoke"), default="auto")
    default_out = os.environ.get("OUT") or os.path.join(HERE, "accelerator_out")
    p.add_argument("--out", default=default_out)
    p.add_argument("--parts", default=",".join(ORDER))
    p.add_argument("--isolate", choices=("auto", "yes", "no"), default="auto")
    p.add_argument("--write-benchmarks", action="store_true")
    p.add_argument("--fail", default=os.environ.get("TFMEMOPT_ACCEL_FAIL", ""))
    p.add_argument("--simulate-oom", action="store_true")
    p.add_argument("--gpu-memory-limit", type=int, default=4096)
    p.add_argument("--total-budget", type=float, default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--budget", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.fail = [f for f in args.fail.split(",") if f]
    args.parts = [x for x in args.parts.split(",") if x]
    unknown = [x for x in args.parts + args.fail if x not in BUDGETS]
    if unknown:
        p.error(f"unknown part(s) {unknown}; the parts are {', '.join(ORDER)}")
    return args


def child_main(args):
    """`--child PART`: one part in this process, its file kept current."""
    setup_devices(args, args.child)
    env = detect(args)
    path = os.path.join(args.out, f"part_{args.child}.json")

    def flush():
        _write_json(path, flush.ctx.result)

    result = run_part(args.child, env, args, args.budget, flush)
    _write_json(path, result)


def main(argv=None):
    args = parse(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.child:
        return child_main(args)
    import tensorflow as tf

    accelerator = bool(
        tf.config.list_physical_devices("GPU")
        or tf.config.list_physical_devices("TPU")
    )
    if args.mode == "auto":
        args.mode = "full" if accelerator else "smoke"
    isolate = {"yes": True, "no": False}.get(args.isolate, accelerator)
    if not isolate:
        setup_devices(args)
    env = detect(args)
    if args.mode == "smoke" and not isolate:
        # Every part runs in this process and starts with gc.collect()
        # (_accelerator_parts.fresh): freezing what the imports made spares
        # each collection a walk over TensorFlow's objects (about 4 s of CPU
        # in a smoke run); the models the parts build stay collectable.
        import _accelerator_parts  # noqa: F401 - imports keras and tfmemopt

        gc.freeze()
    device_run = env["kind"] != "CPU" and args.mode == "full"
    note = ""
    if env["kind"] == "CPU":
        note = SMOKE_NOTE if args.mode == "smoke" else CPU_FULL_NOTE
    report = {
        "schema": 1,
        "mode": args.mode,
        "device_run": device_run,
        "isolated": isolate,
        "note": note,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "environment": env,
        "parts": {},
    }
    start = time.monotonic()
    total = args.total_budget or TOTAL_BUDGET[args.mode]
    write_report(report, args.out)
    for name in args.parts:
        left = total - (time.monotonic() - start)
        budget = BUDGETS[name][0 if args.mode == "full" else 1]
        budget = min(budget, left)
        if budget < 10:
            report["parts"][name] = {
                "status": "skipped",
                "reason": f"no time left in the run's budget of {total} s",
                "figures": [],
            }
            continue
        reason = precheck(name, env, args)
        if reason:
            report["parts"][name] = {
                "status": "skipped",
                "reason": reason,
                "figures": [],
            }
            write_report(report, args.out)
            continue
        print(f"accelerator: {name} (budget {budget:.0f} s)", flush=True)
        # The capped GPU of find_batch_size needs a process of its own.
        if isolate or (name == "find_batch_size" and env["kind"] == "GPU"):
            result = run_isolated(name, env, args, budget)
        else:

            def flush():
                report["parts"][name] = flush.ctx.result
                write_report(report, args.out)

            result = run_part(name, env, args, budget, flush)
        report["parts"][name] = result
        report["elapsed_s"] = round(time.monotonic() - start, 1)
        write_report(report, args.out)
        print(
            f"accelerator: {name}: {result['status']} in "
            f"{result.get('seconds')} s, {len(result.get('figures', []))} "
            "figures",
            flush=True,
        )
    report["elapsed_s"] = round(time.monotonic() - start, 1)
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    write_report(report, args.out)
    print(markdown(report))
    print(f"wrote {os.path.join(args.out, 'accelerator.json')} and .md")
    if args.write_benchmarks:
        if not device_run:
            print(
                "--write-benchmarks: not written, this was not a device run "
                f"(mode {args.mode} on {env['kind']})",
                file=sys.stderr,
            )
            return 2
        import _report

        body = "## Measured on an accelerator\n\n" + markdown(report)
        _report.write_section("accelerator", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
