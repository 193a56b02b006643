"""Out-of-memory report: what was in use, what was needed, what would fit.

`oom_report()` wraps any Keras `fit` (or any code): when TensorFlow runs
out of device memory inside it, it raises `OutOfMemoryError`, a
`tf.errors.ResourceExhaustedError` (so existing `except` clauses still
catch it) whose message and `.report` say how much memory the device held
at the failure, the estimated breakdown of what training needs, and the
plan (micro-batch, accumulation steps, checkpointing, precision, and where
the model state itself is too large, `ShardedOptimizer` across the
replicas or an 8-bit or factored optimizer) that would fit.
`tfmemopt.Model.fit` does this by itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import tensorflow as tf

from tfmemopt import memory
from tfmemopt._utils import REGIME_TEXT
from tfmemopt._utils import check_int
from tfmemopt._utils import format_mib as _mib
from tfmemopt._utils import keyword_options
from tfmemopt._utils import step_regime
from tfmemopt.accumulation import add_fit_hook
from tfmemopt.estimate import estimate_memory
from tfmemopt.precision import low_precision_update_findings
from tfmemopt.tuning._errors import first_line
from tfmemopt.tuning._errors import is_oom
from tfmemopt.tuning._planner import plan
from tfmemopt.tuning._search import parse_bytes
from tfmemopt.tuning._state_options import replicas_of
from tfmemopt.tuning._trials import default_device


@dataclasses.dataclass
class OOMReport:
    """What an out-of-memory failure needed and what would have fitted.

    Attributes:
        error: Str, the first line of TensorFlow's error.
        device: Str, the device whose memory is reported.
        batch_size: Int or `None`, the batch size that failed.
        device_memory: Dict `{"current", "peak"}` in bytes at the failure,
            or `None` when the device keeps no statistics.
        estimate: The `MemoryEstimate` for the failing batch, or `None`.
        plan: The `Plan` that would fit, or `None` (with `plan_error`
            saying why none was made).
        plan_error: Str, why there is no plan (`""` when there is one).
        precision: List of `Finding`: bfloat16 weights whose optimizer
            makes no step or rounds it away (see `check_precision`).
        regime: `"xla"` or `"graph"`: whether the model's step was
            compiled by XLA (`jit_compile`), or `None` (no model, or not
            compiled).
    """

    error: str
    device: str
    batch_size: int | None = None
    device_memory: dict | None = None
    estimate: object = None
    plan: object = None
    plan_error: str = ""
    precision: list = dataclasses.field(default_factory=list)
    regime: str | None = None

    @property
    def text(self) -> str:
        """The report as text (also the `OutOfMemoryError` message)."""
        lines = [f"Out of memory on {self.device}: {self.error}"]
        if self.batch_size is not None:
            lines.append(f"  batch size: {self.batch_size}")
        if self.regime is not None:
            lines.append(f"  step ran under: {REGIME_TEXT[self.regime]}")
            if self.regime == "xla" and self.estimate is not None:
                lines.append(
                    "  (the estimate and the plan are read from XLA's "
                    "buffer assignment of the compiled step: docs/xla.md)"
                    if self.estimate.compiled
                    else "  (the estimate and the plan model the graph "
                    "executor; XLA's peak can differ: docs/xla.md)"
                )
        if self.device_memory is not None:
            lines.append(
                f"  device memory at failure: "
                f"{_mib(self.device_memory['current'], 'unknown')} in use, "
                f"{_mib(self.device_memory['peak'], 'unknown')} peak"
            )
        else:
            lines.append("  device memory at failure: no statistics")
        if self.estimate is not None:
            lines.append("  estimated need:")
            lines.extend("    " + s for s in str(self.estimate).splitlines())
        if self.plan is not None:
            lines.append("  plan that would fit:")
            lines.extend("    " + s for s in str(self.plan).splitlines())
        elif self.plan_error:
            lines.append(f"  no plan: {self.plan_error}")
        for finding in self.precision:
            lines.append(f"  precision: {finding.message}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text


class OutOfMemoryError(tf.errors.ResourceExhaustedError):
    """TensorFlow's `ResourceExhaustedError`, with an `OOMReport` attached.

    Attributes:
        report: The `OOMReport`.
    """

    def __init__(self, report: OOMReport, original=None):
        super().__init__(
            getattr(original, "node_def", None),
            getattr(original, "op", None),
            report.text,
        )
        self.report = report

    def __reduce__(self):
        return (type(self), (self.report,))


def build_report(
    error: BaseException,
    model=None,
    batch_size: int | None = None,
    memory_budget=None,
    device: str | None = None,
    replicas: int | None = None,
) -> OOMReport:
    """An `OOMReport` for `error`; no part of it ever raises."""
    try:
        device = device or default_device()
    except Exception:  # noqa: BLE001 - a report must never fail
        device = "CPU:0"
    report = OOMReport(
        error=first_line(error),
        device=device,
        batch_size=batch_size,
    )
    try:
        report.device_memory = memory.device_memory(device)
    except Exception:  # noqa: BLE001
        report.device_memory = None
    report.regime = step_regime(model)
    if model is not None:
        try:
            report.precision = low_precision_update_findings(
                model, getattr(model, "optimizer", None)
            )
        except Exception:  # noqa: BLE001
            report.precision = []
    if model is None or batch_size is None:
        missing = "model" if model is None else "batch size"
        report.plan_error = (
            f"the {missing} is unknown: pass `model` and `batch_size` to "
            "oom_report() (or fit a dataset with a fixed batch size) for an "
            "estimate and a plan"
        )
        return report
    try:
        replicas = replicas or replicas_of(model)
        report.estimate = estimate_memory(
            model,
            batch_size,
            optimizer=getattr(model, "optimizer", None),
            replicas=replicas,
        )
    except Exception as e:  # noqa: BLE001
        report.plan_error = f"no estimate ({type(e).__name__}: {e})"
    budget = memory_budget
    if budget is None and report.device_memory is not None:
        # What the device held when it failed is about what it can hold.
        budget = report.device_memory["peak"] or None
    if budget is None:
        why = (
            f"the device's peak at the failure reads 0 bytes ({device}'s "
            "allocator counted nothing before the error), so there is no "
            "memory budget"
            if report.device_memory is not None
            else "no memory budget"
        )
        report.plan_error = report.plan_error or (
            f"{why}: pass `memory_budget` to oom_report(), or find what fits "
            "with tfmemopt.find_batch_size()"
        )
        return report
    try:
        report.plan = plan(model, batch_size, budget, replicas=replicas)
    except Exception as e:  # noqa: BLE001
        report.plan_error = f"{type(e).__name__}: {e}"
    return report


def fit_batch_size(args: tuple, kwargs: dict) -> int | None:
    """The global batch size of a `fit(*args, **kwargs)` call, if known."""
    if kwargs.get("batch_size") is not None:
        return int(kwargs["batch_size"])
    if len(args) > 2 and args[2] is not None:
        return int(args[2])
    x = args[0] if args else kwargs.get("x")
    if x is None:
        return None
    if isinstance(x, tf.data.Dataset):
        first = tf.nest.flatten(x.element_spec)[0]
        dim = first.shape[0] if first.shape.rank else None
        return int(dim) if dim is not None else None
    if hasattr(x, "shape") or isinstance(x, (dict, list, tuple)):
        return 32  # Keras's default for arrays
    return None


@keyword_options
@contextlib.contextmanager
def oom_report(
    model=None,
    batch_size: int | None = None,
    *,
    memory_budget=None,
    device: str | None = None,
    replicas: int | None = None,
) -> Iterator[None]:
    """Turns an out-of-memory error inside the block into a report.

    Costs nothing until an error happens; then it reads the device's
    memory, estimates the breakdown and plans a configuration that fits
    (pure arithmetic, no extra training).

    Args:
        model: `keras.Model` or `None`, defaults to `None`. Needed for the
            estimate and the plan.
        batch_size: Int or `None`, defaults to `None`. The global batch that
            failed (what was passed to `fit`).
        memory_budget: Int bytes, str such as `"16GiB"`, or `None`, defaults
            to `None`: the memory to plan for; `None` uses the device's
            peak at the failure (about its capacity).
        device: Str or `None`, defaults to the first accelerator, else
            `"CPU:0"`.
        replicas: Int or `None`, defaults to `None`: the replicas of the
            model's `tf.distribute` strategy. With several, a plan may
            shard the optimizer state (`tfmemopt.ShardedOptimizer`).

    Raises:
        OutOfMemoryError: a `tf.errors.ResourceExhaustedError` carrying the
            report, raised from the original error. Other errors pass
            through untouched.

    Example:

    >>> import tfmemopt
    >>> with tfmemopt.oom_report(model, batch_size=256):  # doctest: +SKIP
    ...     model.fit(x, y, batch_size=256)
    """
    # Checked now, not when the error comes (the report would then say
    # "batch size: -1" and plan nothing).
    if batch_size is not None:
        check_int("batch_size", batch_size)
    if replicas is not None:
        check_int("replicas", replicas)
    if memory_budget is not None:
        parse_bytes(memory_budget)
    if device is not None and not isinstance(device, str):
        raise TypeError(
            f"device must be a str such as 'GPU:0' or None. Received: "
            f"device={device!r} (of type {type(device).__name__})."
        )
    try:
        yield
    except OutOfMemoryError:
        raise
    except Exception as e:
        if not is_oom(e):
            raise
        report = build_report(
            e, model, batch_size, memory_budget, device, replicas
        )
        raise OutOfMemoryError(report, e) from e


@add_fit_hook
def _report_around_fit(model, args: tuple, kwargs: dict):
    """`tfmemopt.Model.fit` runs inside this (registered on import)."""
    return oom_report(model, batch_size=fit_batch_size(args, kwargs))
