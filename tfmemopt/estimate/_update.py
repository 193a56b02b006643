"""The optimizer's update in a step's memory: its temporaries, when each
gradient is consumed, and the allocator's whole chunks over the step."""

from __future__ import annotations

from tfmemopt.estimate._allocator import chunk_overhead
from tfmemopt.estimate._optimizer_state import _SLOTS


def _slots(optimizer) -> int | None:
    """Slots per weight of a Keras element-wise optimizer, else None."""
    inner = getattr(optimizer, "inner_optimizer", None) or optimizer
    name = type(inner).__name__
    if name not in _SLOTS:
        return None
    return _SLOTS[name](inner.get_config())


def update_temporaries(sizes, optimizer, counted, shards=1) -> int:
    """Bytes of the temporaries of the optimizer's update of the largest
    weight (`sizes`: bytes of each trainable weight). Keras's Adam computes
    `(g - m)`, `square(g)`, `m * alpha` and `sqrt(v)` as weight-sized
    tensors, two of them alive at once; a sparse gradient (an embedding's
    rows) is made dense first (measured on CPU: the embedding model's Adam
    update held two 9.8 MiB tensors of its 20000 x 128 table at batch 64,
    where the step itself held 4 MiB). Optimizers with no state (plain SGD)
    make one. Counted for Keras's element-wise optimizers (the slot table of
    `_optimizer_state`); not for others (tfmemopt's 8-bit optimizers update
    in pieces of 2**18 values, Adafactor's factored update, probed
    optimizers): 0 there. `shards`: each replica updates 1/shards of it."""
    slots = _slots(optimizer)
    if not sizes or slots is None:
        return 0
    largest = max(sizes)
    if shards > 1:
        largest = -(-largest // shards)
    return (2 if slots else 1) * counted(largest)


def consumers(optimizer, accumulating: bool, replicas: int, weight_bytes):
    """What consumes each gradient as soon as it is made (`trace_step`'s
    `update`), or None: all gradients alive together (replicas all-reduce
    them at once; an optimizer outside Keras's element-wise ones).

    The executor runs an op once its inputs are ready, and Keras's update
    of a weight reads only that weight's gradient, its slots and the step
    count: in the allocator trace of ResNet50's step, each weight's Adam
    update ran, and its gradient was freed, while the backward pass went
    on. Under accumulation each gradient is added into its accumulator (in
    place: the sum takes the gradient's buffer and frees the old one).
    `weight_bytes(variable)`: the bytes counted for a weight.
    """
    if replicas > 1:
        return None
    if accumulating:
        return lambda variables: [[] for _ in variables]
    slots = _slots(optimizer)
    if slots is None:
        return None
    copies = 2 if slots else 1
    return lambda variables: [[weight_bytes(v)] * copies for v in variables]


def chunks(weights, sizes, optimizer, accumulating, step, micro_batches):
    """Bytes the allocator's whole chunks add at the step's peak.

    `weights`: bytes of every weight, `sizes`: of each trainable one, in
    creation order; the optimizer's slots and the accumulators follow them.
    The step's own allocations (`step.events`) include each weight's update
    when it was simulated with its gradients consumed as made; else, and
    under accumulation, the update comes after the (last) micro-batch.
    """
    slots = _slots(optimizer) or 0
    persistent = list(weights) + [n for n in sizes for _ in range(slots)]
    if accumulating:
        persistent += sizes
    update = [[n] * (2 if slots else 1) for n in sizes]
    if step.updating_peak is not None and not accumulating:
        update = []
    return chunk_overhead(persistent, step.events, micro_batches, update)
