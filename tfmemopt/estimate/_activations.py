"""The activations term of the estimate: the tensors the traced step keeps
for the backward pass, with what the graph cannot size (layers sized by
rule), the 16-bit weight copies a rescaled trace misses, and activation
checkpointing: traced with the library's recompute (`_checkpointed_trace`)
or, where it cannot be, by rule (segment boundaries plus the largest
segment)."""

from __future__ import annotations

import math

import keras

from tfmemopt.estimate._activation_rules import checkpoint_segments
from tfmemopt.estimate._activation_rules import checkpointed_activations
from tfmemopt.estimate._activation_rules import unknown_layers
from tfmemopt.estimate._settings import Settings
from tfmemopt.estimate._settings import counted


def activation_bytes(model, traced, step, rescale, s: Settings, notes) -> int:
    """Activations kept for the backward pass: traced, unknown-sized
    layers by rule, 16-bit weight copies, checkpointing. Adds notes."""
    activations = step.saved
    unknown_bytes, unknown_notes = unknown_layers(
        traced, step, s.compute, s.micro
    )
    notes += unknown_notes
    if traced is not model or s.policy_in_place:
        how = "rebuilt under"
        if traced is model:
            how = "with its layers set to"
        notes.append(
            f"{s.policy.name}: traced the model {how} the policy "
            "(float32 weights, gradients and optimizer state; the layers "
            "Keras runs in float32 keep float32 activations)"
        )
    elif rescale and s.compute < s.variable:
        # The 16-bit copies of the weights read by the backward pass.
        casts = sum(
            counted(math.prod(v.shape) * s.compute, s)
            for v in model.trainable_weights
            if keras.backend.is_float_dtype(v.dtype)
        )
        activations += casts
        notes.append(
            f"{s.policy.name}: {s.compute}-byte activations, float32 "
            "weights, gradients and optimizer state, 16-bit weight copies"
        )
    if s.checkpoint_traced == "library":
        name = s.checkpointing
        name = "the model's own" if name is None else repr(name)
        notes.append(
            f"checkpointing {name}: {s.checkpoint_segments} "
            "segments; traced with enable_checkpointing applied (each "
            "segment's inputs kept; its activations, recomputed in the "
            "backward pass, counted in temporaries)"
        )
    elif s.checkpointing is not None and s.checkpoint_traced in (
        None,
        "unbuilt",
    ):
        kept, n_segments, _ = checkpointed_activations(
            step, s.checkpointing, traced
        )
        notes.append(
            f"checkpointing {s.checkpointing!r}: {n_segments} segments, "
            "by rule: boundaries plus the largest segment (recomputed) kept"
        )
        activations = activations - step.saved + kept
    return activations + unknown_bytes


def segments(traced, step, s: Settings):
    """The checkpointed segments (lists of layer paths), or None."""
    if s.checkpointing is None:
        return None
    segs, _, _, _ = checkpoint_segments(step, s.checkpointing, traced)
    return segs or None
