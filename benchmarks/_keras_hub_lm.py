"""A keras-hub backbone with its language-model head, as the held-out sets
build it (issue #23): token ids and a padding mask of `length` tokens in,
logits through the tied token embedding (`reverse=True`) at every
position out, in float32 (a `mixed_bfloat16` model's loss reads float32
logits)."""

from __future__ import annotations


def tied_lm(backbone, length=128):
    """(inputs, logits, sparse labels) of `backbone` with its tied head."""
    import keras
    from keras import layers

    inputs = {
        kind: keras.Input((length,), dtype="int32", name=kind)
        for kind in ("token_ids", "padding_mask")
    }
    h = backbone(inputs)
    logits = backbone.token_embedding(h, reverse=True)
    return inputs, layers.Activation("linear", dtype="float32")(logits), True
