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

Gemma 1 and 2 (`CachedGemmaAttention`) do it all inside
`_compute_attention(q, k, v, attention_mask, training, cache_update_index)`:
the query scale (`1 / sqrt(head_dim)`, or of `hidden_dim / heads` when
`query_head_dim_normalize=False`), Gemma 2's attention-logit soft cap
(`cap * tanh(s / cap)` before the mask: `soft_cap` of the blocks) and
sliding window (`_mask_sliding_window`), with the key/value heads shared
by groups of query heads; the replacement does the same. Its dropout acts
on the probabilities, which the blocks cannot replay: refused.

The keys and values are repeated to every query head (by keras-hub before
the call, here for Gemma): linear in the sequence, not quadratic. A class
not listed here is refused, with the fix, by `enable_long_sequences`.
"""

from __future__ import annotations

import tensorflow as tf

from tfmemopt.longseq._attention import dot_product_attention
from tfmemopt.longseq._head import replace_on_instance

# keras-hub's attention classes taken over, with what the replacement reads
# (tests/longseq/test_hub_attention.py fails when keras-hub renames any).
FAMILIES = {
    "LlamaAttention": "Llama (Llama 2 and 3)",
    "CachedMistralAttention": "Mistral",
    "QwenAttention": "Qwen2",
    "Phi3Attention": "Phi-3",
    "CachedGemmaAttention": "Gemma 1 and 2",
}
READS = {
    "CachedGemmaAttention": (
        "_compute_attention",
        "query_head_dim_normalize",
        "head_dim",
        "hidden_dim",
        "num_query_heads",
        "num_key_value_heads",
        "logit_soft_cap",
        "use_sliding_window_attention",
        "_mask_sliding_window",
        "dropout",
    ),
}
_READS = ("_compute_attention", "_inv_norm_factor")


def is_hub_attention(layer) -> bool:
    """Whether `layer` is one of keras-hub's attention classes taken over."""
    name = type(layer).__name__
    return name in FAMILIES and all(
        hasattr(layer, a) for a in READS.get(name, _READS)
    )


def check_hub_attention(layer, path) -> None:
    """Refuses what the blocks cannot replay: Gemma's dropout acts on the
    attention probabilities."""
    if type(layer).__name__ == "CachedGemmaAttention" and layer.dropout > 0:
        raise ValueError(
            f'attention="chunked" cannot replay attention dropout: the '
            f"layer {path!r} has dropout={layer.dropout}. Build the "
            "backbone with dropout=0.0, or construct the model without "
            'attention="chunked".'
        )


def patch_hub_attention(state, layer, path) -> None:
    """Replaces `layer._compute_attention` on the instance (undone by
    `disable_long_sequences` through `state.patched`)."""
    block = state.report.block_elements
    if type(layer).__name__ == "CachedGemmaAttention":
        compute_attention = _gemma(layer, block)
        replace_on_instance(
            state, layer, "_compute_attention", compute_attention
        )
        return

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

    replace_on_instance(state, layer, "_compute_attention", compute_attention)


def _gemma(layer, block):
    if layer.query_head_dim_normalize:
        scale = 1.0 / float(layer.head_dim) ** 0.5
    else:
        scale = 1.0 / float(layer.hidden_dim // layer.num_query_heads) ** 0.5
    groups = layer.num_query_heads // layer.num_key_value_heads
    cap = layer.logit_soft_cap

    def compute_attention(
        q, k, v, attention_mask, training=False, cache_update_index=0
    ):
        mask = attention_mask
        if layer.use_sliding_window_attention and mask is not None:
            mask = layer._mask_sliding_window(
                mask, cache_update_index=cache_update_index
            )
        if mask is not None:
            mask = tf.cast(mask, tf.bool)[:, None]
        # Query head n reads key/value head n // groups, as Gemma's
        # (kv, group) reshape of the queries does.
        k = tf.repeat(k, groups, axis=2)
        v = tf.repeat(v, groups, axis=2)
        # The query scaled before the scores, as Gemma does (the same
        # rounding); the blocks then scale by 1.
        q = q * tf.cast(scale, q.dtype)
        return dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            scale=1.0,
            block_elements=block,
            soft_cap=None if cap is None else float(cap),
        )

    return compute_attention
