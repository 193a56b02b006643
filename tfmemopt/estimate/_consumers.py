"""What consumes each gradient as soon as the step makes it (`trace_step`'s
`update`), and how long an optimizer's update lingers beside the backward
pass: its bytes read and written, traced from its `update_step`
(`update_traffic`). `_update` says what each update allocates."""

from __future__ import annotations

from typing import NamedTuple

import keras
import tensorflow as tf

from tfmemopt.estimate._saved_activations import _ALIAS
from tfmemopt.estimate._saved_activations import _FREE
from tfmemopt.estimate._update import _inner
from tfmemopt.estimate._update import _slots


class Consumer(NamedTuple):
    """What consumes one gradient as soon as it is made: `temporaries`,
    the bytes of each tensor it makes, and `runs`: how long they linger
    beside the backward pass (the update's ops' bytes read and written,
    the executor replay's units), 0 for not at all; `reads_gradient`: how
    many of `temporaries` are made before the update's last read of the
    gradient, whose buffer is free before the others are made (None: it
    is read to the end); `copies_rows`: whether its first op on a sparse
    gradient's rows makes a new tensor of their size (`gradient_reads`)."""

    temporaries: list
    runs: int = 0
    # How many of `temporaries` are made while the gradient is still read:
    # the gradient's buffer is free before the rest (None: it is read to
    # the end).
    reads_gradient: int | None = None
    # Whether the update's first op on a sparse gradient's rows makes a
    # new tensor of their size (`gradient_reads` > 1).
    copies_rows: bool = False


def consumers(
    optimizer, accumulating: bool, replicas: int, weight_bytes, sharded=False
):
    """What consumes each gradient as soon as it is made (`trace_step`'s
    `update`: per trainable variable, a `Consumer`), or None: all
    gradients alive together (replicas all-reduce them at once; an
    optimizer outside Keras's element-wise ones).

    The executor runs an op once its inputs are ready, and Keras's update
    of a weight reads only that weight's gradient, its slots and the step
    count: in the allocator trace of ResNet50's step, each weight's Adam
    update ran, and its gradient was freed, while the backward pass went
    on. Under accumulation each gradient is added into its accumulator (in
    place: the sum takes the gradient's buffer and frees the old one).
    `weight_bytes(variable)`: the bytes counted for a weight. `sharded`
    (`shard_parameters` over the replicas): each whole gradient is
    all-reduced (a whole-size result) and sliced to the replica's shard
    as it is made (the gather's gradient), whatever the optimizer.

    An optimizer with slots updates a weight in a chain of element-wise
    ops (Adam's: a dozen, reading and writing 30 times the weight's
    bytes, `update_traffic`), so its two temporaries linger while the
    backward pass goes on, until those ops have run or the next weight's
    update has made its first temporary. Allocator traces on CPU, Adam: a
    chain of four Dense(1024) at batch 1, each kernel's `adam/Sqrt` (4
    MiB) still allocated when the next kernel's gradient and its
    `adam/Square` were made, the step's peak of 4 such tensors (the
    measured peak, 16 MiB above the weights and slots); the held-out
    FlowNetS-like net at batch 8, the [4, 4, 256, 512] deconvolution
    kernel's `adam/Mul_51` and `adam/Sqrt_25` (8 MiB each) beside the
    next [3, 3, 512, 512] kernel's gradient and `adam/Square_10` (9 MiB
    each), the step's peak. Plain SGD's update is one product and the
    assignment: nothing lingers.

    The gradient's last read comes before the update's second temporary:
    Adam's `square(g)` (after `g - m`, whose product is assigned and freed
    first), then `m * alpha` and `sqrt(v)` once the gradient is free; SGD
    with momentum's `g * lr` (in the gradient's buffer) after
    `m * momentum`. So a weight's update holds two weight-sized tensors
    beside the rest of the step, not three (`reads_gradient=1`). Allocator
    traces, Adam: the held-out VAE at batch 16, the step's peak at its [16384,
    256] kernel's gradient and `adam/Square_4` alone (16 MiB each, no other
    temporary of that update); the Dense(1024) chain and the FlowNetS-like
    net above, the next kernel's gradient beside its `adam/Square` alone.
    """
    if sharded:
        return lambda variables: [
            Consumer([weight_bytes(v)]) for v in variables
        ]
    if replicas > 1:
        return None
    if accumulating:
        return lambda variables: [Consumer([]) for _ in variables]
    slots = _slots(optimizer)
    if slots is None or getattr(_inner(optimizer), "global_clipnorm", None):
        return None  # a global norm reads every gradient before any update
    copies = 2 if slots else 1
    # Keras's own accumulation adds the gradient up and updates in a `cond`
    # every few steps: nothing lingers.
    every = getattr(_inner(optimizer), "gradient_accumulation_steps", None)
    traffic = update_traffic(optimizer) if slots and not every else 0
    copies_rows = bool(traffic) and gradient_reads(optimizer) > 1

    def each(variables):
        return [
            Consumer(
                [weight_bytes(v)] * copies,
                traffic * weight_bytes(v),
                1 if copies > 1 else None,
                copies_rows,
            )
            for v in variables
        ]

    return each


_TRAFFIC = {}  # (class, config) -> update_traffic
_PROBE_ELEMENTS = 1031  # a size no other tensor of the probe has
# Ops that hand a buffer on or hold nothing: no bytes of their own.
_VIEWS = _ALIAS | _FREE | {"Placeholder"}


# The probe's name is unique per instance, and its learning rate (a
# callable or an unregistered schedule need not deserialize) changes no
# tensor of the weight's size.
_PROBE_CONFIG = {"learning_rate": 1e-3}


# An element-wise update of a sparse gradient reads and writes its rows
# 4 times besides the weight-sized traffic (`update_traffic`): Adam's sum
# of the rows into `g - m`, `square(g)` read and written, and its sum into
# the table-sized `square(g) - v`. Added to `Consumer.runs` where
# `Consumer.copies_rows` (`_updating._simulate_updating`, which knows the
# rows' size).
ROWS_TRAFFIC = 4


def update_traffic(optimizer) -> int:
    """The bytes a Keras element-wise optimizer's update of one weight
    reads and writes, per byte of the weight: its `update_step` traced on
    a stand-in variable, each op's inputs and outputs of the weight's
    shape counted (a variable's read is a view; an `Assign*VariableOp`
    reads and writes the variable besides its value). Adam: 30 (`g - m`
    3, its product 2, the moment's `assign_add` 3; the same for the
    second moment with `square(g)` 2; `m * alpha`, `sqrt(v)`, `+ eps` 2
    each, the quotient 3, `assign_sub` 3). `update_step` alone: AdamW's
    decay (at the step's start, `decayed_early`), a moving average (after
    every weight's update) and clipping are not in it. 0 where the update
    cannot be traced so (it does not linger then)."""
    return _traced(optimizer)[0]


def gradient_reads(optimizer) -> int:
    """How many ops of a Keras element-wise optimizer's update of one
    weight read its gradient (through views), traced as `update_traffic`
    is; 0 where the update cannot be traced so. Adam's: 2 (`g - m` and
    `square(g)`), RMSprop's 2, SGD with momentum's 1 (`g * lr`).

    Read by one op, a sparse gradient's rows are written over (the
    element-wise kernel takes the buffer nothing else holds); read by
    two, the first op on them makes a new tensor of the rows' size (the
    memory network of held-out set 18 at batch 192, Adam: two embeddings'
    `adam/Square` of their [115200, 64] rows at the step's peak; a toy of
    two such embeddings at batch 64 under SGD with momentum: 33.6 MiB
    measured, the same as the rows' tensor counted once)."""
    return _traced(optimizer)[1]


def _traced(optimizer) -> tuple:
    """`(update_traffic, gradient_reads)`, traced once per configuration."""
    inner = _inner(optimizer)
    config = dict(inner.get_config())
    config.pop("name", None)
    config.update((k, v) for k, v in _PROBE_CONFIG.items() if k in config)
    key = (type(inner), repr(sorted(config.items())))
    if key not in _TRAFFIC:
        try:
            _TRAFFIC[key] = _traced_update(type(inner), config)
        except Exception:  # noqa: BLE001 - any optimizer the probe fails on
            _TRAFFIC[key] = (0, 0)
    return _TRAFFIC[key]


def _traced_update(cls, config) -> tuple:
    probe = cls.from_config(config)
    weight = keras.Variable(tf.zeros([_PROBE_ELEMENTS]), name="probe")
    probe.build([weight])

    @tf.function(autograph=False)
    def apply(gradient):
        probe.update_step(gradient, weight, tf.constant(1e-3))

    spec = tf.TensorSpec([_PROBE_ELEMENTS], tf.float32)
    graph = apply.get_concrete_function(spec).graph
    reads, seen = 0, list(graph.inputs[:1])
    while seen:  # the ops that read the gradient, through views
        for op in seen.pop().consumers():
            if op.type in _VIEWS:
                seen.extend(op.outputs)
            else:
                reads += 1
    moved = 0
    for op in graph.get_operations():
        if op.type in _VIEWS:
            continue
        whole = [
            t
            for t in (*op.inputs, *op.outputs)
            if t.shape.rank == 1 and t.shape[0] == _PROBE_ELEMENTS
        ]
        moved += len(whole)
        if whole and op.type.startswith("Assign") and "Variable" in op.type:
            moved += 1 if op.type == "AssignVariableOp" else 2
    return moved, reads
