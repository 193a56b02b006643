"""Checkpointing in the estimate: the library's own recompute, traced.

With `checkpointing="auto"` or `"blocks"` the step is traced with
`enable_checkpointing(model, policy)` applied for the trace and undone
after, so the simulated step runs what the checkpointed step runs: the
forward pass keeps each segment's inputs, and the backward pass recomputes
one segment at a time, after that segment's incoming gradient, then runs
its gradient. A segment's recomputed activations are temporaries of the
backward pass, alive where that segment's backward peaks.

The rule it replaces (`_activation_rules.checkpointed_activations`: the
plain step's kept tensors cut at the segments, plus the largest segment)
kept the plain step's temporaries, taken at the turn from forward to
backward; a checkpointed step peaks inside one segment's backward, right
after its recompute. Measured on the 24 checkpointed cases of the
estimator's sets (docs/estimator.md): the Perceiver-like model -32.6% by
the rule, -2.3% traced; the TCN +27.0% and -7.4%.

The rule stays where the library's recompute cannot be traced: an int
policy (layers per segment, which `enable_checkpointing` has no equivalent
of), a model `enable_checkpointing` refuses, and `shard_parameters`
(whose gathered weights are modelled on the rule's segments,
`_gathered_liveness`). A model with checkpointing already enabled is
traced as it is.
"""

from __future__ import annotations

import contextlib
import warnings

import keras

from tfmemopt._compat import sublayers
from tfmemopt.checkpointing import checkpointing_report
from tfmemopt.checkpointing import disable_checkpointing
from tfmemopt.checkpointing import enable_checkpointing

_TRACED = ("train_function", "test_function", "predict_function")


@contextlib.contextmanager
def library_checkpointing(model, s, notes):
    """Within: `model` runs checkpointed as `s.checkpointing` asks.

    Sets `s.checkpoint_traced` to `"library"` (enabled here, undone on
    exit) or `"model"` (the model's own, left as it is); leaves it `None`
    where the rule applies. Adds a note on why, where it does not trace.
    """
    own = checkpointing_report(model)
    if own is not None:
        s.checkpoint_traced = "model"
        if s.checkpointing is not None:
            notes.append(
                f"checkpointing: the model's own (policy {own.policy!r}, "
                f"{len(own.segments)} segments) traced; checkpointing="
                f"{s.checkpointing!r} not applied on top"
            )
        yield
        return
    if s.checkpointing not in ("auto", "blocks") or s.shard_parameters:
        yield
        return
    # Enabling and disabling drop the models' traced functions: kept
    # here, so the next `fit` does not retrace because of an estimate.
    kept = [
        (m, [(a, getattr(m, a, None)) for a in _TRACED])
        for m in sublayers(model, include_self=True)
        if isinstance(m, keras.Model)
    ]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = enable_checkpointing(model, s.checkpointing)
    except (ValueError, TypeError) as e:
        notes.append(
            f"checkpointing {s.checkpointing!r}: enable_checkpointing "
            f"refuses this model ({e}); estimated by rule"
        )
        yield
        return
    notes.extend(str(w.message) for w in caught)
    s.checkpoint_traced = "library"
    s.checkpoint_segments = len(report.segments)
    try:
        yield
    finally:
        disable_checkpointing(model)
        for m, attrs in kept:
            for a, value in attrs:
                if value is not None:
                    setattr(m, a, value)
