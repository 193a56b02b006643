"""The optimizer's update in a step's memory: its temporaries, the copies
an early weight decay makes, and the allocator's whole chunks over the
step (`_consumers`: when each gradient is consumed, and how long its
update lingers).

`weight_update` is the one place that says what updating one weight
allocates, per optimizer kind; the rest of the estimate reads it.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import keras
import tensorflow as tf

from tfmemopt import optimizers
from tfmemopt._compat import uses_weight_decay
from tfmemopt._utils import format_bytes
from tfmemopt.estimate._allocator import chunk_overhead
from tfmemopt.estimate._optimizer_state import _SLOTS
from tfmemopt.optimizers import StateOptimizer
from tfmemopt.optimizers import masked_delta

# Float32 values per element of a piece that XLA's compiled 8-bit update
# keeps in its own temporary buffer (allocator trace, CPU: 1.502 MiB, no op
# name, for each piece of 2**16 elements; decode, Adam, encode fused).
_XLA_VALUES_PER_ELEMENT = 6


def _inner(optimizer):
    """The optimizer that updates the weights (inside LossScale, Sharded,
    accumulating wrappers)."""
    while isinstance(
        getattr(optimizer, "inner_optimizer", None), keras.optimizers.Optimizer
    ):
        optimizer = optimizer.inner_optimizer
    return optimizer


def _slots(optimizer) -> int | None:
    """Slots per weight of a Keras element-wise optimizer, else None."""
    inner = _inner(optimizer)
    name = type(inner).__name__
    if name not in _SLOTS:
        return None
    return _SLOTS[name](inner.get_config())


class WeightUpdate(NamedTuple):
    """What updating one weight allocates: `temporaries` (bytes of each,
    alive together at the update's peak), `resident` (bytes that stay
    allocated from the first step on) and `state` (bytes of each of the
    weight's optimizer variables, in the order they are made, for the
    allocator's chunks; Keras's slots are counted there by `_slots`)."""

    temporaries: list
    resident: int = 0
    state: list = []


def weight_update(optimizer, elements: int, itemsize: int, shards=1):
    """What `optimizer` allocates to update a weight of `elements` values
    of `itemsize` bytes (1/`shards` of it per replica), as found in the
    allocator traces of a step on CPU (MLP 512-1024-1024-10, batch 64):

    - Keras's element-wise optimizers: Adam computes `(g - m)`,
      `square(g)`, `m * alpha` and `sqrt(v)` as weight-sized tensors, two
      alive at once; an optimizer without state (plain SGD) makes one.
    - `tfmemopt.optimizers.Adam8bit`/`AdamW8bit`, an 8-bit weight: the
      compiled update's outputs (the float32 delta, one byte per element
      of each moment's new codes, their scales) and XLA's buffer for one
      piece of at most 2**16 elements (6 float32 values per element): for
      the 1024x1024 kernel 4 + 1 + 1 + 1.5 MiB. A weight in bfloat16 adds
      the new weight the compiled write returns (`_low_precision.
      compiled_new_weight`, one bfloat16 output of the weight's size), and
      with `bf16_update="kahan"` the new compensation beside it (its
      second output): MLP 512-2048-2048-10, batch 64, bfloat16 weights and
      `AdamW8bit`, measured 62-73 MiB with "stochastic" and 78-90 with
      "kahan" (4 steps, docs/estimator.md).
    - `tfmemopt.optimizers.Adafactor`, and an 8-bit optimizer's float32
      moments (weights below `min_8bit_size`): two float32 tensors of the
      weight's size (Adafactor squares the gradient and the weight, for
      its RMS, at once: 4 + 4 MiB). A masked update that builds zeros of
      the delta's size (`tf.where(ok, delta, tf.zeros_like(delta))`, as
      `masked_delta` did until #23) leaves a constant Grappler
      folded, allocated from the first step on (`adafactor/zeros_like`,
      never freed in the trace); read from the graph, counted if so.
    - Any other optimizer (probed for its state): nothing known, nothing
      counted.
    """
    inner = _inner(optimizer)
    part = -(-elements // shards)
    slots = _slots(optimizer)
    if slots is not None:
        return WeightUpdate([part * itemsize] * (2 if slots else 1))
    eight = isinstance(inner, optimizers.Adam8bit)
    if eight and inner.uses_8bit((elements,)):
        moments = 3 if inner.amsgrad else 2
        chunks = inner._chunks((part,))
        piece = chunks[0] if chunks else part
        blocks = math.ceil(part / inner.block_size)
        temps = [4 * part] + [part] * moments + [4 * blocks] * moments
        temps.append(_XLA_VALUES_PER_ELEMENT * 4 * piece)
        temps += _low_precision_write(inner, part, itemsize)
        return WeightUpdate(temps, state=[part, 4 * blocks] * moments)
    temps = [4 * part, 4 * part] + _low_precision_write(inner, part, itemsize)
    zeros = 4 * part if _masked_update_keeps_zeros() else 0
    if eight:
        moments = 3 if inner.amsgrad else 2
        return WeightUpdate(temps, zeros, [4 * part] * moments)
    if isinstance(inner, optimizers.Adafactor):
        # rows and columns: a few KiB, left out of the chunks
        first = [4 * part] if inner.beta_1 is not None else []
        return WeightUpdate(temps, zeros, first)
    return WeightUpdate([])


def _low_precision_write(inner, part, itemsize) -> list:
    """The compiled write of a 16-bit weight
    (`StateOptimizer._write_weight`): the new weight, and with "kahan" the
    new compensation (two outputs)."""
    if itemsize >= 4:
        return []
    kahan = getattr(inner, "bf16_update", None) == "kahan"
    return [part * itemsize] * (2 if kahan else 1)


@functools.lru_cache(maxsize=None)
def _masked_update_keeps_zeros() -> bool:
    """Whether tfmemopt's masked update (`masked_delta`) makes zeros
    of the delta's size, which Grappler folds into a constant that stays
    allocated: read from the graph it builds, so the estimate follows a
    change to it."""
    graph = tf.Graph()
    with graph.as_default():
        delta = tf.compat.v1.placeholder(tf.float32, [3, 5])
        masked_delta(tf.constant(True), delta, tf.float32)
    for op in graph.get_operations():
        if op.type in ("ZerosLike", "Fill", "Const") and op.outputs:
            if op.outputs[0].shape.as_list() == [3, 5]:
                return True
    return False


class Update(NamedTuple):
    """The update of every trainable weight: `peak`, the bytes it needs
    above the weights, optimizer state and every gradient; `resident`,
    what it keeps allocated between steps (`resident_each`: per weight);
    `per_weight`, each weight's temporaries (counted); `notes`;
    `state_each`, each weight's optimizer variables (counted)."""

    peak: int
    resident: int
    per_weight: list
    notes: list
    resident_each: list
    state_each: list


def update_temporaries(
    weights, optimizer, counted, shards=1, sparse=None
) -> Update:
    """The update of the trainable `weights` (`(elements, bytes)` each, in
    the optimizer's order); `counted(n)`: the bytes counted for one
    allocation of `n`; `shards`: each replica updates 1/shards of each;
    `sparse`: weight index -> bytes of its sparse gradient's values.

    A sparse gradient (an embedding's rows) under Keras's element-wise
    optimizers: the update's first element-wise op on it keeps it sparse
    and makes a new tensor of its values (Adam's `square(g)`), then the
    dense temporaries of the table follow (allocator trace of the design
    set's embedding model with 4 micro-batches of 128, Adam: at the peak
    the concatenated rows [32768, 128], `adam/Square` of them, 16 MiB,
    and two `UnsortedSegmentSum` [20000, 128] tables).

    Keras's element-wise optimizers: the temporaries of the largest
    weight's update (`consumers` says when each gradient is freed).
    tfmemopt's optimizers update one weight after the other in the
    optimizer's order (`UpdateChain`), starting when the first
    weight's gradient is made, the last of the backward pass: each
    weight's gradient is freed after its update (allocator trace of the
    MLP: the 512x1024 kernel's 2 MiB gradient was freed before the
    1024x1024 kernel's update peaked), so the peak is the largest of each
    weight's temporaries less the gradients already freed.
    """
    updates = [
        weight_update(optimizer, e, n // max(1, e), shards) for e, n in weights
    ]
    per_weight = [[counted(t) for t in u.temporaries] for u in updates]
    if sparse and _slots(optimizer) is not None and shards == 1:
        for i, n in sparse.items():
            per_weight[i].append(counted(n))
    resident_each = [counted(u.resident) for u in updates]
    resident = sum(resident_each)
    peak, freed = 0, 0
    in_order = _slots(optimizer) is None and shards == 1
    for (_, nbytes), temps in zip(weights, per_weight):
        peak = max(peak, sum(temps) - freed)
        if in_order:
            freed += counted(nbytes)
    notes = []
    if resident:
        notes.append(
            f"{type(_inner(optimizer)).__name__}'s masked update keeps "
            "constant zeros of each weight's size (Grappler folds "
            f"`tf.zeros_like`): {format_bytes(resident)} in `temporaries`"
        )
    state_each = [[counted(n) for n in u.state] for u in updates]
    return Update(
        max(0, peak), resident, per_weight, notes, resident_each, state_each
    )


def decayed_early(
    optimizer, accumulating, replicas, weight_bytes, sharded=False
):
    """Per trainable variable, the bytes its weight decay copies while the
    step still reads the weight (0: none), or None: no decay runs early.

    Keras applies the decay, `variable.assign_sub(variable * wd * lr)`, to
    every decayed weight before its update, and it needs nothing of the
    batch: the executor runs it as soon as the forward pass has read the
    weight. While a backward op still holds that read (a matmul's or a
    convolution's input gradient), `AssignSubVariableOp` cannot write the
    weight in place and copies it (copy-on-write); the old buffer is freed
    with the last read. Allocator traces on CPU: the held-out VAE under
    AdamW (batch 64), `adam_w/AssignSubVariableOp` of the [16384, 256] and
    [64, 16384] kernels made at the step's start, both alive at the peak
    (the measured AdamW peak 22.0 MiB above Adam's); BART's tied
    embedding, [4000, 256], held by the logits' gradient.

    Only an optimizer with `weight_decay`, alone (a `LossScaleOptimizer`
    applies inside a `cond` on the gradients, an accumulating window after
    its micro-steps), on one replica, without accumulation (the decay
    waits for the loop), not sharded: Keras's element-wise optimizers, and
    tfmemopt's, which leave a float32 weight's decay to Keras (a 16-bit
    weight's is folded into the update). `weight_bytes(variable)`: the
    bytes counted for a weight.
    """
    if accumulating or sharded or replicas > 1:
        return None
    if optimizer is not _inner(optimizer):
        return None
    if getattr(optimizer, "weight_decay", None) is None:
        return None
    own = isinstance(optimizer, StateOptimizer)
    if _slots(optimizer) is None and not own:
        return None  # probed for its state: its decay is not known

    def copied(variable) -> bool:
        if own and optimizer.folds_weight_decay(variable):
            return False
        return uses_weight_decay(optimizer, variable)

    return lambda variables: [
        weight_bytes(v) if copied(v) else 0 for v in variables
    ]


def chunks(
    weights, sizes, optimizer, accumulating, step, micro_batches, update
):
    """Bytes the allocator's whole chunks add at the step's peak.

    `weights`: bytes of every weight, `sizes`: of each trainable one, in
    creation order; the optimizer's slots, what its update keeps and the
    accumulators follow them. The step's own allocations (`step.events`)
    include each weight's update when it was simulated with its gradients
    consumed as made; else, and under accumulation, the update (`update`,
    an `Update`) comes after the (last) micro-batch.
    """
    slots = _slots(optimizer) or 0
    persistent = list(weights) + [n for n in sizes for _ in range(slots)]
    persistent += [n for state in update.state_each for n in state]
    persistent += update.resident_each
    persistent += step.folded  # Grappler's constants, made with the kernels
    if accumulating:
        persistent += sizes
    per_weight = update.per_weight
    if step.updating_peak is not None and not accumulating:
        per_weight = []
    return chunk_overhead(persistent, step.events, micro_batches, per_weight)
