"""The `tfmemopt` command: `tfmemopt estimate`, `tfmemopt doctor`, ...

Each subcommand is one function registered with `@subcommand(name, help)`;
its `arguments` function (optional) adds its options to an `argparse`
parser. To add a command, write in this module (or in a module of
`tfmemopt.cli` that this one imports, as it imports `_plan`):

    def _plan_arguments(parser):
        parser.add_argument("model")

    @subcommand("plan", "Choose settings that fit.", _plan_arguments)
    def _plan(args) -> int:
        ...
        return 0

TensorFlow is imported inside the subcommands, so `--help` is quick.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tfmemopt.cli import _plan  # noqa: F401 - registers its subcommands
from tfmemopt.cli._commands import COMMANDS
from tfmemopt.cli._commands import bad_input
from tfmemopt.cli._commands import json_argument
from tfmemopt.cli._commands import load_saved_model
from tfmemopt.cli._commands import model_arguments
from tfmemopt.cli._commands import sizes_and_model
from tfmemopt.cli._commands import subcommand

_INSTALL = {
    "nvidia-ml-py": "GPU memory through NVML (`pip install nvidia-ml-py`)",
    "matplotlib": "memory plots (`pip install matplotlib`)",
    "psutil": "host memory readings (`pip install psutil`)",
}


def _quiet_tensorflow():
    # Only effective when TensorFlow is not imported yet. Note that
    # TF_ENABLE_ONEDNN_OPTS (CPU memory statistics) must be set by the user's
    # shell: importing tfmemopt has imported TensorFlow already.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# --- estimate -------------------------------------------------------------


def _checkpointing_arg(value: str):
    if value.lower() in ("none", "off", "false"):
        return None
    if value.isdigit():
        return int(value)
    return value


def _load(args, command: str):
    return load_saved_model(args.model, command, imports=args.imports)


def _estimate_arguments(parser):
    model_arguments(parser)
    parser.add_argument(
        "--batch-size", type=int, required=True, help="global batch size"
    )
    parser.add_argument(
        "--optimizer",
        default=None,
        help="optimizer name, case-insensitive (default: the saved one, "
        "else adam): Keras's (adam, adamw, sgd, ...), tfmemopt's (Adam8bit, "
        "AdamW8bit, Adafactor, tfmemopt.optimizers.<name>) and every name "
        "`tfmemopt plan` prints, e.g. 'tfmemopt.ShardedOptimizer(AdamW8bit, "
        "stage=1)'. 'adafactor' is tfmemopt.optimizers.Adafactor; Keras's "
        "is keras.optimizers.Adafactor",
    )
    parser.add_argument(
        "--policy",
        default=None,
        help="dtype policy, e.g. mixed_bfloat16 (default: the model's)",
    )
    parser.add_argument(
        "--accumulation-steps",
        type=int,
        default=None,
        help="micro-batches per step (default: a saved tfmemopt.Model's "
        "own, else 1)",
    )
    parser.add_argument(
        "--checkpointing",
        type=_checkpointing_arg,
        default=None,
        help="none, auto, blocks, or layers per segment",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="data-parallel replicas sharing the batch (default: 1)",
    )
    parser.add_argument(
        "--shard-parameters",
        action="store_true",
        help="the weights sharded over the replicas (tfmemopt.Model(..., "
        "shard_parameters=True), FSDP): 1/R of the weights, gradients and "
        "optimizer state per replica, plus the gathered weights",
    )
    parser.add_argument(
        "--chunked-loss",
        action="store_true",
        help="the language-model loss from the head's input in chunks "
        "(tfmemopt.Model(..., chunked_loss=True)): the logits never formed",
    )
    parser.add_argument(
        "--attention",
        choices=["chunked"],
        default=None,
        help="chunked: every MultiHeadAttention in query blocks "
        "(tfmemopt.Model(..., attention='chunked'))",
    )
    parser.add_argument(
        "--jit-compile",
        type=_jit_compile_arg,
        default=None,
        help="auto, true or false (default: the saved model's own compile, "
        "else auto: XLA on a machine with a GPU or TPU). true: the step is "
        "compiled with XLA for this machine, not run, and the estimate read "
        "from XLA's buffer assignment",
    )
    json_argument(parser, "a table")


def _jit_compile_arg(text: str):
    value = {"auto": "auto", "true": True, "false": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(
            f"--jit-compile takes auto, true or false; received {text!r}"
        )
    return value


@subcommand(
    "estimate",
    "Estimate the memory of one training step of a saved model.",
    _estimate_arguments,
)
def _estimate(args) -> int:
    loaded = sizes_and_model(args, "estimate", _load)
    if isinstance(loaded, int):
        return loaded
    sizes, model = loaded
    from tfmemopt.estimate import estimate_memory

    try:
        estimate = estimate_memory(
            model,
            args.batch_size,
            **sizes,
            optimizer=args.optimizer,
            policy=args.policy,
            accumulation_steps=args.accumulation_steps,
            checkpointing=args.checkpointing,
            replicas=args.replicas,
            shard_parameters=True if args.shard_parameters else None,
            chunked_loss=True if args.chunked_loss else None,
            attention=args.attention,
            jit_compile=args.jit_compile,
        )
    except (ValueError, TypeError) as e:
        return bad_input("estimate", e)
    if args.json:
        print(json.dumps(estimate.to_dict(), indent=2))
    else:
        print(estimate.table())
    return 0


# --- doctor ---------------------------------------------------------------


def _doctor_arguments(parser):
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="optional saved model (.keras) to check its precision: "
        "16-bit outputs and softmax, loss scaling, and bfloat16 weights "
        "whose optimizer makes no step",
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON instead of text"
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module to import first (custom layers); repeatable",
    )


def doctor_model(model) -> list:
    """`check_precision`'s findings on `model` (its compiled optimizer),
    as `{"code", "severity", "layer", "message"}` dicts."""
    from tfmemopt.precision import check_precision

    return [
        {
            "code": f.code,
            "severity": f.severity,
            "layer": f.layer,
            "message": f.message,
        }
        for f in check_precision(model)
    ]


def doctor_report() -> dict:
    """What `tfmemopt doctor` finds, as a dict (JSON-serialisable)."""
    _quiet_tensorflow()
    import keras
    import tensorflow as tf

    from tfmemopt import memory

    report = {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "python": sys.version.split()[0],
        "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "devices": [],
        "missing": {},
    }
    for name in memory.local_devices():
        entry = {"device": name, "stats": False}
        with tf.device(name):  # the allocator exists once it is used
            tf.constant(0.0) + 1.0
        try:
            info = memory.device_memory(name)
            entry.update(stats=True, current=info["current"], peak=info["peak"])
        except memory.MemoryStatsUnavailable as e:
            entry["why"] = str(e)
        if name.startswith("GPU") and memory.nvml_available():
            nvml = memory.nvml_memory(name)
            if nvml:
                entry["nvml"] = nvml
        report["devices"].append(entry)
    try:
        import psutil

        report["host_memory"] = int(psutil.virtual_memory().total)
    except ImportError:
        report["missing"]["psutil"] = _INSTALL["psutil"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        report["missing"]["matplotlib"] = _INSTALL["matplotlib"]
    gpus = tf.config.list_physical_devices("GPU")
    if gpus and not memory.nvml_available():
        report["missing"]["nvidia-ml-py"] = _INSTALL["nvidia-ml-py"]
    try:
        from tfmemopt.precision import choose_policy
        from tfmemopt.precision import detect_hardware
    except ImportError:
        report["auto_policy"] = None
    else:
        try:
            hardware = detect_hardware()
            policy, why = choose_policy(hardware)
            report["auto_policy"] = {"policy": policy, "why": why}
        except Exception as e:  # doctor reports, it never crashes
            report["auto_policy"] = {"policy": None, "why": repr(e)}
    from tfmemopt._utils import auto_jit_compile_here

    # The regime Keras picks for compile(jit_compile="auto") here.
    report["auto_jit_compile"] = auto_jit_compile_here()
    report["sharding"] = _sharding(report["devices"])
    return report


def _sharding(devices) -> dict | None:
    """With several accelerators: the estimator's bytes per parameter
    with and without `ShardedOptimizer` (Adam), else `None`."""
    from tfmemopt.tuning import sharding_per_parameter

    count = sum(1 for d in devices if not d["device"].startswith("CPU"))
    if count < 2:
        return None
    try:
        return sharding_per_parameter("adam", count)
    except Exception:  # noqa: BLE001 - doctor reports, it never crashes
        return None


def _doctor_text(report: dict) -> str:
    # Here, not at the top: tfmemopt._utils imports Keras, and the parser
    # (this module) must load without TensorFlow for a quick --help.
    from tfmemopt._utils import format_bytes

    lines = [
        f"TensorFlow {report['tensorflow']}, Keras {report['keras']}, "
        f"Python {report['python']}",
    ]
    if "host_memory" in report:
        lines.append(f"Host memory: {format_bytes(report['host_memory'])}")
    lines.append("Devices:")
    for d in report["devices"]:
        if d["stats"]:
            lines.append(
                f"  {d['device']}: memory statistics available "
                f"(in use {format_bytes(d['current'])}, "
                f"peak {format_bytes(d['peak'])})"
            )
        else:
            lines.append(f"  {d['device']}: no memory statistics")
            if d["device"].startswith("CPU"):
                lines.append(
                    "    CPU statistics need oneDNN's allocator: set "
                    "TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is imported "
                    f"(now: {report['TF_ENABLE_ONEDNN_OPTS']})."
                )
        if "nvml" in d:
            lines.append(f"    NVML: {d['nvml']}")
    auto = report.get("auto_policy")
    if auto is None:
        lines.append("configure('auto'): tfmemopt.mixed_precision not found")
    else:
        lines.append(f"configure('auto') would choose {auto['policy']}")
        lines.append(f"  because: {auto['why']}")
    if "auto_jit_compile" in report:
        lines.append(
            "compile(jit_compile='auto') runs the step under "
            + (
                "XLA here (a GPU or TPU is visible; not under tf.distribute)"
                if report["auto_jit_compile"]
                else "TensorFlow's graph executor here (no GPU or TPU)"
            )
        )
    if "regime" in report:
        from tfmemopt._utils import REGIME_TEXT

        regime = REGIME_TEXT.get(report["regime"], "unknown (not compiled)")
        lines.append(f"{report['model']}'s step runs under: {regime}")
    if report.get("sharding"):
        from tfmemopt.tuning import sharding_lines

        lines.extend(sharding_lines(report["sharding"]))
    if "precision" in report:
        lines.append(f"Precision of {report['model']}:")
        for f in report["precision"] or [
            {"severity": "ok", "layer": "", "message": "no findings"}
        ]:
            where = f" {f['layer']}:" if f["layer"] else ""
            lines.append(f"  [{f['severity']}]{where} {f['message']}")
    if report["missing"]:
        lines.append("Missing (install for):")
        for package, why in report["missing"].items():
            lines.append(f"  {package}: {why}")
    else:
        lines.append("Nothing missing.")
    return "\n".join(lines)


@subcommand(
    "doctor",
    "Report versions, devices, memory statistics and what is missing.",
    _doctor_arguments,
)
def _doctor(args) -> int:
    report = doctor_report()
    if args.model is not None:
        model = load_saved_model(args.model, "doctor", imports=args.imports)
        if model is None:
            return 2
        from tfmemopt._utils import step_regime

        report["model"] = args.model
        report["precision"] = doctor_model(model)
        report["regime"] = step_regime(model)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(_doctor_text(report))
    return 0


# --- entry point ----------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The `tfmemopt` parser with one subparser per registered command."""
    parser = argparse.ArgumentParser(
        prog="tfmemopt",
        description="Memory tools for training Keras models on TensorFlow.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help, arguments, run) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help, description=help)
        arguments(sub)
        sub.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs `tfmemopt ...`; returns the exit code (0 success, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 2
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
