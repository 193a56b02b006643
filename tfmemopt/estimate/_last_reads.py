"""When a simulated step reads each buffer last (`_simulate`): an op's
inputs are released after it ends, and the tensors whose buffer one shares
(`aliases`) with it."""

from __future__ import annotations

import bisect

from tfmemopt.estimate._update_timing import _starts


def _read_names(tensors, aliases):
    """The names an op's reads release: each tensor's, and those of the
    tensors whose buffer it shares (`aliases`, followed to the end)."""
    names = []
    for t in tensors:
        name = t.name
        names.append(name)
        while name in aliases:
            name = aliases[name]
            names.append(name)
    return names


def _released_at(ops, spans):
    """Per op, the index of the op after which its inputs are released:
    the last op that starts before it ends (`spans`: op name -> (start,
    end), from `_op_orders.executor_order`). An op's inputs are read until
    it ends; ops that start meanwhile, on another thread, allocate beside
    them. Without `spans`, each op's own index."""
    if spans is None:
        return list(range(len(ops)))
    starts = _starts(ops, spans)
    out = []
    for i, op in enumerate(ops):
        end = spans[op.name][1] if op.name in spans else starts[i]
        out.append(max(i, bisect.bisect_left(starts, end) - 1))
    return out


def _last_reads(ops, aliases, accumulated, spans):
    """When each tensor's buffer is read last and released.

    Returns `(read, last, due, sums)`: tensor name -> index of the last op
    that reads it (`read`: when an element-wise op may write into it) and
    index after which it is released (`last`); index -> the tensors
    released there (`due`); tensor name -> the rewritten sum whose buffer
    is made with it (`sums`).
    """
    released = _released_at(ops, spans)
    read, last, due, made = {}, {}, {}, {}
    sums = {}
    for i, op in enumerate(ops):
        for t in op.outputs:
            made[t.name] = i
        at, free = i, released[i]
        for t in op.inputs:
            if op.name in accumulated:
                # Grappler's rewrite: the sum's variable is initialised
                # after its first input (`min_input_id`: the earliest in its
                # static schedule; a tie is the first); each input is added
                # when both are there.
                first = op.inputs[0].name
                sums.setdefault(first, op.outputs[0])
                at = free = max(made.get(t.name, i), made.get(first, i))
            due.setdefault(free, []).append(t)
            name = t.name
            while True:  # its buffer is read here too
                read[name] = max(read.get(name, -1), at)
                last[name] = max(last.get(name, -1), free)
                if name not in aliases:
                    break
                name = aliases[name]
    return read, last, due, sums
