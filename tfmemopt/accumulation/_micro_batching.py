"""Splitting a batch into micro-batches: pure tensor logic, no Keras.

A batch of `B` samples is cut into `num_full` micro-batches of `size` samples
and, when `size` does not divide `B`, one shorter `tail` micro-batch. With
`accumulation_steps=N` the micro-batch size is `ceil(B / N)`, so there are at
most `N` micro-batches and none is larger than `ceil(B / N)`; with
`micro_batch_size=m` it is `min(m, B)`. Every sample is in exactly one
micro-batch, so a batch smaller than `N` (or a short last batch of an epoch)
still trains on every sample, exactly once.

All quantities may be Python ints (static batch size, decided while tracing)
or scalar int32 tensors (dynamic batch size); `tf.slice` keeps the slices
valid under XLA, where the slice size must be a compile-time constant.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfmemopt import _compat


@dataclasses.dataclass(frozen=True)
class MicroBatchPlan:
    """How one batch is cut. Fields are ints or scalar int32 tensors.

    Attributes:
        batch_size: Samples in the whole batch, `B`.
        size: Samples in each full micro-batch.
        num_full: Number of full micro-batches (`B // size`).
        tail: Samples in the last, shorter micro-batch (0 when none).
    """

    batch_size: object
    size: object
    num_full: object
    tail: object

    @property
    def is_static(self) -> bool:
        """Whether the batch size is known while tracing."""
        return isinstance(self.batch_size, int)

    @property
    def counts_known(self) -> bool:
        """Whether how many micro-batches there are, and the tail's size,
        are known while tracing (a static batch, or one micro-batch)."""
        return isinstance(self.num_full, int) and isinstance(self.tail, int)


def _ceil_div(a, b):
    return -(-a // b)


def plan_micro_batches(
    batch_size, accumulation_steps: int | None = None, micro_batch_size=None
) -> MicroBatchPlan:
    """Cuts a batch of `batch_size` samples into micro-batches.

    Args:
        batch_size: Int or scalar int tensor, the samples in the batch.
        accumulation_steps: Int or `None`, the most micro-batches to use.
        micro_batch_size: Int or `None`, the most samples per micro-batch.
            Exactly one of the two is given.

    Returns:
        A `MicroBatchPlan`.
    """
    if (accumulation_steps is None) == (micro_batch_size is None):
        raise ValueError(
            "Pass exactly one of `accumulation_steps` and `micro_batch_size`. "
            f"Received: accumulation_steps={accumulation_steps}, "
            f"micro_batch_size={micro_batch_size}."
        )
    if isinstance(batch_size, int):
        b = batch_size
        if accumulation_steps is not None:
            size = max(_ceil_div(b, accumulation_steps), 1)
        else:
            size = max(min(micro_batch_size, b), 1)
        num_full = b // size
        return MicroBatchPlan(b, size, num_full, b - num_full * size)
    b = tf.cast(batch_size, tf.int32)
    if accumulation_steps == 1:
        # One micro-batch, the whole batch, whatever its size: counts known
        # while tracing, so the window traces the step once (a loop and a
        # tail that never run had tripled the trace of every fit on a
        # `tf.data.Dataset`, whose batch size is dynamic).
        return MicroBatchPlan(b, b, 1, 0)
    if accumulation_steps is not None:
        size = tf.maximum((b + accumulation_steps - 1) // accumulation_steps, 1)
    else:
        size = tf.maximum(tf.minimum(micro_batch_size, b), 1)
    num_full = b // size
    return MicroBatchPlan(b, size, num_full, b - num_full * size)


def static_batch_size(structure):
    """The batch size of a structure of tensors: an int when known statically,
    else a scalar int32 tensor."""
    first = next(t for t in keras.tree.flatten(structure) if t is not None)
    static = first.shape[0]
    if static is not None:
        return int(static)
    return tf.shape(first)[0]


def slice_batch(structure, start, size):
    """`t[start:start + size]` for every tensor in `structure` (None kept)."""

    def _slice(t):
        if t is None:
            return None
        t = tf.convert_to_tensor(t)
        rank = t.shape.rank
        begin = tf.stack(
            [tf.cast(start, tf.int32)] + [tf.constant(0, tf.int32)] * (rank - 1)
        )
        # The inner sizes as numbers where they are known: with -1 ("to
        # the end") and a run-time start, XLA pads the input to twice its
        # size in every dimension before slicing (a [16, 256, 256] batch
        # became f32[32, 512, 512], 32 MiB, in every loop iteration).
        inner = [
            tf.constant(-1 if d is None else d, tf.int32)
            for d in t.shape.as_list()[1:]
        ]
        sizes = tf.stack([tf.cast(size, tf.int32)] + inner)
        if _compat.in_xla_function():
            # Not tf.slice: its start is a compile-time constant to XLA
            # (see _compat.dynamic_slice: the step compiled on every call).
            # The sizes are: XLA shapes are static.
            dims = tf.shape(t)
            whole = [
                dims[i] if d is None else d
                for i, d in enumerate(t.shape.as_list())
            ]
            out = _compat.dynamic_slice(
                t, tf.unstack(begin), tf.stack([size] + whole[1:])
            )
        else:
            out = tf.slice(t, begin, sizes)
        # A slice of a run-time size knows no dimension statically; the
        # inner ones are the input's (a layer built on the first call
        # needs them: a Dense kernel of shape (None, 64) cannot be made).
        batch = size if isinstance(size, int) else None
        if t.shape.rank is not None:
            out.set_shape([batch] + t.shape.as_list()[1:])
        return out

    return keras.tree.map_structure(_slice, structure)
