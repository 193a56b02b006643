"""The simulations of a traced step (`_step_graph._prepare`'s view): as
the executor runs it, as Grappler's static estimate sees it, with the
gradient sums Grappler rewrites, and with each gradient consumed as it is
made; and the scratch an einsum's kernel holds while it runs."""

from __future__ import annotations

import functools
from typing import NamedTuple

import tensorflow as tf

from tfmemopt.estimate._kernels import _einsum_copies
from tfmemopt.estimate._kernels import sums_rewritten
from tfmemopt.estimate._simulate import _simulate
from tfmemopt.estimate._updating import _alive_bytes
from tfmemopt.estimate._updating import _decayed_reads
from tfmemopt.estimate._updating import _simulate_updating


class _Peaks(NamedTuple):
    """What the simulations of a step give (`_simulated`)."""

    peak: int
    events: list
    updating_peak: int | None
    sums: list  # the sums (AddN) with an input alive at the peak
    grappler_peak: int
    decay_copies: int


def _simulated(model, view, min_counted_bytes, update, decay, in_loop):
    """The step simulated as the executor runs it (`_Peaks`): as
    Grappler's estimate sees it, with the gradient sums Grappler rewrites,
    and with each gradient consumed as it is made (`update`)."""
    size_of, run, outputs = view.size_of, view.run, view.outputs

    def scratch(op):
        return _scratch(op, size_of, min_counted_bytes)

    # Grappler's own estimate (`GraphMemory::InferStatically`) counts every
    # tensor it can size (a TensorList is a scalar of unknown size to it)
    # and forwards no input buffer: its peak decides whether its memory
    # optimizer rewrites the gradient sums. Only the CPU statistics' view
    # (`min_counted_bytes`) models that rewrite, and not in a loop's body
    # (`in_loop`): 0 elsewhere.
    grappler_peak = 0
    if min_counted_bytes and not in_loop:
        grappler_peak = _simulate(
            run,
            outputs,
            lambda t: 0 if t.dtype == tf.variant else view.whole_size(t),
            {**view.whole_aliases, **view.same},
            in_place=False,
        )

    held = {}
    if decay is not None:
        variables = model.trainable_variables
        held = _decayed_reads(view.concrete, run, variables, decay(variables))
    events, alive = [], set()
    simulate = functools.partial(
        _simulate,
        run,
        outputs,
        view.sim_size,
        view.sim_aliases,
        scratch,
        spans=view.spans,
        held=held,
    )
    peak = simulate(
        events=None if update is not None else events, at_peak=alive
    )
    sums = _sums_with_input_in(view.ops, alive)
    decay_copies = _alive_bytes(held, alive)
    # The sums Grappler rewrote into accumulations: each input is added,
    # and freed, as soon as it and the sum's buffer are there.
    accumulated = ()
    if sums and sums_rewritten(grappler_peak):
        accumulated = {op.name for op in sums}
        events = []
        peak = simulate(events=events, accumulated=accumulated)
    updating_peak = None
    if update is not None:
        events = []
        updating_peak = _simulate_updating(
            model,
            view.concrete,
            run,
            view.sim_size,
            view.sim_aliases,
            scratch,
            update,
            events,
            accumulated=accumulated,
            spans=view.spans,
            held=held,
            at_peak=alive,
        )
        decay_copies = _alive_bytes(held, alive)
    return _Peaks(
        peak=peak,
        events=events,
        updating_peak=updating_peak,
        sums=sums,
        grappler_peak=grappler_peak,
        decay_copies=decay_copies,
    )


def _sums_with_input_in(ops, alive) -> list:
    """The sums of 3 or more gradients (AddN) with an input in `alive`."""
    return [
        op
        for op in ops
        if op.type == "AddN"
        and len(op.inputs) > 2
        and any(t.name in alive for t in op.inputs)
    ]


def _scratch(op, size_of, floor=0) -> int:
    """Bytes an op allocates inside its kernel, freed when it returns."""
    if op.type != "Einsum" or len(op.inputs) != 2:
        return 0
    try:
        equation = op.get_attr("equation")
    except ValueError:
        return 0
    if isinstance(equation, bytes):
        equation = equation.decode()
    copies = _einsum_copies(equation)
    if copies is None:
        return 0
    copied, out_copied = copies
    sizes = [size_of(t) or 0 for t, c in zip(op.inputs, copied) if c] + (
        [size_of(op.outputs[0]) or 0] if out_copied else []
    )
    return sum(n for n in sizes if n >= floor)
