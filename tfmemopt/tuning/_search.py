"""The batch-size search and the micro-batch split, as pure functions.

Nothing here knows about Keras or TensorFlow: the search asks a callable
whether a batch size fits and returns the largest aligned one that does.
`find_batch_size` (the Keras glue) supplies a callable that trains a few
steps and measures memory; tests supply one with a known answer.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Callable

from tfmemopt._utils import check_int

MODES = ("power", "binsearch")

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


@dataclasses.dataclass(frozen=True)
class Trial:
    """One tried batch size.

    Attributes:
        batch_size: Int, the batch size that was tried.
        fits: Bool, whether it trained within the limit.
        peak_bytes: Int or `None`, measured peak training memory in bytes
            (`None` when the device keeps no statistics or it ran out of
            memory before finishing).
        reason: Str, why it does not fit (`""` when it fits).
    """

    batch_size: int
    fits: bool
    peak_bytes: int | None = None
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class Accumulation:
    """A micro-batch size and a number of accumulation steps.

    Attributes:
        micro_batch_size: Int, samples per forward/backward pass per replica.
        accumulation_steps: Int, micro-batches per optimizer update.
        replicas: Int, replicas that each run `micro_batch_size` samples.
        aligned: Bool, whether `micro_batch_size` is a multiple of the
            requested `multiple_of`.
        note: Str, what was chosen instead of an aligned split, if anything.
    """

    micro_batch_size: int
    accumulation_steps: int
    replicas: int = 1
    aligned: bool = True
    note: str = ""

    @property
    def global_batch_size(self) -> int:
        """micro_batch_size x accumulation_steps x replicas."""
        return self.micro_batch_size * self.accumulation_steps * self.replicas


def parse_bytes(value, name: str = "memory_budget") -> int:
    """`1073741824`, `"1GiB"`, `"512 MiB"`, `"1.5GB"` -> bytes (int)."""
    if isinstance(value, bool):
        value = repr(value)
    if isinstance(value, (int, float)) and value > 0:
        return int(value)
    if isinstance(value, str):
        match = re.fullmatch(
            r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value.replace("_", "")
        )
        if match and match.group(2).lower() in _UNITS:
            number = float(match.group(1)) * _UNITS[match.group(2).lower()]
            if number > 0:
                return int(number)
    raise ValueError(
        f"`{name}` must be a positive number of bytes or a string such as "
        f"'16GiB' or '512MiB'. Received: {name}={value!r}."
    )


def suggest_split(
    target_batch_size: int,
    max_micro_batch: int,
    multiple_of: int = 8,
    replicas: int = 1,
) -> Accumulation:
    """Splits a global batch into micro-batch x steps x replicas exactly.

    Prefers the largest micro-batch <= `max_micro_batch` that is a multiple of
    `multiple_of` and divides the per-replica batch (fewest steps, aligned
    shapes). When no aligned micro-batch divides it, takes the largest
    divisor instead and warns, saying what was chosen.
    """
    check_int("target_batch_size", target_batch_size)
    check_int("max_micro_batch", max_micro_batch)
    check_int("multiple_of", multiple_of)
    check_int("replicas", replicas)
    if target_batch_size % replicas:
        raise ValueError(
            f"`target_batch_size` must be divisible by `replicas` so that each "
            f"replica gets the same batch. Received: target_batch_size="
            f"{target_batch_size}, replicas={replicas}. Use a multiple of "
            f"{replicas}."
        )
    per_replica = target_batch_size // replicas
    if per_replica <= max_micro_batch:
        return Accumulation(per_replica, 1, replicas, True)
    divisors = [
        m for m in range(max_micro_batch, 0, -1) if per_replica % m == 0
    ]
    aligned = [m for m in divisors if m % multiple_of == 0]
    if aligned:
        m = aligned[0]
        return Accumulation(m, per_replica // m, replicas, True)
    m = divisors[0]
    note = (
        f"No multiple of {multiple_of} up to max_micro_batch={max_micro_batch} "
        f"divides the per-replica batch {per_replica} (target_batch_size="
        f"{target_batch_size}, replicas={replicas}); chose micro_batch_size={m}"
        f" x accumulation_steps={per_replica // m} instead, which keeps the "
        f"batch exact but is not aligned. For aligned micro-batches use a "
        f"target that is a multiple of {multiple_of * replicas}."
    )
    warnings.warn(note, stacklevel=3)
    return Accumulation(m, per_replica // m, replicas, False, note)


def search(
    fits: Callable[[int], Trial],
    mode: str = "binsearch",
    max_batch_size: int = 4096,
    multiple_of: int = 8,
) -> tuple[int | None, list[Trial]]:
    """The largest multiple of `multiple_of` <= `max_batch_size` that fits.

    Both modes first double (1, 2, 4, ... times `multiple_of`) until a trial
    fails or `max_batch_size` is reached. `"binsearch"` then bisects the gap
    between the last batch that fitted and the first that did not;
    `"power"` climbs from the last batch that fitted by halving powers of
    two (512, 256, ... times `multiple_of`). With a monotone `fits` both end
    on the same batch; they differ in the order of trials, so with noisy
    measurements they may end one `multiple_of` apart.

    Args:
        fits: Callable taking a batch size and returning a `Trial`.
        mode: Str, `"binsearch"` or `"power"`.
        max_batch_size: Int, the largest batch size to try.
        multiple_of: Int, every tried batch size is a multiple of it.

    Returns:
        `(batch_size, trials)`: the batch size (`None` if even `multiple_of`
        does not fit) and the trials in the order they ran.
    """
    if mode not in MODES:
        raise ValueError(
            f"`mode` must be one of {MODES}. Received: mode={mode!r}."
        )
    check_int("max_batch_size", max_batch_size)
    check_int("multiple_of", multiple_of)
    if multiple_of > max_batch_size:
        raise ValueError(
            f"`multiple_of` must not exceed `max_batch_size`. Received: "
            f"multiple_of={multiple_of}, max_batch_size={max_batch_size}. "
            f"Lower `multiple_of` or raise `max_batch_size`."
        )
    top = max_batch_size // multiple_of
    trials: list[Trial] = []
    seen: dict[int, bool] = {}

    def ok(k: int) -> bool:
        if k not in seen:
            trial = fits(k * multiple_of)
            trials.append(trial)
            seen[k] = bool(trial.fits)
        return seen[k]

    lo, hi, k = 0, top + 1, 1
    while k <= top:
        if not ok(k):
            hi = k
            break
        lo = k
        if k == top:
            break
        k = min(2 * k, top)
    if lo == 0:
        return None, trials
    if mode == "binsearch":
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
    else:
        step = 1
        while 2 * step < hi - lo:
            step *= 2
        while step >= 1:
            if lo + step < hi:
                if ok(lo + step):
                    lo += step
                else:
                    hi = lo + step
            step //= 2
    return lo * multiple_of, trials
