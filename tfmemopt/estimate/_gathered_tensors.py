"""The gathered tensors of one replica's step, read from its graph (for
`_gathered_liveness`): the replica's ops that run, the outputs of each
data `CollectiveGatherV2` and every copy, slice, concat, reshape or cast
made from them, their bytes, the buffers they share (views, IdentityN,
whole-tensor slices), the whole weights the layers read, and the layer
each gather belongs to."""

from __future__ import annotations

import tensorflow as tf

from tfmemopt.estimate._saved_activations import _ALIAS
from tfmemopt.estimate._saved_activations import _FREE
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


def _layer_name(op_name: str, names: set) -> str:
    """The innermost layer whose (uniquified) scope holds the op."""
    found = "?"
    for part in op_name.split("/")[:-1]:
        name = _layer_of(part, names)
        if name in names:
            found = name
    return found
