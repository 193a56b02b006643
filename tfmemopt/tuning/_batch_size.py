"""Find the largest batch that fits; keep the batch you want with accumulation.

`find_batch_size` trains a few steps at growing batch sizes (on the model
itself, restored after every trial) and keeps the largest aligned batch
whose peak memory stays within the budget, or that does not run out of
device memory. `suggest_accumulation` then splits the batch you want into
micro-batches of at most that size, so the effective batch never changes
(Lightning's and Accelerate's finders keep the accumulation steps fixed and
so change it; transformers#33281). The search itself is a pure function in
`tfmemopt._search`.
"""

from __future__ import annotations

import dataclasses
import math

import keras

from tfmemopt._utils import check_int
from tfmemopt._utils import format_mib
from tfmemopt._utils import keyword_options
from tfmemopt.tuning import _search
from tfmemopt.tuning._search import Accumulation
from tfmemopt.tuning._search import Trial
from tfmemopt.tuning._trials import TrialRunner


@dataclasses.dataclass
class BatchSizeResult:
    """What `find_batch_size` found.

    Attributes:
        batch_size: Int, the batch size to use (a multiple of `multiple_of`).
        largest_fitting: Int, the largest batch that fitted in a trial
            (`batch_size` is smaller only when `margin` was applied to it).
        trials: List of `Trial(batch_size, fits, peak_bytes, reason)`, in
            the order they ran.
        limit_bytes: Int or `None`, the peak a trial had to stay within
            (`memory_budget`), `None` without a budget.
        mode: Str, the search mode.
        multiple_of: Int, the alignment of every tried batch.
        device: Str, the device whose memory was measured.
        note: Str (a property), why every trial read a peak of 0 bytes
            (on CPU: all the steps' tensors are under the allocator
            statistics' 256 KiB floor), or "" where one did not.
    """

    batch_size: int
    largest_fitting: int
    trials: list[Trial]
    limit_bytes: int | None
    mode: str
    multiple_of: int
    device: str

    def table(self) -> str:
        """The trials as a Markdown table (batch, peak MiB, fits, reason)."""
        rows = ["| batch | peak MiB | fits | reason |", "|---|---|---|---|"]
        for t in self.trials:
            rows.append(
                f"| {t.batch_size} | {format_mib(t.peak_bytes, unit=False)} | "
                f"{'yes' if t.fits else 'no'} | {t.reason} |"
            )
        return "\n".join(rows)

    def __str__(self) -> str:
        limit = (
            f", limit {format_mib(self.limit_bytes)}"
            if self.limit_bytes
            else ""
        )
        return (
            f"batch_size={self.batch_size} on {self.device} ({self.mode}, "
            f"multiple_of={self.multiple_of}{limit})\n{self.table()}"
            + (f"\n{self.note}" if self.note else "")
        )

    @property
    def note(self) -> str:
        """Why every trial read a peak of 0 bytes, or "" where one did not."""
        peaks = [t.peak_bytes for t in self.trials if t.peak_bytes is not None]
        if not peaks or any(peaks):
            return ""
        where = (
            "on CPU the allocator's statistics do not count allocations "
            "under 256 KiB, and every tensor of these steps is smaller"
            if "CPU" in self.device.upper()
            else "the device's allocator counted nothing"
        )
        return (
            f"Every trial read a peak of 0 bytes: {where}. The budget "
            "bounded nothing; the batch is what the search reached "
            "(max_batch_size, or an out-of-memory error)."
        )

    def suggest(self, target_batch_size: int, replicas: int = 1):
        """Micro-batch and steps that make `target_batch_size` exactly.

        See `suggest_accumulation`; the largest micro-batch is the found
        `batch_size`.
        """
        return suggest_accumulation(
            target_batch_size,
            self.batch_size,
            multiple_of=self.multiple_of,
            replicas=replicas,
        )


def suggest_accumulation(
    target_batch_size: int,
    max_micro_batch: int,
    multiple_of: int = 8,
    replicas: int = 1,
) -> Accumulation:
    """Splits the batch you want into micro-batches that fit, exactly.

    Returns the largest micro-batch <= `max_micro_batch` that is a multiple
    of `multiple_of` and divides the per-replica batch, so that
    `micro_batch_size x accumulation_steps x replicas == target_batch_size`
    ("per-device 4 with 16 accumulation steps, not 1 with 64"). Costs
    nothing (arithmetic). Fewer, larger micro-batches run faster; each extra
    accumulation step costs one more forward/backward pass of a smaller
    batch, not more memory.

    Args:
        target_batch_size: Int, the global batch per optimizer update.
        max_micro_batch: Int, the largest micro-batch that fits (e.g.
            `find_batch_size(...).batch_size`).
        multiple_of: Int, defaults to `8`: preferred alignment (tensor cores
            want multiples of 8; TPUs of 128 on the batch dimension).
        replicas: Int, defaults to `1`: data-parallel replicas.

    Returns:
        `Accumulation(micro_batch_size, accumulation_steps, replicas,
        aligned, note)`; `.global_batch_size` is the product.

    Raises:
        ValueError: a non-positive argument, or a target not divisible by
            `replicas`. When no aligned micro-batch divides the target, a
            `UserWarning` says which unaligned split was chosen instead.

    Example:

    >>> import tfmemopt
    >>> s = tfmemopt.suggest_accumulation(64, max_micro_batch=4, multiple_of=4)
    >>> (s.micro_batch_size, s.accumulation_steps)
    (4, 16)
    """
    return _search.suggest_split(
        target_batch_size, max_micro_batch, multiple_of, replicas
    )


def _check_args(mode, max_batch_size, multiple_of, margin, steps_per_trial):
    if mode not in _search.MODES:
        raise ValueError(
            f"`mode` must be one of {_search.MODES}. Received: mode={mode!r}."
        )
    check_int("max_batch_size", max_batch_size)
    check_int("multiple_of", multiple_of)
    check_int("steps_per_trial", steps_per_trial)
    if not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ValueError(
            "`margin` must be a fraction in [0, 1) of the budget to keep "
            f"free. Received: margin={margin!r}."
        )


def _trial(runner, limit, verbose):
    """`fits(batch_size) -> Trial`: one trial on `runner` against `limit`."""

    def fits(batch_size: int) -> Trial:
        peak, oom = runner.run(batch_size)
        if oom:
            trial = Trial(batch_size, False, None, f"out of memory: {oom}")
        elif limit is not None and peak > limit:
            trial = Trial(batch_size, False, peak, "over budget")
        else:
            trial = Trial(batch_size, True, peak, "")
        if verbose:
            print(
                f"tfmemopt.find_batch_size: batch {batch_size:>6}: "
                f"{'fits' if trial.fits else 'does not fit'}, peak "
                f"{format_mib(peak)}"
                + (f" (limit {format_mib(limit)})" if limit else "")
                + (f" [{trial.reason}]" if trial.reason else ""),
                flush=True,
            )
        return trial

    return fits


@keyword_options
def find_batch_size(
    model: keras.Model,
    data,
    *,
    mode: str = "binsearch",
    memory_budget: int | str | None = None,
    max_batch_size: int = 4096,
    multiple_of: int = 8,
    margin: float = 0.05,
    steps_per_trial: int = 2,
    device: str | None = None,
    verbose: int = 1,
) -> BatchSizeResult:
    """Finds the largest aligned batch size that trains within memory.

    Each trial trains `steps_per_trial` steps at one batch size (multiples
    of `multiple_of`, doubling, then bisecting) and measures the device's
    peak memory: model and optimizer state plus what the steps needed. A
    trial fails when TensorFlow raises `ResourceExhaustedError` or when its
    peak exceeds `memory_budget` (works on any device whose allocator keeps
    statistics, CPU with oneDNN included); the largest batch that fits is
    then lowered by `margin`. Cost: about
    `2 log2(max_batch_size / multiple_of)` trials of a few steps each, one
    trace each. Trials run on `model` itself and never change it: weights,
    optimizer variables and iteration counter, metrics and the compiled
    train function are restored (an unbuilt optimizer is built, with the
    zero slots the first step would create).

    Args:
        model: A compiled `keras.Model` (a `tfmemopt.Model` searches its
            global batch with its own accumulation).
        data: As `fit` takes it: x alone, `(x, y)` or
            `(x, y, sample_weight)` of arrays, a batched `tf.data.Dataset`
            or a `keras.utils.PyDataset` yielding any of these; samples are
            repeated to fill large batches.
        mode: Str, defaults to `"binsearch"`; or `"power"`. Both double
            first; `"binsearch"` bisects, `"power"` climbs by halving powers
            of two. They agree to within one `multiple_of`.
        memory_budget: Int bytes, str (`"16GiB"`) or `None`, defaults to
            `None`: without it only out-of-memory errors end the search.
        max_batch_size: Int, defaults to `4096`.
        multiple_of: Int, defaults to `8`.
        margin: Float, defaults to `0.05`: the largest batch that fitted
            is lowered by this fraction (then down to a multiple of
            `multiple_of`), headroom for what a few trial steps do not see
            (fragmentation over a long run, input pipeline buffers). It is
            taken off the batch, not the budget: where weights and
            optimizer state fill most of the budget, 5% of the budget can
            be most of what the activations have.
        steps_per_trial: Int, defaults to `2`.
        device: Str or `None`, defaults to the first accelerator, else
            `"CPU:0"`.
        verbose: Int, defaults to `1`: print one line per trial.

    Returns:
        A `BatchSizeResult` (`.batch_size`, `.trials`, `.table()`,
        `.suggest(target_batch_size)`).

    Raises:
        ValueError: bad arguments, empty data, a budget smaller than the
            model and optimizer state (no batch can fit), or no batch of
            `multiple_of` samples fits.
        TypeError: `model` is not a `keras.Model` or `data` has no samples.
        RuntimeError: a `memory_budget` on a device that keeps no memory
            statistics.

    Example:

    >>> import tfmemopt
    >>> found = tfmemopt.find_batch_size(model, (x, y),  # doctest: +SKIP
    ...                                  memory_budget="8GiB")
    >>> found.suggest(256)  # doctest: +SKIP
    Accumulation(micro_batch_size=64, accumulation_steps=4, ...)
    """
    _check_args(mode, max_batch_size, multiple_of, margin, steps_per_trial)
    budget = None
    if memory_budget is not None:
        budget = _search.parse_bytes(memory_budget)
    runner = TrialRunner(model, data, steps_per_trial, device)
    limit = budget
    if limit is not None and not runner.stats:
        raise RuntimeError(
            f"`memory_budget` needs memory statistics from {runner.device}, "
            "which keeps none here. On CPU set TF_ENABLE_ONEDNN_OPTS=1 "
            "before TensorFlow is imported, or pass memory_budget=None to "
            "search until out-of-memory errors."
        )

    with runner:
        state = runner.resident_bytes
        if limit is not None and state >= limit:
            raise ValueError(
                "The model cannot fit at any batch size: its weights and "
                f"optimizer state alone take {format_mib(state)}, more than "
                f"memory_budget={budget} bytes ({format_mib(limit)}), and "
                "every batch needs more on top "
                "(gradients, activations). Raise the budget, use a smaller "
                "model or an optimizer with less state (SGD keeps none, Adam "
                "two slots per weight); accumulation and checkpointing only "
                "shrink activations."
            )

        fits = _trial(runner, limit, verbose)
        best, trials = _search.search(fits, mode, max_batch_size, multiple_of)
    if best is None:
        first = trials[0]
        raise ValueError(
            f"Not even batch_size={multiple_of} fits ({first.reason}; peak "
            f"{format_mib(first.peak_bytes)}, limit {format_mib(limit)}). Try "
            "multiple_of=1, activation checkpointing or mixed precision, or "
            "raise memory_budget."
        )
    chosen = best
    if margin:
        chosen = max(
            multiple_of,
            math.floor(best * (1 - margin) / multiple_of) * multiple_of,
        )
    return BatchSizeResult(
        batch_size=chosen,
        largest_fitting=best,
        trials=trials,
        limit_bytes=limit,
        mode=mode,
        multiple_of=multiple_of,
        device=runner.device,
    )
