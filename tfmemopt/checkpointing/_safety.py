"""Which layers can be recomputed without changing what training computes."""

from __future__ import annotations

import keras

from tfmemopt._compat import sublayers


def why_not_replayable(layer: keras.layers.Layer) -> str | None:
    """The reason `layer` cannot be recomputed safely, or `None`.

    A stateful RNN carries its state across batches in variables that it
    assigns during the call; the recompute would start from the state the
    forward pass left behind, so its gradient would belong to a different
    sequence. The same holds for any layer that declares `stateful=True`.
    """
    for sub in _walk(layer):
        if getattr(sub, "stateful", False) is True:
            return (
                f"layer {sub.name!r} ({type(sub).__name__}) is stateful: it "
                "carries state across calls, and a recompute would start "
                "from the state the forward pass left behind"
            )
    return None


def check_replayable(layer: keras.layers.Layer) -> None:
    """Raises ValueError when `layer` cannot be recomputed safely."""
    reason = why_not_replayable(layer)
    if reason is not None:
        raise ValueError(
            f"Cannot checkpoint {layer.name!r}: {reason}. Leave it out of "
            "the checkpointed segment (pass a policy that excludes it), or "
            "build it with `stateful=False`."
        )


def _walk(layer):
    yield layer
    yield from sublayers(layer)
