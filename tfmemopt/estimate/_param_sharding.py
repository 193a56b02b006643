"""`shard_parameters=True` (FSDP) in a step's memory: what one replica
keeps of the weights, gradients and optimizer state, and which gathered
weights are alive at the step's peak.

`tfmemopt.Model(..., shard_parameters=True)` cuts every trainable weight of
`n` elements into R parts, each replica keeping a shard of `ceil(n / R)`
elements (`ShardedOptimizer`'s cut, `Layout`: whole 8-bit blocks for the
8-bit optimizers), and builds the user's optimizer on the shards: its state
is the optimizer's state for a 1-D variable of the shard's size. A
layer's weight is gathered whole (in the layer's compute dtype) when the
layer runs; the gather's gradient is an all-reduce of the whole gradient
followed by this replica's slice, so each replica ends the backward pass
with its shard of the summed gradient (docs/sharding.md).

Which gathered weights are alive at the peak (docs/sharding.md, "Not done
yet"): the backward of a matmul reads the weight, so without
checkpointing TensorFlow keeps every layer's gathered weight from its
forward to its backward, and at the turn from forward to backward all of
them are alive together; a checkpointed segment takes each replica's part
and gathers inside, in the forward and again in the recompute, so only
the weights of the layers outside the segments and those of the largest
segment (gathered again while it is recomputed) are kept.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import keras

from tfmemopt._compat import sublayers
from tfmemopt._protocols import shard_alignment
from tfmemopt.distribute import Layout
from tfmemopt.estimate._optimizer_state import _itemsize
from tfmemopt.estimate._optimizer_state import optimizer_state_bytes
from tfmemopt.estimate._update import _inner


class ShardedState(NamedTuple):
    """One replica's part of the model state under `shard_parameters`."""

    parameters: int  # trainable shards + whole non-trainable weights
    gradients: int  # the shards of the summed gradient
    optimizer_state: int  # the optimizer built on the shards
    optimizer_how: str
    shard_sizes: list  # elements of each trainable weight's shard


def _unique(weights) -> list:
    seen, out = set(), []
    for w in weights:
        if id(w) not in seen:
            seen.add(id(w))
            out.append(w)
    return out


def _float(v) -> bool:
    return keras.backend.is_float_dtype(v.dtype)


def sharded_state(model, s, counted) -> ShardedState:
    """The weights, gradients and optimizer state one replica keeps.

    `s`: the estimate's `Settings` (`replicas`, `variable` itemsize, the
    optimizer); `counted(n)`: the bytes counted for one allocation of `n`.
    """
    inner = _inner(s.optimizer)
    trainable = _unique(model.trainable_weights)
    ids = {id(v) for v in trainable}
    params = sum(
        counted(math.prod(v.shape) * _bytes_per(v, s))
        for v in _unique(model.weights)
        if id(v) not in ids
    )
    grads, sizes, shapes = 0, [], []
    for v in trainable:
        shape = tuple(int(d) for d in v.shape)
        align = shard_alignment(inner, shape)
        part = Layout(shape, s.replicas, align).part_size
        sizes.append(part)
        nbytes = counted(part * _bytes_per(v, s))
        params += nbytes
        grads += nbytes
        dtype = s.policy.variable_dtype if _float(v) else v.dtype
        if nbytes:
            shapes.append((shape, dtype))
    state, _ = state_per_replica(inner, shapes, s)
    _, how = optimizer_state_bytes(inner, shapes)
    how = (
        f"{how}, built on the shards: 1/{s.replicas} of it per replica "
        "(shard_parameters)"
    )
    return ShardedState(params, grads, state, how, sizes)


def state_per_replica(inner, shapes, s):
    """`(bytes, how)` one replica keeps of `inner`'s state for `shapes`
    (`(shape, dtype)` of whole variables), cut over `s.replicas`.

    Each variable's state is counted whole, as `inner` keeps it (an 8-bit
    optimizer decides 8-bit or float32 on the whole variable), then cut as
    the sharding cuts it (`ShardedOptimizer` and `shard_parameters` alike):
    into R parts of whole units, a unit being `inner.shard_alignment(shape)`
    elements (a block of 8-bit codes and its scale) or one element; a
    replica holds at most ceil(units / R). The cut is `Layout`, not
    computed again here.
    """
    nbytes = 0
    for shape, dtype in shapes:
        whole, _ = optimizer_state_bytes(inner, [(shape, dtype)])
        layout = Layout(shape, s.replicas, shard_alignment(inner, shape))
        if not layout.n:
            continue
        units = -(-layout.n // layout.align)
        held = -(-layout.part_size // layout.align)  # the largest part's units
        nbytes += -(-whole * held // units)  # ceil(whole * held / units)
    _, how = optimizer_state_bytes(inner, shapes)
    return nbytes, f"ShardedOptimizer({how}), 1/{s.replicas} of it per replica"


def _bytes_per(v, s) -> int:
    return s.variable if _float(v) else _itemsize(v.dtype)


def gathered_bytes(traced, segments, s, counted) -> tuple[int, str]:
    """`(bytes, how)`: the gathered weights alive at the step's peak.

    `segments`: the checkpointed segments as lists of layer paths (units
    of the traced step), or `None` without checkpointing. Outside a
    segment a weight is gathered in its layer's compute dtype (kept for the
    layer's backward); inside one in the variable's dtype (the segment
    gathers its parts itself, docs/sharding.md).
    """
    whole = {id(v): v for v in _unique(traced.trainable_weights) if _float(v)}

    def nbytes(weights, itemsize) -> int:
        return sum(
            counted(math.prod(v.shape) * itemsize)
            for v in _unique(weights)
            if id(v) in whole
        )

    if not segments:
        total = nbytes(whole.values(), s.compute)
        return total, (
            "every layer's gathered weight kept for its backward pass "
            "(without checkpointing all are alive at the turn from forward "
            "to backward)"
        )
    by_name = {
        layer.name: layer for layer in sublayers(traced, include_self=False)
    }
    inside, largest = set(), 0
    for seg in segments:
        weights = []
        for unit in seg:
            # A unit is a layer's path, or one level down an op inside
            # a layer (`("dense", "BiasAdd")`): its innermost layer.
            names = [n for n in reversed(unit) if n in by_name]
            if names:
                weights += by_name[names[0]].trainable_weights
        inside |= {id(v) for v in weights}
        largest = max(largest, nbytes(weights, s.variable))
    outside = [v for k, v in whole.items() if k not in inside]
    total = nbytes(outside, s.compute) + largest
    return total, (
        "the gathered weights of the layers outside the checkpointed "
        "segments (kept for their backward) and of the largest segment "
        "(gathered again while it is recomputed)"
    )
