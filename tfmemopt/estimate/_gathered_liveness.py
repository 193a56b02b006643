"""How long gathered weights live in the real train step of a sharded model.

Under `shard_parameters=True` each weight is all-gathered whole when its
layer reads it (`distribute/_param_shard.py`). What matters for memory is
how long each whole copy stays alive: until the layer's backward pass
without checkpointing (the backward of a matmul reads the weight), and,
inside a checkpointed segment, only while the segment runs (its recompute
in the backward pass gathers again). Logical CPUs share one allocator, so
a replica's own peak cannot be read from the allocator; this module reads
it from the step's graph instead.

`gathered_liveness` takes the function Keras runs for one train step
(`one_step_on_data`, traced for a batch), keeps one replica's ops (its
device), finds the gathered tensors (the outputs of each data
`CollectiveGatherV2` and every copy, slice, concat, reshape or cast made
from them up to the whole weight the layer reads) and simulates the step
with `_step_graph._simulate`: each tensor allocated when its op runs,
freed after its last reader, reshapes sharing their input's buffer.

Several orders are simulated. `graph`: the order the ops were created in,
a topological order (forward, then backward, as traced). `asap`: every op
as soon as its inputs and control inputs allow (sorted by depth).
`gathers_first`: every op an all-gather needs or makes runs before any
other ready op, an executor that lets gathers run ahead of the compute.
`executed` (given a profile's start times, `observed_order`): the order
TF's executor ran one step in. The collectives of a replica are chained by
control edges in creation order (no gather overtakes an earlier gather or
all-reduce of the same replica), but a gather otherwise waits only for
what its part depends on: in a profiled step TF ran the forward gathers of
all four blocks before the first block's matmul, which is why a
checkpointed segment's parts wait for its inputs
(`checkpointing/_recompute.py`).
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfmemopt import _compat
from tfmemopt.estimate._kept import _ALIAS
from tfmemopt.estimate._kept import _FREE
from tfmemopt.estimate._step_graph import _simulate
from tfmemopt.estimate._step_trace import _layer_of
from tfmemopt.estimate._step_trace import _nbytes
from tfmemopt.estimate._step_trace import _ops_that_run

# Ops that pass gathered values on (views, copies, casts): what they make
# from a gathered tensor is gathered too. Anything else (a matmul, a bias
# add) computes with the weight.
_CARRY = {
    "Cast",
    "ConcatV2",
    "ExpandDims",
    "Identity",
    "IdentityN",
    "Pack",
    "Pad",
    "Reshape",
    "Slice",
    "Squeeze",
    "StridedSlice",
    "Transpose",
}


class Liveness(NamedTuple):
    """Bytes of one replica's step (`gathered_liveness`), in one order."""

    order: str  # "graph", "asap", "gathers_first" or "executed"
    peak: int  # the step's peak of live bytes (everything counted)
    gathered_at_peak: int  # gathered bytes alive at that peak
    max_gathered: int  # the most gathered bytes alive at any point
    # Whole weights (the tensors the layers read) alive together, at most.
    max_whole: int
    # Layer name -> gathered bytes alive at the peak.
    at_peak_by_layer: dict


class GatheredReport(NamedTuple):
    """What `gathered_liveness` found in one replica's step."""

    gathers: int  # data all-gathers of one replica in the step
    gathers_by_layer: dict  # layer name -> number of data all-gathers
    orders: dict  # order -> Liveness ("executed" with `started`)


class _Step(NamedTuple):
    """One replica's ops and what is known of their gathered tensors."""

    ops: list  # in creation order
    gathered: dict  # gathered tensor name -> its gather's output name
    wholes: set  # buffers of the whole weights the layers read
    size_of: object  # tensor -> bytes (None: unknown)
    aliases: dict  # tensor name -> the tensor whose buffer it shares
    layer_of: dict  # gather output name -> the layer whose weight it is


def step_graph_of(model, x, y):
    """The graph Keras runs for one train step of `model` on `(x, y)`.

    `model.make_train_function()` and its per-step `tf.function`
    (`one_step_on_data`, which calls `strategy.run(train_step)`), traced
    for the distributed dataset of `(x, y)` in one batch of `len(x)` (a
    static shape: the batch a real `fit` of that size traces too).
    """
    model.make_train_function()
    step = _compat.train_step_function(model)
    if step is None:
        raise ValueError(
            "gathered_liveness needs the tf.function Keras runs per train "
            f"step, and {type(model).__name__} has none (run_eagerly=True, "
            "or a Keras release that builds its train function otherwise)."
        )
    strategy = model.distribute_strategy
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(
        len(x), drop_remainder=True
    )
    spec = strategy.experimental_distribute_dataset(data).element_spec
    return step.get_concrete_function(spec).graph


def gathered_liveness(
    model, x, y, replica: int = 0, started: dict | None = None
) -> GatheredReport:
    """Gathered bytes alive in the real train step of a sharded `model`.

    Args:
        model: a compiled `tfmemopt.Model` (or `Model.wrap`) under a
            strategy, `shard_parameters=True` (an unsharded model reports
            no gathers).
        x, y: NumPy arrays, one global batch.
        replica: Int, defaults to `0`: whose ops are simulated.
        started: optional dict, op name -> start time, read from a profile
            of this step run by `fit`: the step is then also simulated in
            the order the executor ran it (`"executed"`,
            `observed_order`).

    Returns:
        A `GatheredReport`.
    """
    graph = step_graph_of(model, x, y)
    devices = model.distribute_strategy.extended.worker_devices
    ops = _replica_ops(graph, tf.DeviceSpec.from_string(devices[replica]))
    gathered, starts = _gathered_tensors(ops)
    aliases = _identity_n_aliases(ops)
    aliases.update(_identity_slices(ops))
    aliases.update(_view_aliases(ops, gathered, starts))
    names = {layer.name for layer in _compat.sublayers(model)}
    step = _Step(
        ops=ops,
        gathered=gathered,
        wholes=_whole_weights(ops, gathered, aliases),
        size_of=_unowned_free(_size_function(gathered, starts), aliases),
        aliases=aliases,
        layer_of={t.name: _layer_of_gather(t, names) for t in starts},
    )
    by_layer = {}
    for name in step.layer_of.values():
        by_layer[name] = by_layer.get(name, 0) + 1
    orders = {
        "graph": _liveness(step, "graph", ops),
        "asap": _liveness(step, "asap", _asap(ops)),
        "gathers_first": _liveness(
            step, "gathers_first", _gathers_first(ops, gathered)
        ),
    }
    if started:
        orders["executed"] = _liveness(
            step, "executed", observed_order(ops, started)
        )
    return GatheredReport(len(starts), by_layer, orders)


def _replica_ops(graph, device) -> list:
    """The ops of `graph` that run on `device`, in creation order."""
    all_ops = graph.get_operations()
    run = _ops_that_run(all_ops, graph.outputs)

    def on_device(op):
        if not op.device:
            return False
        spec = tf.DeviceSpec.from_string(op.device)
        return (spec.device_type, spec.device_index) == (
            device.device_type,
            device.device_index,
        )

    return [op for op in all_ops if op.name in run and on_device(op)]


def _is_data_gather(op) -> bool:
    """A `CollectiveGatherV2` of values (all_gather first gathers the
    parts' shapes, an int32 tensor, then the values)."""
    return op.type == "CollectiveGatherV2" and op.outputs[0].dtype.is_floating


def _gathered_tensors(ops):
    """`(gathered tensor name -> its gather's output name, gather outputs)`
    among `ops`."""
    names = {op.name for op in ops}
    starts = [op.outputs[0] for op in ops if _is_data_gather(op)]
    gathered = {t.name: t.name for t in starts}
    stack = list(starts)
    while stack:
        t = stack.pop()
        for consumer in t.consumers():
            if consumer.type not in _CARRY or consumer.name not in names:
                continue
            for out in consumer.outputs:
                if out.dtype.is_floating and out.name not in gathered:
                    gathered[out.name] = gathered[t.name]
                    stack.append(out)
    return gathered, starts


def _part_bytes(start) -> tuple:
    """`(replicas, bytes of one replica's part)` of a data gather."""
    op = start.op
    group = tf.get_static_value(op.inputs[1])
    part = op.inputs[0]
    while _nbytes(part) is None and part.op.inputs:
        part = part.op.inputs[0]  # all_gather's Pad / Transpose of the part
    return group, _nbytes(part)


def _size_function(gathered, starts):
    """Bytes of a tensor; a gathered one of unknown shape (all_gather's
    own ops have dynamic shapes) counts as its gather's output, whose size
    is the replicas' parts: `group_size x part`."""
    gather_bytes = {}
    for t in starts:
        group, n = _part_bytes(t)
        if group is not None and n is not None:
            gather_bytes[t.name] = int(group) * n

    def size_of(t):
        n = _nbytes(t)
        if n is not None:
            return n
        if t.name in gathered:
            return gather_bytes.get(gathered[t.name], 0)
        return None

    return size_of


# TF's CPU kernels hand a slice along the first dimension on without a
# copy when its start is aligned (`strided_slice_op.cc`, "slice is memory
# contiguous (only occurs in dim 0)", `IsDim0SliceAligned`: a multiple of
# `EIGEN_MAX_ALIGN_BYTES`, 64 with AVX-512), and a transpose of one
# dimension is the identity.
_ALIGN = 64


def _view_aliases(ops, gathered, starts) -> dict:
    """Gathered slices and transposes that share their input's buffer."""
    parts = {t.name: _part_bytes(t)[1] for t in starts}
    out = {}
    for op in ops:
        if op.type not in ("StridedSlice", "Slice", "Transpose"):
            continue
        y, x = op.outputs[0], op.inputs[0]
        if y.name not in gathered or x.name not in gathered:
            continue
        if (parts.get(gathered[y.name]) or 1) % _ALIGN:
            continue
        rank = x.shape.rank
        if op.type == "Transpose":
            view = rank is not None and rank <= 1
        else:
            inner = x.shape[1:] if rank else None
            view = rank == 1 or (
                rank is not None
                and inner.is_fully_defined()
                and (y.shape == inner or y.shape[1:] == inner)
            )
        if view:
            out[y.name] = x.name
    return out


def _identity_slices(ops) -> dict:
    """Slices of a whole tensor (output shape = input shape, so the start
    is 0): TF's kernels hand the input on (`is_identity`), as
    `checkpointing._recompute._after`'s slices are meant to."""
    return {
        op.outputs[0].name: op.inputs[0].name
        for op in ops
        if op.type == "Slice"
        and op.inputs[0].shape.is_fully_defined()
        and op.outputs[0].shape == op.inputs[0].shape
    }


def _unowned_free(size_of, aliases):
    """`size_of`, with 0 for a tensor that shares the buffer of a
    variable's read (`_FREE`: no buffer of the step's own), such as a
    whole-tensor slice of a replica's part."""

    def sized(t):
        src = t
        while src.name in aliases:
            src = t.graph.get_tensor_by_name(aliases[src.name])
        if src is not t and src.op.type in _FREE:
            return 0
        return size_of(t)

    return sized


def _identity_n_aliases(ops) -> dict:
    """Output i of an IdentityN shares input i's buffer (a custom
    gradient's outputs)."""
    return {
        out.name: inp.name
        for op in ops
        if op.type == "IdentityN"
        for inp, out in zip(op.inputs, op.outputs)
    }


def _layer_of_gather(start, names) -> str:
    """The layer whose weight a gather gathers: the scope of the read of
    its part (`ReadVariableOp`); the recompute of a checkpointed segment
    gathers outside the layer's scope, from the part read in the forward."""
    seen, stack = set(), [start.op]
    while stack:
        op = stack.pop()
        if op.name in seen or len(seen) > 200:
            continue
        seen.add(op.name)
        if op.type == "ReadVariableOp":
            return _layer_name(op.name, names)
        stack.extend(t.op for t in op.inputs[:1])
    return _layer_name(start.op.name, names)


def _whole_weights(ops, gathered, aliases) -> set:
    """The buffers of the gathered tensors read by an op that computes
    with them: the whole weights (in the dtype the layer reads)."""
    names = {op.name for op in ops}
    out = set()
    for op in ops:
        if op.type in _CARRY:
            continue
        for t in op.inputs:
            if t.name in gathered and t.op.name in names:
                out.add(_buffer_of(t, aliases))
    return out


def _buffer_of(t, aliases) -> str:
    """The tensor whose buffer `t` shares (as `_simulate` counts it)."""
    graph = t.graph
    while True:
        if t.name in aliases:
            t = graph.get_tensor_by_name(aliases[t.name])
        elif t.op.type in _ALIAS and t.op.inputs:
            t = t.op.inputs[0]
        else:
            return t.name


def _asap(ops) -> list:
    """`ops` sorted by depth (stable): each as soon as its inputs allow."""
    index = {op.name: i for i, op in enumerate(ops)}
    depth = {}
    for op in ops:  # creation order is topological
        preds = [t.op for t in op.inputs] + list(op.control_inputs)
        depth[op.name] = 1 + max(
            (depth.get(p.name, 0) for p in preds if p.name in index),
            default=0,
        )
    return sorted(ops, key=lambda op: (depth[op.name], index[op.name]))


def _gathers_first(ops, gathered) -> list:
    """`ops` in a topological order that runs every ready op an all-gather
    needs (its inputs, transitively) or makes (a gathered tensor) before
    any other ready op: an executor that lets the gathers run ahead of the
    layers' compute, as TF's did in a profiled step."""
    index = {op.name: i for i, op in enumerate(ops)}
    preds = {
        op.name: {
            p.name
            for p in [t.op for t in op.inputs] + list(op.control_inputs)
            if p.name in index
        }
        for op in ops
    }
    first = {
        op.name
        for op in ops
        if _is_data_gather(op) or any(t.name in gathered for t in op.outputs)
    }
    stack = [name for name in first]
    while stack:  # what the gathers need
        for p in preds[stack.pop()]:
            if p not in first:
                first.add(p)
                stack.append(p)
    readers = {op.name: [] for op in ops}
    for op in ops:
        for p in preds[op.name]:
            readers[p].append(op)
    waiting = {name: len(p) for name, p in preds.items()}

    def key(op):
        return (0 if op.name in first else 1, index[op.name], op)

    ready = [key(op) for op in ops if not waiting[op.name]]
    heapq.heapify(ready)
    out = []
    while ready:
        op = heapq.heappop(ready)[-1]
        out.append(op)
        for r in readers[op.name]:
            waiting[r.name] -= 1
            if not waiting[r.name]:
                heapq.heappush(ready, key(r))
    return out


def observed_order(ops, started: dict) -> list:
    """`ops` in the order a real run started them.

    `started`: op name -> start time (from a profile of a step); grappler
    fuses or folds some ops, which then have no time of their own: such an
    op is placed with its first timed reader (it ran inside that kernel or
    just before it), or, with none, as soon as its inputs ran. Every op
    stays after its inputs and control inputs.
    """
    index = {op.name: i for i, op in enumerate(ops)}
    readers = {op.name: [] for op in ops}
    for op in ops:
        for p in [t.op for t in op.inputs] + list(op.control_inputs):
            if p.name in index:
                readers[p.name].append(op.name)
    down = {}
    for op in reversed(ops):  # creation order is topological
        if op.name in started:
            down[op.name] = started[op.name]
        else:
            later = [down[r] for r in readers[op.name] if down[r] is not None]
            down[op.name] = min(later) if later else None
    at = {}
    for op in ops:
        preds = [t.op for t in op.inputs] + list(op.control_inputs)
        up = max((at[p.name] for p in preds if p.name in at), default=None)
        own = down[op.name] if down[op.name] is not None else up
        if own is None:
            own = min(started.values(), default=0)
        at[op.name] = own if up is None else max(own, up)
    return sorted(ops, key=lambda op: (at[op.name], index[op.name]))


def _layer_name(op_name: str, names: set) -> str:
    """The innermost layer whose (uniquified) scope holds the op."""
    found = "?"
    for part in op_name.split("/")[:-1]:
        name = _layer_of(part, names)
        if name in names:
            found = name
    return found


def _liveness(step: _Step, order: str, ops: list) -> Liveness:
    """The step simulated with `ops` in this order (`_simulate`), and its
    allocations replayed to follow the gathered bytes alive."""
    gathered, wholes, size_of = step.gathered, step.wholes, step.size_of
    events, at_peak = [], set()
    peak = _simulate(
        ops, [], size_of, step.aliases, events=events, at_peak=at_peak
    )
    live = max_gathered = whole = max_whole = 0
    sizes = {}
    for key, n in events:
        if not isinstance(key, str) or key not in gathered:
            continue
        if n is None:
            n = -sizes.pop(key)
        else:
            sizes[key] = n
        live += n
        max_gathered = max(max_gathered, live)
        if key in wholes:
            whole += n
            max_whole = max(max_whole, whole)
    by_layer = {}
    for key in at_peak:
        if key in gathered:
            t = ops[0].graph.get_tensor_by_name(key)
            name = step.layer_of[gathered[key]]
            by_layer[name] = by_layer.get(name, 0) + int(size_of(t) or 0)
    return Liveness(
        order=order,
        peak=int(peak),
        gathered_at_peak=int(sum(by_layer.values())),
        max_gathered=int(max_gathered),
        max_whole=int(max_whole),
        at_peak_by_layer=by_layer,
    )


def whole_bytes(weights) -> int:
    """Bytes of `weights` (whole, in their dtype)."""
    return int(
        sum(np.prod(w.shape) * tf.as_dtype(w.dtype).size for w in weights)
    )
