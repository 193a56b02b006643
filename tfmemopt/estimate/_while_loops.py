"""Bytes held by the `tf.while_loop`s of a traced step (recurrent layers).

Keras's recurrent layers (LSTM, GRU, SimpleRNN, and any layer built on
`keras.layers.RNN`) run a `tf.while_loop` on TensorFlow when cuDNN is not
used. Their tensors are TensorLists (`variant` dtype, no static size), so
they are sized here from the mechanism:

- For the backward pass, `while_v2` keeps one copy per iteration of every
  forward tensor that the gradient of the loop body reads: it pushes them
  onto accumulators (`EmptyTensorList` with a static element shape once the
  batch is fixed) that become outputs of the forward `While` op and are
  popped by the gradient `While` op. For an LSTM cell these are the step's
  input, the previous h and c, the four gate activations and tanh(c).
  A pushed *variable read* shares the variable's buffer and costs nothing;
  a pushed cast of it (a 16-bit copy of the kernel under a mixed policy)
  is a new tensor each step.
- TensorArrays are TensorLists too: `TensorListFromTensor` (the unstacked
  inputs) copies its input, one allocation per element;
  `TensorListReserve` (the outputs) is filled by the loop, one element per
  step for `return_sequences=True`, one in all otherwise.
"""

from __future__ import annotations

import math

import tensorflow as tf

_WHILE = ("While", "StatelessWhile")
_CALLS = ("StatefulPartitionedCall", "PartitionedCall")


def _static(t):
    try:
        return tf.get_static_value(t)
    except (TypeError, ValueError):  # pragma: no cover - defensive
        return None


def _element_bytes(list_op):
    """Bytes of one element of a TensorList created by `list_op`, or None."""
    shape = _static(list_op.inputs[0])
    if shape is None or shape.ndim != 1:  # -1: rank unknown
        return None
    dims = [int(d) for d in shape.tolist()]  # [] for scalars
    if any(d < 0 for d in dims):
        return None
    dtype = tf.as_dtype(list_op.get_attr("element_dtype"))
    return math.prod(dims) * dtype.size, dtype


def _pushed_op_types(body_name, library):
    """Loop-variable index -> op type of the tensor the body pushes on it."""
    body = library.get(body_name)
    if body is None:
        return {}
    args = {a.name: i for i, a in enumerate(body.signature.input_arg)}
    types = {n.name: n.op for n in body.node_def}
    out = {}
    for node in body.node_def:
        if node.op != "TensorListPushBack" or len(node.input) < 2:
            continue
        index = args.get(node.input[0].split(":")[0])
        if index is not None:
            out[index] = types.get(node.input[1].split(":")[0], "")
    return out


def _iterations(op, known):
    """Static trip count of a `While` op, or None."""
    found = []
    for t in op.inputs:
        src = t.op
        if src.type == "TensorListReserve":
            n = _static(src.inputs[1])
            if n is not None and int(n) > 0:
                found.append(int(n))
        elif src.type == "TensorListFromTensor":
            dims = src.inputs[0].shape.as_list() if src.inputs else []
            if dims and dims[0] is not None:
                found.append(int(dims[0]))
        elif src.name in known:
            found.append(known[src.name])
    return max(found) if found else None


def while_loop_sizes(ops, graph_def):
    """Sizes of the TensorLists in `ops` (a traced step, in graph order).

    Returns:
        `(sizes, aliases)`: `sizes` maps a variant tensor's name to
        `(bytes, element dtype, shared, bytes of one element)` for the lists
        that hold memory (`shared`: the elements are a variable's buffer, no
        memory of their own); `aliases`
        maps a `While` output to the input list it passes through.
    """
    library = {f.signature.name: f for f in graph_def.library.function}
    sizes, aliases, trips = {}, {}, {}
    for op in ops:
        if op.type == "TensorListFromTensor":
            t = op.inputs[0]
            if t.shape.is_fully_defined():
                n = math.prod(t.shape.as_list()) * t.dtype.size
                dims = t.shape.as_list()
                each = n // dims[0] if dims and dims[0] else n
                sizes[op.outputs[0].name] = (n, t.dtype, False, each)
            continue
        if op.type == "ZerosLike" and op.inputs[0].name in sizes:
            # The gradient of a TensorList starts as zeros of its elements:
            # new tensors, also where the list shares a variable's buffer.
            n, dtype, _, each = sizes[op.inputs[0].name]
            sizes[op.outputs[0].name] = (n, dtype, False, each)
            continue
        if op.type in _CALLS:
            try:
                fdef = library.get(op.get_attr("f").name)
            except (ValueError, AttributeError):
                fdef = None
            n_iter = _iterations(op, trips) if fdef is not None else None
            if n_iter is not None:
                _node_lists(op, fdef, library, n_iter, sizes, aliases)
            continue
        if op.type not in _WHILE:
            continue
        n_iter = _iterations(op, trips)
        if n_iter is None:
            continue
        trips[op.name] = n_iter
        pushed = _pushed_op_types(op.get_attr("body").name, library)
        for i, out in enumerate(op.outputs):
            if out.dtype != tf.variant or i >= len(op.inputs):
                continue
            src = op.inputs[i].op
            if src.type == "EmptyTensorList":
                elem = _element_bytes(src)
                if elem is None:
                    continue
                shared = pushed.get(i) == "ReadVariableOp"
                sizes[out.name] = (elem[0] * n_iter, elem[1], shared, elem[0])
            elif src.type == "TensorListReserve":
                elem = _element_bytes(src)
                filled = _static(src.inputs[1])
                if elem is None or filled is None:
                    continue
                n = elem[0] * int(filled)
                sizes[out.name] = (n, elem[1], False, elem[0])
            else:
                aliases[out.name] = op.inputs[i].name
    return sizes, aliases


def _node_lists(call, fdef, library, n_iter, sizes, aliases):
    """Sizes the TensorLists a function call returns from a loop inside it.

    With a persistent tape, TensorFlow runs a differentiated while loop
    inside a forward function that returns the loop's accumulators.
    """
    nodes = {n.name: n for n in fdef.node_def}
    args = {a.name: i for i, a in enumerate(fdef.signature.input_arg)}
    for j, arg in enumerate(fdef.signature.output_arg):
        ref = fdef.ret.get(arg.name, "").split(":")
        node = nodes.get(ref[0])
        while node is not None and node.op == "Identity" and node.input:
            ref = node.input[0].split(":")
            node = nodes.get(ref[0])
        if node is None or node.op not in _WHILE or len(ref) < 3:
            continue
        k = int(ref[2])
        pushed = _pushed_op_types(node.attr["body"].func.name, library)
        if k >= len(node.input):
            continue
        name = node.input[k].split(":")[0]
        if name in args and args[name] < len(call.inputs):  # pass-through
            outer = call.inputs[args[name]]
            if outer.op.type == "TensorListReserve":  # filled by the loop
                elem = _element_bytes(outer.op)
                filled = _static(outer.op.inputs[1])
                if elem is not None and filled is not None:
                    n = elem[0] * int(filled)
                    entry = (n, elem[1], False, elem[0])
                    sizes[call.outputs[j].name] = entry
            else:
                aliases[call.outputs[j].name] = outer.name
            continue
        src = nodes.get(name)
        if src is None or src.op != "EmptyTensorList":
            continue
        shape = nodes.get(src.input[0].split(":")[0])
        if shape is None or shape.op != "Const":
            continue
        dims = tf.make_ndarray(shape.attr["value"].tensor)
        if dims.ndim != 1 or any(int(d) < 0 for d in dims.tolist()):
            continue
        dtype = tf.as_dtype(src.attr["element_dtype"].type)
        each = math.prod(int(d) for d in dims.tolist()) * dtype.size
        shared = pushed.get(k) == "ReadVariableOp"
        sizes[call.outputs[j].name] = (each * n_iter, dtype, shared, each)


def run_ahead_bytes(ops, weight_shapes, counted) -> int:
    """Bytes of the weight gradients the recurrent layers' backward loops
    may hold at once when their iterations run ahead of their sums, at
    most: per gradient `While` op in `ops`, the iterations that can run
    at once (`parallel_iterations`, or fewer steps) times the bytes one
    iteration adds into the loop's weight-gradient sums;
    the largest, over the loops, of one loop's with those of the loops
    that can run beside it (neither waits for the other: the two
    directions of a `Bidirectional` layer).

    `while_v2` sums the gradient of a weight the loop reads (a recurrent
    layer's kernels) in a loop variable that starts as zeros of the
    weight's shape; each iteration makes its own gradient and adds it.
    The executor lets up to `parallel_iterations` iterations (32 in
    Keras's recurrent layers) run at once, so their gradients can wait for
    the additions together. Allocator trace of an Elman RNN language model
    (two SimpleRNN(512), 64 steps) with 4 micro-batches of 32: 64 of the
    second layer's 1 MiB gradients were alive at the peak, two per
    iteration; the same step at batch 32 without accumulation held one at
    a time. How far the iterations run ahead depends on how long each op
    takes: this is a bound, not a prediction. `weight_shapes`: the shapes
    (tuples) of the trainable weights; `counted(n)`: bytes counted.
    """
    shapes = set(weight_shapes)
    loops = {}
    for op in ops:
        if op.type in _WHILE and op.name.startswith("gradient_tape"):
            n = _sums_per_iteration(op, shapes, counted)
            if n:
                loops[op] = _in_flight(op) * n
    before = {op: _ancestors(op) for op in loops}
    largest = 0
    for op, n in loops.items():
        beside = sum(
            m
            for other, m in loops.items()
            if other is not op
            and other.name not in before[op]
            and op.name not in before[other]
        )
        largest = max(largest, n + beside)
    return largest


def _in_flight(op) -> int:
    """How many iterations of the gradient loop `op` can run at once: its
    `parallel_iterations`, or the forward loop's trip count where that is
    smaller and static (the forward `While` whose outputs it reads)."""
    most = op.get_attr("parallel_iterations")
    for t in op.inputs:
        if t.op.type in _WHILE and t.op is not op:
            trips = _iterations(t.op, {})
            if trips is not None:
                most = min(most, trips)
    return most


def _sums_per_iteration(op, shapes, counted) -> int:
    """Bytes one iteration of the gradient loop `op` adds into its weight
    gradients' sums: its inputs that are zeros of a weight's shape made in
    the forward loop's gradient scope (`gradient_tape/.../while/zeros`;
    the incoming gradient's zeros are made outside it)."""
    scope = op.name.split("/while/")[0] + "/while/"
    n = 0
    for t in op.inputs:
        if t.op.type not in ("Fill", "ZerosLike"):
            continue
        if not t.dtype.is_floating or not t.op.name.startswith(scope):
            continue
        shape = tuple(t.shape.as_list()) if t.shape.rank else None
        if shape in shapes:
            n += counted(math.prod(shape) * t.dtype.size)
    return n


def _ancestors(op) -> set:
    """Names of the ops `op` waits for (inputs and control inputs)."""
    seen, stack = set(), [t.op for t in op.inputs] + list(op.control_inputs)
    while stack:
        node = stack.pop()
        if node.name in seen:
            continue
        seen.add(node.name)
        stack.extend(t.op for t in node.inputs)
        stack.extend(node.control_inputs)
    return seen
