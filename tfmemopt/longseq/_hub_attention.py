"""Chunked attention for keras-hub's open-LLM attention layers.

keras-hub computes the attention of Llama, Mistral, Qwen2 and Phi-3 in
layer classes of its own, not `keras.layers.MultiHeadAttention`. Each
projects the queries and keys, applies its rotary embedding (each
family's variant and scaling), repeats the key/value heads to the query
heads (grouped-query attention) and then calls one method,
`_compute_attention(query, key, value, attention_mask)`: query, key and
value `[batch, length, heads, head_dim]`, the mask `[batch, T, S]` (causal,
padding and, for Mistral, the sliding window, made by the decoder layer),
scores scaled by `_inv_norm_factor` and softmaxed under the mask, dropout
on the output after it. That method is the one replaced, on the
instance, by `dot_product_attention` in query and key blocks; everything
around it (the projections, the rotary embedding, the cache and
`cache_update_index` of `generate`) runs as keras-hub wrote it. Qwen2
applies its sliding window inside `_compute_attention`
(`_mask_sliding_window`); the replacement applies it too.

Not yet: Gemma (its query normalisation, attention-logit soft cap and
dropout on the probabilities live inside that method in another form),
and the keys and values are still repeated to every query head by
keras-hub before the call (linear in the sequence, not quadratic). A
class not listed here is refused, with the fix, by `enable_long_sequences`.
"""

from __future__ import annotations

import tensorflow as tf

from tfmemopt.longseq._attention import dot_product_attention

# keras-hub's attention classes taken over, with what the replacement reads
# (tests/longseq/test_hub_attention.py fails when keras-hub renames any).
FAMILIES = {
    "LlamaAttention": "Llama (Llama 2 and 3)",
    "CachedMistralAttention": "Mistral",
    "QwenAttention": "Qwen2",
    "Phi3Attention": "Phi-3",
}
READS = ("_compute_attention", "_inv_norm_factor")


def is_hub_attention(layer) -> bool:
    """Whether `layer` is one of keras-hub's attention classes taken over."""
    return type(layer).__name__ in FAMILIES and all(
        hasattr(layer, name) for name in READS
    )


def patch_hub_attention(state, layer, path) -> None:
    """Replaces `layer._compute_attention` on the instance (undone by
    `disable_long_sequences` through `state.patched`)."""
    block = state.report.block_elements

    def compute_attention(
        query, key, value, attention_mask=None, cache_update_index=None
    ):
        mask = attention_mask
        if getattr(layer, "use_sliding_window_attention", False):
            mask = layer._mask_sliding_window(
                mask, cache_update_index=cache_update_index or 0
            )
        if mask is not None:
            mask = tf.cast(mask, tf.bool)[:, None]  # [B, 1, T, S]
        return dot_product_attention(
            query,
            key,
            value,
            mask=mask,
            scale=float(layer._inv_norm_factor),
            block_elements=block,
        )

    object.__setattr__(layer, "_compute_attention", compute_attention)
    state.patched.append((layer, "_compute_attention"))
