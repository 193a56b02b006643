"""The orders a step's ops may run in: `roots_first` (the step's replay,
`_step_graph`: what needs nothing of the batch first), and for
`_gathered_liveness`: `asap` (each op as soon as its inputs allow),
`gathers_first` (an executor that lets all-gathers run ahead of the
compute) and `observed_order` (the order a profiled run started them).
Each keeps every op after its inputs and control inputs."""

from __future__ import annotations

import heapq

from tfmemopt.estimate._gathered_tensors import _is_data_gather


def _preds(op) -> list:
    """The ops `op` waits for: its inputs' and its control inputs."""
    return [t.op for t in op.inputs] + list(op.control_inputs)


def roots_first(ops, captured) -> list:
    """`ops` with those that need nothing of the step's batch first.

    TensorFlow's executor starts every node whose inputs are ready when the
    step starts: constants and what the function captures (the variables'
    handles). An op that reads only those (a weight's cast or transpose, a
    mask or bias built from constants, the loss gradient's broadcast of a
    constant) is ready at once and runs while the forward pass has barely
    begun; its output is held from there to its last reader, not made
    just before it. Measured (allocator trace of ESPCN at batch 32): the
    loss gradient's two broadcasts, 4.5 and 13.5 MiB, were allocated
    before the first convolution's output. `captured`: the names of the
    captures' placeholder ops. Each group keeps its order.
    """
    early = {}

    def at_start(p):  # an op before `ops`, or one already seen
        if p.name in early:
            return early[p.name]
        return p.type == "Const" or p.name in captured

    for op in ops:  # creation order is topological
        if op.type == "Placeholder":
            early[op.name] = op.name in captured
        else:
            early[op.name] = all(at_start(p) for p in _preds(op))
    return [op for op in ops if early[op.name]] + [
        op for op in ops if not early[op.name]
    ]


def _asap(ops) -> list:
    """`ops` sorted by depth (stable): each as soon as its inputs allow."""
    index = {op.name: i for i, op in enumerate(ops)}
    depth = {}
    for op in ops:  # creation order is topological
        depth[op.name] = 1 + max(
            (depth.get(p.name, 0) for p in _preds(op) if p.name in index),
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
        op.name: {p.name for p in _preds(op) if p.name in index} for op in ops
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
        for p in _preds(op):
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
        up = max((at[p.name] for p in _preds(op) if p.name in at), default=None)
        own = down[op.name] if down[op.name] is not None else up
        if own is None:
            own = min(started.values(), default=0)
        at[op.name] = own if up is None else max(own, up)
    return sorted(ops, key=lambda op: (at[op.name], index[op.name]))
