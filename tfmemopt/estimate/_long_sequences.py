"""`chunked_loss` and `attention="chunked"` in a step's memory.

The estimate traces the step as `tfmemopt.Model` runs it: with the model's
long-sequence options on (`enable_long_sequences`, on the traced model for
the trace and undone after, when the options are asked of a model that
does not have them), every taken-over `MultiHeadAttention` computes
attention in query blocks inside a custom gradient, and the loss is
computed from the head's input in chunks (`Forward.head_of`), so the logits are
never formed. What the graph keeps is then what those functions keep.

Two terms of the breakdown (`MemoryEstimate.terms`) name what the options
act on, read from the traced step's kept tensors per layer: `logits`,
what the language-model head and the loss keep for the backward pass
(the logits and their softmax gradient: `tokens x vocabulary` float32
each), and `attention_scores`, what the `MultiHeadAttention` layers keep
(their scores, softmax and masks, `batch x heads x T x S` per layer).
They are parts of `activations`, not added to the total again.
"""

from __future__ import annotations

import contextlib

import keras

from tfmemopt._compat import sublayers
from tfmemopt.accumulation import Model
from tfmemopt.estimate._saved_activations import LOSS
from tfmemopt.longseq import check_options
from tfmemopt.longseq import disable_long_sequences
from tfmemopt.longseq import enable_long_sequences
from tfmemopt.longseq import head_candidates
from tfmemopt.longseq import is_hub_attention
from tfmemopt.longseq import report_of


def resolve(model, chunked_loss, attention) -> tuple[bool, str | None]:
    """The options estimated: `None` reads the model's own (a
    `tfmemopt.Model`'s `chunked_loss` / `attention`); `attention=False`
    turns the model's own off."""
    own = getattr(model, "_long_sequences", (False, None))
    if not isinstance(model, Model):
        own = (False, None)
    if chunked_loss is None:
        chunked_loss = bool(own[0])
    if attention is None:
        attention = own[1]
    elif attention is False:
        attention = None
    check_options(chunked_loss, attention)
    return chunked_loss, attention


@contextlib.contextmanager
def options_for_trace(model, traced, chunked_loss, attention):
    """Yields the owner whose options the trace uses (or None).

    A `tfmemopt.Model` whose own options are the ones asked is its own
    owner (its layers are taken over already). Otherwise the options are
    enabled on the traced model for the trace and undone after.
    """
    if not (chunked_loss or attention):
        yield None
        return
    own = report_of(model)
    if own is not None:
        if (own.chunked_loss, own.attention) != (chunked_loss, attention):
            raise ValueError(
                "estimate_memory estimates a tfmemopt.Model with its own "
                f"long-sequence options (chunked_loss={own.chunked_loss}, "
                f"attention={own.attention!r}). Received: chunked_loss="
                f"{chunked_loss}, attention={attention!r}. Fix: pass None "
                "for both (the model's own), or estimate the model it wraps "
                "with the options you want."
            )
        yield model
        return
    enable_long_sequences(
        traced, chunked_loss=chunked_loss, attention=attention, owner=traced
    )
    try:
        yield traced
    finally:
        disable_long_sequences(traced)


def terms(traced, step) -> dict:
    """`{"logits": bytes, "attention_scores": bytes}` kept for the
    backward pass by the head and the loss, and by the attention layers
    (from `step.saved_by_layer`)."""
    attention = {
        layer.name
        for layer in sublayers(traced)
        if isinstance(layer, keras.layers.MultiHeadAttention)
        or is_hub_attention(layer)
    }
    heads = _heads(traced)
    layers = {layer.name for layer in sublayers(traced, include_self=True)}
    out = {"logits": 0, "attention_scores": 0}
    for path, n in step.saved_by_layer:
        names = set(path)
        if names & attention:
            out["attention_scores"] += n
        elif path == LOSS or names & heads:
            out["logits"] += n  # the loss (ops outside layers), the head
        elif not step.loss_apart and (not path or path[0] not in layers):
            out["logits"] += n  # the model's scope unknown: the loss
    return out


def _heads(traced) -> set:
    """The names of the head: the candidates (a Dense, a
    ReversibleEmbedding) that make the model's outputs, inside nested
    models and through layers of one input after them (a Softmax, an
    activation, `keras.ops.tanh`); in a subclassed model (no outputs to
    follow), its last candidate in the order its layers were set."""
    try:
        candidates = head_candidates(traced)
    except (AttributeError, TypeError, ValueError):
        return set()
    names = {layer.name for layer in candidates}
    try:
        outputs = keras.tree.flatten(traced.outputs)
    except (AttributeError, ValueError, TypeError):
        outputs = []
    if not outputs:
        return {candidates[-1].name} if candidates else set()
    return {layer.name for layer in _producers(outputs, names)}


def _producers(tensors, names, hops=4) -> list:
    """The candidate layers (by name in `names`) that make `tensors`:
    into a nested model's outputs, and back through up to `hops` layers of
    one input."""
    found = []
    for tensor in tensors:
        for _ in range(hops):
            history = getattr(tensor, "_keras_history", None)
            layer = getattr(history, "operation", None)
            if layer is None:
                break
            if layer.name in names:
                found.append(layer)
                break
            if isinstance(layer, keras.Model):
                try:
                    inner = keras.tree.flatten(layer.outputs)
                except (AttributeError, ValueError, TypeError):
                    break
                found += _producers(inner, names, hops)
                break
            nodes = getattr(layer, "_inbound_nodes", [])
            if history.node_index >= len(nodes):
                break
            inputs = nodes[history.node_index].input_tensors
            if len(inputs) != 1:
                break
            tensor = inputs[0]
    return found
