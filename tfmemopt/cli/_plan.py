"""`tfmemopt find-batch-size` and `tfmemopt plan` (see `tfmemopt.cli`)."""

from __future__ import annotations

import json

from tfmemopt.cli._commands import bad_input
from tfmemopt.cli._commands import json_argument
from tfmemopt.cli._commands import load_saved_model
from tfmemopt.cli._commands import model_arguments
from tfmemopt.cli._commands import sizes_and_model
from tfmemopt.cli._commands import subcommand

_ALLOW = (
    "accumulation",
    "checkpointing",
    "mixed_precision",
    "sharding",
    "long_sequences",
    "optimizer_state",
)


def _load(args, command: str):
    return load_saved_model(
        args.model,
        command,
        compile_as=dict(optimizer="adam", loss="mse"),
        imports=args.imports,
    )


def _synthetic_data(model, n: int = 64, input_shape=None, sequence_length=None):
    """Random inputs and zero targets shaped like the model's.

    Inputs come from the estimator's specs (a dict for dict inputs, the
    unknown dimensions sized by `input_shape`/`sequence_length`: a
    variable-length input has no size of its own); targets from one
    forward pass of one sample. Integer inputs are zeros (token ids),
    except masks (ones: a mask of zeros masks every position).
    """
    import numpy as np
    import tensorflow as tf

    from tfmemopt.estimate import input_specs

    rng = np.random.default_rng(0)
    specs = input_specs(model, n, input_shape, sequence_length)
    names = list(specs) if isinstance(specs, dict) else [None] * len(specs)

    def sample(spec, name):
        if spec.dtype.is_integer or spec.dtype.is_bool:
            fill = np.ones if name and "mask" in name else np.zeros
            return fill(spec.shape, spec.dtype.as_numpy_dtype)
        return rng.normal(size=spec.shape).astype("float32")

    if isinstance(specs, dict):
        x = {k: sample(v, k) for k, v in specs.items()}
    else:
        xs = [sample(v, k) for v, k in zip(specs, names)]
        x = xs[0] if len(xs) == 1 else xs
    one = tf.nest.map_structure(lambda a: a[:1], x)
    outputs = tf.nest.flatten(model(one, training=False))
    loss = str(getattr(model, "loss", "")).lower()
    if "sparse" in loss:
        ys = [np.zeros((n,) + tuple(o.shape[1:-1]), "int32") for o in outputs]
    else:
        ys = [np.zeros((n,) + tuple(o.shape[1:]), "float32") for o in outputs]
    return (x, ys[0] if len(ys) == 1 else ys)


def _data(path, model, sizes):
    if path is None:
        return _synthetic_data(model, **sizes)
    import numpy as np

    try:
        with np.load(path) as f:
            return (f["x"], f["y"])
    except (OSError, KeyError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(
            f"--data {path!r} cannot be read ({type(e).__name__}: {e}). "
            "Expected an .npz file with arrays 'x' and 'y' "
            "(numpy.savez(path, x=x, y=y)), or leave --data out for "
            "synthetic data."
        ) from None


def _find_arguments(parser):
    model_arguments(parser)
    parser.add_argument(
        "--memory",
        default=None,
        help="memory budget per device, e.g. 16GiB (optional; without it "
        "only out-of-memory errors end the search)",
    )
    parser.add_argument(
        "--mode",
        default="binsearch",
        choices=("binsearch", "power"),
        help="after doubling: bisect, or climb by halving powers of two "
        "(default: binsearch)",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=4096,
        help="largest batch tried (default: 4096)",
    )
    parser.add_argument(
        "--multiple-of",
        type=int,
        default=8,
        help="every tried batch is a multiple of it (default: 8)",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=0.05,
        help="fraction taken off the largest batch that fits (default: 0.05)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=2,
        help="training steps per trial (default: 2)",
    )
    parser.add_argument(
        "--target",
        type=int,
        default=None,
        help="a global batch to split into micro-batches that fit",
    )
    parser.add_argument(
        "--data",
        default=None,
        help=".npz with arrays x and y (default: random inputs of the "
        "model's shapes)",
    )
    json_argument(parser)


@subcommand(
    "find-batch-size",
    "Find the largest batch size that trains within memory.",
    _find_arguments,
)
def _find(args) -> int:
    loaded = sizes_and_model(args, "find-batch-size", _load)
    if isinstance(loaded, int):
        return loaded
    sizes, model = loaded
    from tfmemopt._utils import check_int
    from tfmemopt.tuning import find_batch_size

    try:
        if args.target is not None:  # before the search, not after it
            check_int("target_batch_size", args.target)
        found = find_batch_size(
            model,
            _data(args.data, model, sizes),
            mode=args.mode,
            memory_budget=args.memory,
            max_batch_size=args.max_batch_size,
            multiple_of=args.multiple_of,
            margin=args.margin,
            steps_per_trial=args.steps,
            verbose=0 if args.json else 1,
        )
        split = found.suggest(args.target) if args.target is not None else None
    except (ValueError, TypeError, RuntimeError) as e:
        return bad_input("find-batch-size", e)
    if args.json:
        out = {
            "batch_size": found.batch_size,
            "largest_fitting": found.largest_fitting,
            "limit_bytes": found.limit_bytes,
            "trials": [vars(t) for t in found.trials],
        }
        if found.note:
            out["note"] = found.note
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
    model_arguments(parser)
    parser.add_argument(
        "--batch-size",
        type=int,
        required=True,
        help="global batch per optimizer update, all replicas",
    )
    parser.add_argument(
        "--memory", required=True, help="memory budget per device, e.g. 16GiB"
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="data-parallel replicas (default: 1)",
    )
    parser.add_argument(
        "--multiple-of",
        type=int,
        default=8,
        help="preferred micro-batch alignment (default: 8): other "
        "micro-batches are tried only where no aligned one fits",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=None,
        help="fraction of the budget kept free for the estimator's error "
        "(default: tfmemopt.plan's, 0.25; docs/estimator.md says why)",
    )
    parser.add_argument(
        "--allow",
        default=",".join(_ALLOW),
        help="comma-separated techniques the plan may use, from: "
        f"{', '.join(_ALLOW)} (default: all). sharding: wrap the optimizer "
        "in tfmemopt.ShardedOptimizer (1/R of its state per replica, needs "
        "--replicas > 1), or shard the weights too with "
        "tfmemopt.Model(..., shard_parameters=True) (1/R of the weights, "
        "gradients and state); long_sequences: "
        "chunked_loss=True and attention='chunked' when the logits or the "
        "attention scores do not fit; optimizer_state: switch "
        "to an 8-bit or factored optimizer (AdamW8bit/Adam8bit, "
        "Adafactor) when the model state leaves too little memory",
    )
    json_argument(parser)


@subcommand(
    "plan",
    "Choose accumulation, checkpointing and precision that fit memory.",
    _plan_arguments,
)
def _plan(args) -> int:
    allow = tuple(a.strip() for a in args.allow.split(",") if a.strip())
    unknown = [a for a in allow if a not in _ALLOW]

    def check_allow():
        if unknown:
            raise ValueError(
                f"--allow takes names from {', '.join(_ALLOW)}. Received: "
                f"{args.allow!r} (unknown: {', '.join(unknown)})."
            )

    loaded = sizes_and_model(args, "plan", _load, check_allow)
    if isinstance(loaded, int):
        return loaded
    sizes, model = loaded
    from tfmemopt.tuning import MARGIN
    from tfmemopt.tuning import plan

    try:
        result = plan(
            model,
            args.batch_size,
            args.memory,
            **sizes,
            allow=allow,
            replicas=args.replicas,
            multiple_of=args.multiple_of,
            margin=MARGIN if args.margin is None else args.margin,
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
