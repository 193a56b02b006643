"""Choosing settings that fit: batch-size search, planner, OOM report.

`find_batch_size` measures the largest batch that fits, and
`suggest_accumulation` keeps the batch you want with micro-batches of at
most that size; `plan` picks accumulation, checkpointing and precision from
the estimator (`tfmemopt.estimate`); `oom_report` turns an out-of-memory
error into a report with a plan that fits (`tfmemopt.Model.fit` does this by
itself, through the fit hook of `tfmemopt.accumulation`). See
docs/batch_size.md.
"""

from tfmemopt.tuning._batch_size import BatchSizeResult
from tfmemopt.tuning._batch_size import find_batch_size
from tfmemopt.tuning._batch_size import suggest_accumulation
from tfmemopt.tuning._oom import OOMReport
from tfmemopt.tuning._oom import OutOfMemoryError
from tfmemopt.tuning._oom import oom_report
from tfmemopt.tuning._planner import Plan
from tfmemopt.tuning._planner import plan

__all__ = [
    "BatchSizeResult",
    "OOMReport",
    "OutOfMemoryError",
    "Plan",
    "find_batch_size",
    "oom_report",
    "plan",
    "suggest_accumulation",
]
