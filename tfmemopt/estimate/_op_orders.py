"""The orders a step's ops may run in: `executor_order` (the step's
replay, `_step_graph` via `_executor`: TensorFlow's executor on its
inter-op threads), and for `_gathered_liveness`: `asap` (each op as soon
as its inputs allow),
`gathers_first` (an executor that lets all-gathers run ahead of the
compute) and `observed_order` (the order a profiled run started them).
Each keeps every op after its inputs and control inputs."""

from __future__ import annotations

import heapq
from collections import deque

from tfmemopt.estimate._gathered_tensors import _is_data_gather


def _preds(op) -> list:
    """The ops `op` waits for: its inputs' and its control inputs."""
    return [t.op for t in op.inputs] + list(op.control_inputs)


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


def executor_order(
    ops, cost, expensive, threads: int = 2, spans=None, merged=None
) -> list:
    """`ops` in the order TensorFlow's executor starts them on `threads`
    inter-op threads: an event simulation in which `cost(op)` is how long
    the op runs and `expensive(op)` whether the executor hands it to the
    thread pool (else it runs inline).

    What `ExecutorState::ScheduleReady` and Eigen's thread pool do: each
    of the step's roots is a task, spread over the threads' queues. A task
    runs its op, then the op's successors that became ready: the
    inexpensive ones inline, in the same task; the last expensive one
    inline too when nothing else is left; every other expensive one as a
    new task at the front of this thread's queue. A thread takes its next
    task from the front of its own queue; an idle thread steals from the
    back of another's. `spans`: a dict to fill with each op's (start, end);
    `merged`: op name -> the op that runs in its place (Grappler merged
    it away): its readers wait for that one.
    So a thread goes deep into one branch while the
    other takes the oldest work left, where graph order would interleave
    parallel branches (an Inception module's four; issue #23).
    """
    index = {op.name: i for i, op in enumerate(ops)}
    readers = {op.name: [] for op in ops}
    waiting = {}
    merged = merged or {}
    for op in ops:
        preds = {merged.get(p.name, p.name) for p in _preds(op)}
        preds = {p for p in preds if p in index}
        waiting[op.name] = len(preds)
        for p in preds:
            readers[p].append(op)
    for r in readers.values():
        r.sort(key=lambda op: index[op.name])
    queues = [deque() for _ in range(threads)]
    roots = [op for op in ops if not waiting[op.name]]
    for k, op in enumerate(roots):
        queues[k % threads].append(deque([op]))
    task = [deque() for _ in range(threads)]  # the ops each runs inline
    running = [None] * threads  # (op, end time)
    now = [0.0] * threads
    order = []

    def schedule(k, ready):
        last, spawned = None, []
        for op in ready:
            if not expensive(op):
                task[k].append(op)
                continue
            if last is not None:
                spawned.append(last)
            last = op
        if last is not None:
            if task[k]:
                spawned.append(last)
            else:
                task[k].append(last)
        for op in spawned:
            queues[k].appendleft(deque([op]))

    def next_task(k):
        if queues[k]:
            return queues[k].popleft()
        for j in range(threads):
            if j != k and queues[j]:
                return queues[j].pop()
        return deque()

    def turn(j):  # when thread j acts next; at a tie an op ends first
        if running[j]:
            return (running[j][1], 0, j)
        return (now[j], 1, j)

    while len(order) < len(ops):
        k = min(range(threads), key=turn)
        t = turn(k)[0]
        if running[k]:
            done, running[k] = running[k][0], None
            ready = []
            for r in readers[done.name]:
                waiting[r.name] -= 1
                if not waiting[r.name]:
                    ready.append(r)
            schedule(k, ready)
        if not task[k]:
            task[k] = next_task(k)
        now[k] = t
        if task[k]:
            op = task[k].popleft()
            order.append(op)
            running[k] = (op, t + cost(op))
            if spans is not None:
                spans[op.name] = (t, running[k][1])
            continue
        ends = [running[j][1] for j in range(threads) if running[j]]
        if not ends:  # nothing runs and nothing is ready: a cycle
            raise ValueError("ops that never become ready: not a DAG")
        now[k] = min(ends)  # idle until another op ends
    return order
