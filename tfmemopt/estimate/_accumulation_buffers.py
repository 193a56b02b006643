"""The accumulation term of the estimate: under gradient accumulation, the
inputs of the whole batch, the float32 accumulators of the dense
gradients, the earlier micro-batches' rows of the sparse ones, and what
the window's end holds (the rows concatenated, the activations freed)."""

from __future__ import annotations

import math

from tfmemopt._utils import format_bytes
from tfmemopt.estimate._settings import Settings
from tfmemopt.estimate._settings import counted


def accumulation_bytes(trainable, step, s: Settings, notes, shard_sizes=None):
    """`(input bytes, accumulator bytes, window-end bytes)`; adds a note
    when accumulating.

    `shard_sizes` (`shard_parameters`: the elements of each trainable
    weight's shard): each replica sums the gradients of its shards, which
    are dense (the gather's gradient), in float32 accumulators of the
    shards' size.

    The window-end bytes are what the window's end holds beyond the
    accumulator bytes, with the activations freed: a sparse gradient's
    last piece and the concatenation of all its pieces.
    """
    inputs = step.inputs
    if s.accumulation_steps <= 1:
        return inputs, 0, 0
    inputs += sum(
        counted(n * s.per_replica // s.micro, s) for n in step.input_sizes
    )
    if shard_sizes is not None:
        accumulation = sum(counted(n * 4, s) for n in shard_sizes)
        notes.append(
            f"accumulation: micro-batch {s.micro} x {_count(s)}, "
            "float32 accumulators of this replica's shards "
            "(shard_parameters), the micro-batches one after another"
        )
        return inputs, accumulation, 0
    # Dense gradients are summed into float32 accumulators, which live
    # beside each micro-batch's gradients (measured: ResNet50's window
    # with micro-batches of 4 peaks as high as its plain step at 16, both
    # sets of its 94 MiB of gradients alive).
    accumulation = sum(
        counted(math.prod(v.shape) * 4, s)
        for i, v in enumerate(trainable)
        if i not in step.sparse_rows
    )
    # Sparse ones (embedding lookups) stay sparse: each micro-batch's rows
    # are kept. At the last micro-batch's peak the earlier micro-batches'
    # pieces are alive beside its own (counted in the step's gradients);
    # at the window's end the pieces are concatenated (both alive for the
    # concat, the activations freed) and the update reads the
    # concatenation alone (issue #23: counting the pieces and the
    # concatenation beside the activations read +24% on a two-tower
    # model, where the update after the window is the peak).
    n_micro = s.per_replica // s.micro
    rows = sum(n * n_micro for n in step.sparse_rows.values())
    accumulation += sum(
        (n_micro - 1) * counted(n, s) for n in step.sparse_rows.values()
    )
    window_end = sum(
        counted(n, s) + counted(n * n_micro, s)
        for n in step.sparse_rows.values()
    )
    notes.append(
        f"accumulation: micro-batch {s.micro} x {_count(s)}, "
        "float32 accumulators"
        + (
            f"; sparse gradients keep the batch's rows ({format_bytes(rows)})"
            if rows
            else ""
        )
    )
    return inputs, accumulation, window_end


def _count(s) -> int:
    """How many micro-batches run: `accumulation_steps`, or fewer where
    the batch has fewer samples (micro-batches of `ceil(B / N)`, at least
    one sample each)."""
    return math.ceil(s.per_replica / s.micro)
