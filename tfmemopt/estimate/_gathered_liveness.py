"""How long gathered weights live in the real train step of a sharded model.

Under `shard_parameters=True` each weight is all-gathered whole when its
layer reads it (`distribute/_fsdp.py`). What matters for memory is
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
from them up to the whole weight the layer reads: `_gathered_tensors.py`)
and simulates the step with `_simulate._simulate`: each tensor allocated
when its op runs, freed after its last reader, reshapes sharing their
input's buffer.

Several orders are simulated (`_op_orders.py`). `graph`: the order the
ops were created in, a topological order (forward, then backward, as
traced). `asap`: every op as soon as its inputs and control inputs allow
(sorted by depth). `gathers_first`: every op an all-gather needs or makes
runs before any other ready op, an executor that lets gathers run ahead of
the compute. `executed` (given a profile's start times, `observed_order`):
the order TF's executor ran one step in. The collectives of a replica are
chained by control edges in creation order (no gather overtakes an earlier
gather or all-reduce of the same replica), but a gather otherwise waits
only for what its part depends on: in a profiled step TF ran the forward
gathers of all four blocks before the first block's matmul, which is why a
checkpointed segment's parts wait for its inputs
(`checkpointing/_recompute.py`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfmemopt import _compat
from tfmemopt.estimate._gathered_tensors import _gathered_tensors
from tfmemopt.estimate._gathered_tensors import _identity_n_aliases
from tfmemopt.estimate._gathered_tensors import _identity_slices
from tfmemopt.estimate._gathered_tensors import _layer_of_gather
from tfmemopt.estimate._gathered_tensors import _replica_ops
from tfmemopt.estimate._gathered_tensors import _size_function
from tfmemopt.estimate._gathered_tensors import _unowned_free
from tfmemopt.estimate._gathered_tensors import _view_aliases
from tfmemopt.estimate._gathered_tensors import _whole_weights
from tfmemopt.estimate._op_orders import _asap
from tfmemopt.estimate._op_orders import _gathers_first
from tfmemopt.estimate._op_orders import observed_order
from tfmemopt.estimate._simulate import _simulate


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
