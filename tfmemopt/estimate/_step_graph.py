"""The graph of one training step, and the memory it needs over time.

`trace_step` traces forward + loss + `tape.gradient` of a built Keras model
into a `tf.function` graph at a fixed batch size (nothing is executed, no
activation memory is allocated; `_step_trace` traces and reads it), then:

- finds the activations kept for the backward pass: forward tensors that a
  gradient op reads (TensorFlow's own gradient functions decide this, so
  every op is covered: Dense, Conv, normalisation, Dropout masks, attention
  scores, embedding gathers, ...);
- attributes them to the layer whose name scope produced them;
- simulates the step in the order TensorFlow's executor runs it on its
  inter-op threads (`_executor.replay_order`), with reference counts (a
  tensor is freed when its last reader ends; aliases such as Reshape
  share their input's buffer) to get the peak of live bytes
  (`_step_peaks`, in its views; `_simulate` runs one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tfmemopt.estimate._dedup import duplicates
from tfmemopt.estimate._dedup import merged_ops
from tfmemopt.estimate._dedup import times_one
from tfmemopt.estimate._executor import replay_order
from tfmemopt.estimate._gathered_tensors import _identity_slices
from tfmemopt.estimate._gathered_tensors import _unowned_free
from tfmemopt.estimate._kernels import folded_constants
from tfmemopt.estimate._saved_activations import _kept_for_backward
from tfmemopt.estimate._saved_activations import _units_at
from tfmemopt.estimate._saved_activations import gradient_seed
from tfmemopt.estimate._step_peaks import _simulated
from tfmemopt.estimate._step_trace import _all_layer_names
from tfmemopt.estimate._step_trace import _model_scope
from tfmemopt.estimate._step_trace import _nbytes
from tfmemopt.estimate._step_trace import _ops_that_run_in
from tfmemopt.estimate._step_trace import _path_function
from tfmemopt.estimate._step_trace import _size_function
from tfmemopt.estimate._step_trace import _sparse_rows
from tfmemopt.estimate._step_trace import _traced_step
from tfmemopt.estimate._step_trace import loop_lists
from tfmemopt.estimate._while_loops import run_ahead_bytes


@dataclasses.dataclass
class StepGraph:
    """What one traced training step holds (bytes)."""

    peak: int
    inputs: int
    saved: int
    gradients: int
    # (layer path, bytes kept for backward), in the order the backward
    # pass first reads them (the last layers first); the loss's and the
    # train step's own tensors under `_saved_activations.LOSS` where the
    # model's scope is known (`loss_apart`).
    saved_by_layer: list
    # depth -> (units in forward order, saved bytes per unit, bytes of
    # each unit's output read by later units): the candidate segments.
    segments: dict
    # Layers with kept tensors of unknown size (while loops, dynamic shapes).
    unknown: list
    # Trainable-variable index -> bytes of its sparse gradient's rows
    # (values and indices) when the gradient is a `tf.IndexedSlices`.
    sparse_rows: dict = dataclasses.field(default_factory=dict)
    # The same, bytes of the rows' values alone.
    sparse_values: dict = dataclasses.field(default_factory=dict)
    # Bytes of each input (and target) tensor, every one counted.
    input_sizes: list = dataclasses.field(default_factory=list)
    # The simulated step's allocations in order (`_simulate`'s `events`).
    events: list = dataclasses.field(default_factory=list)
    # Peak when each gradient is consumed as it is made (`update`), or None.
    updating_peak: int | None = None
    # Bytes of each sum of 3 or more gradients (AddN) that has an input
    # alive at the peak.
    sums_at_peak: list = dataclasses.field(default_factory=list)
    # The step's peak as Grappler's static memory estimate sees it (every
    # tensor counted, none written into an input's buffer): what its
    # memory optimizer compares with the device's memory (0: not simulated,
    # `min_counted_bytes` is 0 or the step runs in a loop's body).
    grappler_peak: int = 0
    # Bytes of the weights copied by an early weight decay whose old
    # buffer is still read at the peak (`decay`).
    decay_copies: int = 0
    # Bytes of weight gradients a recurrent layer's backward loop may hold
    # at once when its iterations run ahead of their sums, in a loop's body
    # (`in_loop`; a bound: `_while_loops.run_ahead_bytes`), not counted in
    # `peak`.
    run_ahead: int = 0
    # Whether the model's scope was found, so that `saved_by_layer` puts
    # the tensors made outside it and every layer under
    # `_saved_activations.LOSS`.
    loss_apart: bool = False
    # Bytes of each constant Grappler folds a constant-valued op into
    # (`_kernels.folded_constants`): allocated once, before the first
    # step, and kept; not in `peak`.
    folded: list = dataclasses.field(default_factory=list)


def trace_step(
    model,
    batch_size: int,
    activation_itemsize: int | None = None,
    input_shape=None,
    sequence_length=None,
    min_counted_bytes: int = 0,
    update=None,
    owner=None,
    loss=None,
    decay=None,
    in_loop=False,
    metrics_of=None,
    notes=None,
) -> StepGraph:
    """Traces one training step of `model` at `batch_size` and measures it.

    Args:
        model: a built Keras model.
        batch_size: Int, the batch the step sees (per replica, per micro-
            batch).
        activation_itemsize: optional Int: bytes per element of the
            model's floating activations (and their gradients) under another
            dtype policy; weight gradients and the loss keep their dtype.
        input_shape, sequence_length, min_counted_bytes: as for
            `estimate_memory` (tensors below `min_counted_bytes` count 0).
        update: optional callable: the model's trainable variables -> a
            list, per variable, of what consumes its gradient as soon as it
            is made (`_consumers.Consumer`: the sizes of its temporaries, `[]`
            when consumed in place, and how long they linger);
            the step is then also simulated so (`updating_peak`; `events`
            are from that run).
        owner: optional model whose long-sequence options
            (`enable_long_sequences`) apply: its chunked loss is traced
            from the head's input (`Forward.head_of`), as
            `tfmemopt.Model`'s step computes it.
        decay: optional callable: the model's trainable variables -> the
            bytes, per variable, that its weight decay copies while the
            step reads the weight (`_update.decayed_early`; 0: none).
        in_loop: Bool: the step runs as the body of a while loop (the
            micro-steps of `tfmemopt.Model`'s accumulation window), where
            Grappler's memory optimizer rewrites no gradient sum: allocator
            trace of an LSTM autoencoder with 4 micro-batches of 32, the
            100 inputs of one sum (`StridedSliceGrad` of a
            `TimeDistributed` layer's slices, [100, 32, 256] each) alive
            together at the peak, 318 MiB (estimated 155.7 MiB with the
            rewrite, 336.8 without; measured 342.6).
        metrics_of: optional compiled model whose metrics the step updates
            from the output after the gradient (Keras's step and
            `tfmemopt.Model`'s micro-step do); `notes` gets what cannot be
            traced.
        loss: optional loss the step computes (a Keras loss or its name);
            by default the owner's or the model's compiled loss, else mean
            squared error (under the owner's `chunked_loss`, sparse
            categorical cross-entropy from logits, the one it computes).
    """
    view = _prepare(
        model,
        batch_size,
        activation_itemsize,
        input_shape,
        sequence_length,
        min_counted_bytes,
        owner=owner,
        loss=loss,
        metrics_of=metrics_of,
        notes=notes,
    )
    ops, n_fwd, size_of = view.ops, view.n_fwd, view.size_of
    saved_by_layer, unknown = _kept_for_backward(
        ops[n_fwd:],
        view.fwd_names,
        view.path_of,
        size_of,
        view.same,
        views=view.ones,
        outside=_outside(model, view.model_scope, view.path_of),
    )
    segments = {
        depth: _units_at(
            depth,
            ops[:n_fwd],
            view.model_scope,
            view.path_of,
            saved_by_layer,
            size_of,
        )
        for depth in (1, 2, 3)
    }
    peaks = _simulated(model, view, min_counted_bytes, update, decay, in_loop)

    def counted(n):
        return 0 if n < min_counted_bytes else n

    concrete = view.concrete
    input_sizes = [_nbytes(t) or 0 for t in concrete.graph.inputs]
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    return StepGraph(
        peak=peaks.peak,
        inputs=sum(counted(n) for n in input_sizes),
        saved=sum(n for _, n in saved_by_layer),
        gradients=sum(counted(_nbytes(t) or 0) for t in view.outputs),
        saved_by_layer=saved_by_layer,
        loss_apart=view.model_scope is not None,
        segments=segments,
        unknown=unknown,
        sparse_rows=_sparse_rows(concrete),
        sparse_values=_sparse_rows(concrete, values_only=True),
        input_sizes=input_sizes,
        events=peaks.events,
        updating_peak=peaks.updating_peak,
        sums_at_peak=[size_of(op.outputs[0]) or 0 for op in peaks.sums],
        grappler_peak=peaks.grappler_peak,
        decay_copies=peaks.decay_copies,
        run_ahead=(
            run_ahead_bytes(view.run, shapes, counted) if in_loop else 0
        ),
        folded=view.folded,
    )


@dataclasses.dataclass
class _View:
    """A traced step ready to simulate (`_prepare`)."""

    concrete: Any
    ops: list  # every op that runs, the forward pass's first
    n_fwd: int  # how many of `ops` are the forward pass's
    fwd_names: set
    run: list  # in the executor's order, Grappler's merged ops left out
    spans: dict  # op name -> (start, end) on the executor's threads
    same: dict  # a merged tensor -> the one kept
    ones: dict  # products by a constant one -> their input
    path_of: Callable
    model_scope: str | None
    size_of: Callable  # bytes counted (`min_counted_bytes` applies)
    whole_size: Callable  # bytes, every tensor counted
    whole_aliases: dict
    sim_size: Callable  # what the simulated step allocates
    sim_aliases: dict
    folded: list  # constants Grappler folds, allocated before the step
    outputs: list  # the step's outputs: the gradients (and the loss)


def _prepare(
    model,
    batch_size,
    activation_itemsize,
    input_shape,
    sequence_length,
    min_counted_bytes,
    *,
    owner,
    loss,
    metrics_of,
    notes,
) -> _View:
    """Traces the step and sizes it: the ops in the order the executor
    runs them, the buffers they share, the bytes of each tensor."""
    concrete, n_fwd, loss = _traced_step(
        model,
        batch_size,
        input_shape,
        sequence_length,
        owner,
        loss,
        metrics_of=metrics_of,
        notes=notes,
    )
    ops, n_fwd = _ops_that_run_in(concrete, n_fwd, loss)
    # Grappler merges identical ops: one buffer for each set, and the
    # merged-away ops do not run (their readers read the one kept).
    fwd_names = {op.name for op in ops[:n_fwd]}
    same = duplicates(ops, fwd_names)
    merged = merged_ops(same)
    run = [op for op in ops if op.name not in merged]
    path_of = _path_function(model)
    model_scope = _model_scope(model, ops[:n_fwd], path_of)
    loops = loop_lists(concrete)  # sized once, for both views
    size_of, aliases = _size_function(
        concrete,
        model,
        model_scope,
        activation_itemsize,
        min_counted_bytes,
        loops=loops,
    )
    whole_size, whole_aliases = _size_function(
        concrete, model, model_scope, activation_itemsize, 0, loops=loops
    )
    # The order the executor runs the ops in, and when each runs.
    run, spans = replay_order(run, whole_size, same=same)
    # A whole-tensor slice hands its input on (the recompute's waits,
    # `checkpointing._recompute._after`); one of a weight's read value
    # (no buffer of the step's own) costs nothing; nor does a product by
    # a constant one (Grappler folds it).
    slices = _identity_slices(run)
    aliases = {**aliases, **same}
    ones = times_one(run)
    sim_aliases = {**aliases, **slices, **ones}
    # Constant-valued ops Grappler folds are allocated once, before the
    # step (`folded`), not by it.
    # (The tape's seed stands for the broadcast gradient of the loss's
    # mean, which the step makes.)
    seed = gradient_seed(ops[n_fwd:])
    constants, folded = folded_constants(
        [op for op in run if op.name not in seed], size_of
    )
    return _View(
        concrete=concrete,
        ops=ops,
        n_fwd=n_fwd,
        fwd_names=fwd_names,
        run=run,
        spans=spans,
        same=same,
        ones=ones,
        path_of=path_of,
        model_scope=model_scope,
        size_of=size_of,
        whole_size=whole_size,
        whole_aliases=whole_aliases,
        sim_size=_without(_unowned_free(size_of, sim_aliases), constants),
        sim_aliases=sim_aliases,
        folded=folded,
        outputs=list(concrete.graph.outputs),
    )


def _outside(model, model_scope, path_of):
    """op name -> whether the op ran outside the model's scope and every
    layer's (the loss, the train step's own ops); None where the model's
    scope is not found."""
    if model_scope is None:
        return None
    names = _all_layer_names(model)
    prefix = model_scope + "/"

    def outside(op_name):
        if op_name.startswith(prefix):
            return False
        path = path_of(op_name)
        return not path or path[0] not in names

    return outside


def _without(size_of, names):
    """`size_of` with the tensors in `names` counted 0."""

    def size(t):
        return 0 if t.name in names else size_of(t)

    return size
