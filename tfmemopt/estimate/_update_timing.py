"""When an optimizer's update runs beside the backward pass, in the
executor's replay (`_op_orders.executor_order`'s `spans`): when it ends,
and whether other ops run while it does. `_simulate` reads them to keep
an update's temporaries (`lingering`) and to free its gradient early
(`reads_gradient`)."""

from __future__ import annotations

import bisect

# An update whose temporaries are less than 1/4 of a lingering update's (a
# bias's or a normalization's scale's beside a kernel's) runs in its gaps
# and leaves it running (`lingering`).
_RUNS_IN_ITS_GAPS = 4


def _starts(ops, spans) -> list:
    """When each op starts on the executor's threads (`spans`; 0 for an
    op it does not time)."""
    return [spans[op.name][0] if op.name in spans else 0 for op in ops]


def _update_ends(i, op, runs, spans, starts) -> tuple:
    """`(index, time)`: when an update of `runs` (`spans`' units) that
    starts as `op`, the `i`-th, ends, and the index of the last op that
    starts before then; `(len(starts), inf)` (never) without `spans`."""
    if op.name not in spans:
        return len(starts), float("inf")
    end = spans[op.name][1] + runs
    return max(i, bisect.bisect_left(starts, end) - 1), end


def _runs_beside(ops, i, runs, spans, starts) -> bool:
    """Whether an op after `ops[i]` that starts before an update of `runs`
    (`spans`' units) starting as `ops[i]` ends (`_update_ends`) is still
    running when the update starts; True without `spans`."""
    if ops[i].name not in spans:
        return True
    start = spans[ops[i].name][1]
    last, _ = _update_ends(i, ops[i], runs, spans, starts)
    return any(
        spans.get(op.name, (0, 0))[1] > start for op in ops[i + 1 : last + 1]
    )
