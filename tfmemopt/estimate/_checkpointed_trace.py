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

A model `enable_checkpointing` refuses (`"blocks"` on plain layers,
`"auto"` on a subclassed model of plain layers) is estimated without
checkpointing: the policy cannot be applied, and `plan` must not choose
it. The rule stays where the recompute is not traced: an int policy
(layers per segment, which `enable_checkpointing` has no equivalent of),
`shard_parameters` (whose gathered weights are modelled on the rule's
segments, `_gathered_liveness`) and a step that fails to trace
checkpointed. A model with checkpointing already enabled (on itself or on
a model inside it) is traced as it is; a copy rebuilt under another
policy gets the same policy applied.
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


class UndoFailed(RuntimeError):
    """`disable_checkpointing` failed after the trace: not to be hidden."""


def own_report(model):
    """The checkpointing the user enabled on `model` or on a model inside
    it, or `None`."""
    for m in sublayers(model, include_self=True):
        if isinstance(m, keras.Model) and checkpointing_report(m):
            return checkpointing_report(m)
    return None


def _own_policy(report):
    """A policy that makes `report`'s segments again on a rebuilt copy."""
    if report.policy in ("auto", "blocks"):
        return report.policy
    return [name for segment in report.segments for name in segment]


@contextlib.contextmanager
def library_checkpointing(model, s, notes, own=None):
    """Within: `model` runs checkpointed as `s.checkpointing` asks.

    `own`: the report of the checkpointing the user enabled on the model
    `model` was rebuilt from (`own_report`), if any.
    Sets `s.checkpoint_traced` to `"library"` (enabled here, undone on
    exit), `"model"` (the model's own, left as it is), `"refused"`
    (`enable_checkpointing` refuses the model: no saving) or `"unbuilt"`
    (retry once the trace has built it); leaves it `None` where the rule
    applies. Adds its notes once the body has run.
    """
    here = own_report(model)
    if here is not None:
        s.checkpoint_traced = "model"
        yield
        if s.checkpointing is not None:
            notes.append(
                f"checkpointing: the model's own (policy {here.policy!r}, "
                f"{len(here.segments)} segments) traced; checkpointing="
                f"{s.checkpointing!r} not applied on top"
            )
        return
    policy = s.checkpointing
    if own is not None:  # a copy of a checkpointed model
        policy = _own_policy(own)
    elif policy not in ("auto", "blocks") or s.shard_parameters:
        yield
        return
    if not model.built:  # the trace builds it; then again, checkpointed
        s.checkpoint_traced = "unbuilt"
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
            report = enable_checkpointing(model, policy)
    except Exception as e:  # noqa: BLE001 - the policy cannot be applied
        _undo(model, kept)
        s.checkpoint_traced = "refused"
        yield
        notes.append(
            f"checkpointing {s.checkpointing!r}: enable_checkpointing "
            f"refuses this model ({type(e).__name__}: {e}); estimated "
            "without checkpointing"
        )
        return
    s.checkpoint_traced = "library"
    s.checkpoint_segments = len(report.segments)
    try:
        yield
    finally:
        _undo(model, kept)
    notes.extend(str(w.message) for w in caught)


def _undo(model, kept):
    """Disables the checkpointing enabled here and puts the traced
    functions back, also when disabling fails (then `UndoFailed`)."""
    try:
        disable_checkpointing(model)
    except Exception as e:  # noqa: BLE001 - re-raised, not hidden
        raise UndoFailed(
            f"tfmemopt could not undo the checkpointing it enabled on "
            f"model {model.name!r} for the estimate ({type(e).__name__}: "
            f"{e}); call tfmemopt.disable_checkpointing(model)."
        ) from e
    finally:
        for m, attrs in kept:
            for a, value in attrs:
                if value is not None:
                    setattr(m, a, value)
