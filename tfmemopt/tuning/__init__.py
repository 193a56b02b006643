"""Choosing settings that fit: batch-size search, planner, OOM report.

`find_batch_size` measures the largest batch that fits, and
`suggest_accumulation` keeps the batch you want with micro-batches of at
most that size; `plan` picks accumulation, checkpointing and precision from
the estimator (`tfmemopt.estimate`); `oom_report` turns an out-of-memory
error into a report with a plan that fits (`tfmemopt.Model.fit` does this by
itself, through the fit hook of `tfmemopt.accumulation`). See
docs/batch_size.md.
"""

# Names imported here but not listed in __all__ are for tfmemopt's other
# packages, which import from a package, never from its private modules
# (tests/test_architecture.py); they are not public API.
from tfmemopt.tuning._batch_size import BatchSizeResult
from tfmemopt.tuning._batch_size import find_batch_size
from tfmemopt.tuning._batch_size import suggest_accumulation
from tfmemopt.tuning._oom import OOMReport
from tfmemopt.tuning._oom import OutOfMemoryError
from tfmemopt.tuning._oom import oom_report
from tfmemopt.tuning._planner import MARGIN as MARGIN
from tfmemopt.tuning._planner import Plan
from tfmemopt.tuning._planner import plan
from tfmemopt.tuning._state_options import sharding_lines as sharding_lines
from tfmemopt.tuning._state_options import (
    sharding_per_parameter as sharding_per_parameter,
)

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
