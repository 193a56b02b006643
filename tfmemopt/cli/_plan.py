"""`tfmemopt find-batch-size` and `tfmemopt plan` (see `tfmemopt.cli`)."""

from __future__ import annotations

import json

from tfmemopt.cli._commands import bad_input
from tfmemopt.cli._commands import load_saved_model
from tfmemopt.cli._commands import subcommand


def _load(path: str, command: str):
    return load_saved_model(
        path, command, compile_as=dict(optimizer="adam", loss="mse")
    )


def _synthetic_data(model, n: int = 64):
    """Random inputs and zero targets shaped like the model's."""
    import numpy as np

    rng = np.random.default_rng(0)

    def sample(shape, dtype="float32"):
        shape = (n,) + tuple(d or 1 for d in shape[1:])
        if "int" in str(dtype):
            return np.zeros(shape, dtype)
        return rng.normal(size=shape).astype("float32")

    xs = [sample(t.shape, t.dtype) for t in model.inputs]
    outputs = model.outputs
    loss = str(getattr(model, "loss", "")).lower()
    if "sparse" in loss:
        ys = [np.zeros((n,) + tuple(o.shape[1:-1]), "int32") for o in outputs]
    else:
        ys = [np.zeros((n,) + tuple(o.shape[1:]), "float32") for o in outputs]
    return (xs[0] if len(xs) == 1 else xs, ys[0] if len(ys) == 1 else ys)


def _data(path, model):
    if path is None:
        return _synthetic_data(model)
    import numpy as np

    with np.load(path) as f:
        return (f["x"], f["y"])


def _find_arguments(parser):
    parser.add_argument("model", help="path of a saved model (.keras)")
    parser.add_argument(
        "--memory", default=None, help="memory budget, e.g. 16GiB (optional)"
    )
    parser.add_argument(
        "--mode", default="binsearch", choices=("binsearch", "power")
    )
    parser.add_argument("--max-batch-size", type=int, default=4096)
    parser.add_argument("--multiple-of", type=int, default=8)
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=2, help="per trial")
    parser.add_argument(
        "--target", type=int, default=None, help="global batch to split"
    )
    parser.add_argument(
        "--data", default=None, help=".npz with arrays x and y (else random)"
    )
    parser.add_argument("--json", action="store_true")


@subcommand(
    "find-batch-size",
    "Find the largest batch size that trains within memory.",
    _find_arguments,
)
def _find(args) -> int:
    model = _load(args.model, "find-batch-size")
    if model is None:
        return 2
    from tfmemopt.tuning._batch_size import find_batch_size

    try:
        found = find_batch_size(
            model,
            _data(args.data, model),
            mode=args.mode,
            memory_budget=args.memory,
            max_batch_size=args.max_batch_size,
            multiple_of=args.multiple_of,
            margin=args.margin,
            steps_per_trial=args.steps,
            verbose=0 if args.json else 1,
        )
        split = found.suggest(args.target) if args.target else None
    except (ValueError, TypeError, RuntimeError) as e:
        return bad_input("find-batch-size", e)
    if args.json:
        out = {
            "batch_size": found.batch_size,
            "largest_fitting": found.largest_fitting,
            "limit_bytes": found.limit_bytes,
            "trials": [vars(t) for t in found.trials],
        }
        if split:
            out["suggest"] = {
                "micro_batch_size": split.micro_batch_size,
                "accumulation_steps": split.accumulation_steps,
            }
        print(json.dumps(out, indent=2))
        return 0
    print(found)
    if split:
        print(
            f"batch {args.target} = micro_batch_size {split.micro_batch_size}"
            f" x accumulation_steps {split.accumulation_steps}"
        )
    return 0


def _plan_arguments(parser):
    parser.add_argument("model", help="path of a saved model (.keras)")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--memory", required=True, help="e.g. 16GiB")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--multiple-of", type=int, default=8)
    parser.add_argument(
        "--margin",
        type=float,
        default=0.15,
        help="fraction of the budget kept free for the estimator's error",
    )
    parser.add_argument(
        "--allow",
        default="accumulation,checkpointing,mixed_precision",
        help="comma-separated techniques the plan may use",
    )
    parser.add_argument("--json", action="store_true")


@subcommand(
    "plan",
    "Choose accumulation, checkpointing and precision that fit memory.",
    _plan_arguments,
)
def _plan(args) -> int:
    model = _load(args.model, "plan")
    if model is None:
        return 2
    from tfmemopt.tuning._planner import plan

    allow = tuple(a.strip() for a in args.allow.split(",") if a.strip())
    try:
        result = plan(
            model,
            args.batch_size,
            args.memory,
            allow=allow,
            replicas=args.replicas,
            multiple_of=args.multiple_of,
            margin=args.margin,
        )
    except (ValueError, TypeError) as e:
        return bad_input("plan", e)
    if args.json:
        out = {
            k: v
            for k, v in vars(result).items()
            if k not in ("considered", "measured_peak")
        }
        print(json.dumps(out, indent=2, default=str))
    else:
        print(result)
    return 0
