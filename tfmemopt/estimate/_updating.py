"""The step simulated with each gradient consumed as soon as it is made
(`_simulate_updating`: Keras's element-wise optimizers on one device, each
weight's update beside the backward pass, `_consumers.Consumer`), and the
reads of a weight that an early weight decay copies (`_decayed_reads`)."""

from __future__ import annotations

from tfmemopt.estimate._consumers import ROWS_TRAFFIC
from tfmemopt.estimate._simulate import _simulate
from tfmemopt.estimate._step_trace import _source


def _alive_bytes(held, alive) -> int:
    """Bytes of the copied weights' old buffers in `alive` (a peak's
    buffers: the first read of each holds it)."""
    return sum(n for name, (_, n) in held.items() if name in alive)


def _decayed_reads(concrete, run, variables, nbytes) -> dict:
    """The reads of each weight that its early decay copies (`nbytes`:
    per variable, 0 for none): read tensor name -> `(variable index,
    bytes)`, for the reads the step runs (`run`)."""
    placeholder = {id(ext): inner for ext, inner in concrete.graph.captures}
    names = {op.name for op in run}
    held = {}
    for i, (variable, n) in enumerate(zip(variables, nbytes)):
        handle = getattr(getattr(variable, "value", variable), "handle", None)
        inner = placeholder.get(id(handle))
        if not n or inner is None:
            continue
        for op in inner.consumers():
            if op.type == "ReadVariableOp" and op.name in names:
                held[op.outputs[0].name] = (i, n)
    return held


def _simulate_updating(
    model, concrete, ops, size_of, aliases, scratch, update, events, **kwargs
):
    """The step's peak when each gradient is consumed as soon as it is made.

    The function's outputs are Identity ops at its end: the update reads the
    gradient they pass on. `update` gives, per trainable variable, what
    consumes its gradient (`_consumers.Consumer`); `events` are filled from
    this run."""
    consumed, lingering, reads, rows_first = {}, {}, {}, set()
    uses = update(model.trainable_variables)
    for g, use in zip(concrete.structured_outputs, uses):
        rows = getattr(g, "values", None)  # a sparse gradient's rows
        if rows is None and g is None:
            continue
        name = _source(rows if rows is not None else g).name
        temps, runs, k = use.temporaries, use.runs, use.reads_gradient
        if rows is not None and use.copies_rows:
            # The update's first element-wise op on the rows keeps them
            # sparse: a new tensor of the rows' size (Adam's `square(g)`),
            # made while the update reads them (`rows_square`); they are
            # read and written as long as the weight's own traffic.
            n = size_of(_source(rows)) or 0
            temps = [n, *temps]
            k = None if k is None else k + 1
            runs += ROWS_TRAFFIC * n
            rows_first.add(name)
        consumed[name], lingering[name], reads[name] = temps, runs, k
    outputs = list(concrete.graph.outputs)
    ends = {t.op.name for t in outputs if _source(t).name != t.name}
    return _simulate(
        [op for op in ops if op.name not in ends],
        [_source(t) for t in outputs],
        size_of,
        aliases,
        scratch,
        events=events,
        consumed=consumed,
        lingering=lingering,
        reads_gradient=reads,
        rows_square=rows_first,
        **kwargs,
    )
