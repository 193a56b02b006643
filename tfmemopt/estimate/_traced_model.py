"""The model whose step the estimate traces, and the trace.

Under another dtype policy the model is rebuilt under it, or has its
layers' policies set to it for the trace, or, failing both, its float32
activations are rescaled; `tfmemopt.Model.wrap(inner)` is traced as
`inner`; the long-sequence options are on for the trace; the optimizer's
update consumes each gradient as the step makes it (`consumers`).
"""

from __future__ import annotations

import keras

from tfmemopt._compat import sublayers
from tfmemopt.accumulation import Model
from tfmemopt.estimate import _long_sequences as long_sequences
from tfmemopt.estimate._checkpointed_trace import UndoFailed
from tfmemopt.estimate._checkpointed_trace import library_checkpointing
from tfmemopt.estimate._checkpointed_trace import own_report
from tfmemopt.estimate._consumers import consumers
from tfmemopt.estimate._model_state import weight_bytes
from tfmemopt.estimate._optimizer_state import _itemsize
from tfmemopt.estimate._settings import Settings
from tfmemopt.estimate._settings import counted
from tfmemopt.estimate._step_graph import trace_step
from tfmemopt.estimate._update import decayed_early
from tfmemopt.precision import rebuilt_under


def trace_model(
    model, s: Settings, notes, input_shape=None, sequence_length=None
):
    """`(traced model, its step graph, whether activations are rescaled)`.

    Another policy: trace the model rebuilt under it (Keras keeps some
    activations float32); a model that cannot be rebuilt (layers without a
    config, subclassed models) is traced with its layers' policies set to
    it for the trace and put back, when the policy keeps the variables'
    dtype (float32 -> mixed_*); else its float32 activations are scaled. A
    `tfmemopt.Model.wrap(inner)` is traced as `inner` (the same weights and
    graph; the policy rebuild and checkpointing segments need its layers).
    With `checkpointing`, the library's recompute is traced where it can
    be (`_checkpointed_trace`); adds notes.
    """
    outer = traced = model
    # The loss the user compiled: a model rebuilt under another policy,
    # and the model a `Model.wrap` holds, are not compiled.
    loss = getattr(outer, "loss", None)
    inner = getattr(model, "inner", None)
    if isinstance(model, Model) and isinstance(inner, keras.Model):
        traced = model = inner
        if loss is None:
            loss = getattr(inner, "loss", None)
    swapped = []
    if s.policy.name != model.dtype_policy.name:
        traced = rebuilt_under(model, s.policy.name) or model
        if traced is model and (
            s.policy.variable_dtype == model.dtype_policy.variable_dtype
        ):
            swapped = _swap_policies(model, s.policy)

    own = own_report(model) if traced is not model else None
    trace = _StepTracer(
        outer, traced, loss, own, s, notes, input_shape, sequence_length
    ).trace

    if swapped:
        try:
            step = trace(False)
            s.policy_in_place = True
            return traced, step, False
        except Exception:  # noqa: BLE001 - a layer not written for 16 bits
            pass  # (e.g. adds a float32 constant): the scaling rule
        finally:
            for layer, policy in swapped:
                layer.dtype_policy = policy
    rescale = s.compute != _itemsize(model.compute_dtype) and traced is model
    return traced, trace(rescale), rescale


def _swap_policies(model, policy):
    """Sets `policy` on every layer of `model` under the model's own policy
    (a layer with a policy of its own keeps it); returns `[(layer, old)]`."""
    old = model.dtype_policy.name
    swapped = []
    for layer in sublayers(model, include_self=True):
        current = layer.dtype_policy
        if current.name == old and current.quantization_mode is None:
            swapped.append((layer, current))
            layer.dtype_policy = policy
    return swapped


class _StepTracer:
    """Traces one training step of `traced` (the model, or its rebuild
    under another policy) as the estimate counts it: with the library's
    checkpointing where it can be traced, with the long-sequence options,
    with the update's and the weight decay's consumers; adds notes."""

    def __init__(
        self, outer, traced, loss, own, s, notes, input_shape, sequence_length
    ):
        self.outer, self.traced, self.loss, self.own = outer, traced, loss, own
        self.s, self.notes = s, notes
        self.input_shape, self.sequence_length = input_shape, sequence_length

    def trace(self, rescale):
        s = self.s
        pending = []  # notes kept only if this trace is the one returned
        step = self._checkpointed(rescale, pending)
        if s.checkpoint_traced == "unbuilt" and self.traced.built:
            s.checkpoint_traced = None  # built by that trace: again
            pending = []
            step = self._checkpointed(rescale, pending)
        self.notes.extend(pending)
        return step

    def _checkpointed(self, rescale, pending):
        s = self.s
        s.checkpoint_traced, s.checkpoint_segments = None, 0
        try:
            with library_checkpointing(self.traced, s, pending, self.own):
                return self._plain(rescale)
        except UndoFailed:
            raise
        except Exception as e:  # noqa: BLE001 - estimated by rule instead
            if s.checkpoint_traced != "library":
                raise
            s.checkpoint_traced, s.checkpoint_segments = None, 0
            pending[:] = [
                f"checkpointing {s.checkpointing!r}: the checkpointed step "
                f"could not be traced ({type(e).__name__}: {e}); estimated "
                "by rule"
            ]
            return self._plain(rescale)

    def _plain(self, rescale):
        s = self.s
        with long_sequences.options_for_trace(
            self.outer, self.traced, s.chunked_loss, s.attention
        ) as owner:
            return self._trace_with(rescale, owner)

    def _trace_with(self, rescale, owner):
        s = self.s

        def nbytes(v):
            return counted(weight_bytes(v, s), s)

        accumulating = s.accumulation_steps > 1
        return trace_step(
            self.traced,
            s.micro,
            owner=owner,
            loss=self.loss,
            activation_itemsize=s.compute if rescale else None,
            input_shape=self.input_shape,
            sequence_length=self.sequence_length,
            min_counted_bytes=s.min_counted_bytes,
            update=consumers(
                s.optimizer,
                accumulating,
                s.replicas,
                nbytes,
                sharded=s.shard_parameters,
            ),
            decay=decayed_early(
                s.optimizer,
                accumulating,
                s.replicas,
                nbytes,
                sharded=s.shard_parameters,
            ),
            # Under shard_parameters the micro-batches are traced one
            # after another, not run in a while loop (docs/sharding.md).
            in_loop=accumulating and not s.shard_parameters,
            metrics_of=self.outer,
            notes=self.notes,
        )
