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

Grouped-query attention without the repeat: keras-hub's Llama, Mistral,
Qwen2 and Phi-3 repeat the key/value heads to the query heads in `call`
(`ops.repeat(key, num_key_value_groups, axis=2)`, two `[B, S, N, H]`
tensors per layer that the backward pass keeps); while taken over, the
instance's group count reads 1, so the repeat keeps the shared heads, and
the blocks repeat one block of keys at a time (query head `n` reads
key/value head `n // groups`, keras-hub's order). Gemma shares them inside
`_compute_attention`, which the replacement is. A class not listed here is
refused, with the fix, by `enable_long_sequences`.

The mask, never `[B, T, S]`: each of keras-hub's decoder layers builds the
causal mask of its attention, with the padding (and Mistral's window), as
a `[B, T, S]` int32 tensor (`compute_causal_mask`), and Qwen2's and Gemma
2's `_mask_sliding_window` an `[S, S]` one: quadratic in the sequence, in
every layer, and the boolean copy the blocks took was kept for the
backward pass. While taken over, the decoder's mask method
(`_compute_self_attention_mask`, Gemma's `_compute_attention_mask`) hands
the attention the padding alone, `[B, 1, S]`, when it trains (no cache, no
`decoder_attention_mask`), and says so to the replacement (`_Stand`),
which asks the blocks for a causal mask with that key padding and the
family's window, made one block at a time. With a cache (`generate`) or a
mask of the user's, keras-hub's own method runs and its mask is used as
before. `tests/longseq/test_hub_attention.py` compares the two masks.
"""

from __future__ import annotations

import functools
import inspect

import keras
import tensorflow as tf

from tfmemopt.longseq._attention import dot_product_attention
from tfmemopt.longseq._attention_blocks import rows_seen
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
# The attribute holding the key/value group count that keras-hub's `call`
# repeats the shared heads by (set to 1 on the instance while taken over).
GROUPS = {
    "LlamaAttention": "num_key_value_groups",
    "CachedMistralAttention": "_num_key_value_groups",
    "QwenAttention": "num_key_value_groups",
    "Phi3Attention": "num_key_value_groups",
}


# keras-hub's decoder layers around those classes: the method that builds
# the attention mask, and the attribute holding the attention layer.
DECODERS = {
    "LlamaTransformerDecoder": (
        "_compute_self_attention_mask",
        "_self_attention_layer",
    ),
    "MistralTransformerDecoder": (
        "_compute_self_attention_mask",
        "_self_attention_layer",
    ),
    "QwenTransformerDecoder": (
        "_compute_self_attention_mask",
        "_self_attention_layer",
    ),
    "Phi3Decoder": ("_compute_self_attention_mask", "attention"),
    "GemmaDecoderBlock": ("_compute_attention_mask", "attention"),
}
_STAND = "_tfmemopt_mask_stand_in"


# The stand-in's dtype: keras-hub's masks are int32 or bool, never int8, so
# the attention recognises the stand-in from the tensor alone, also where a
# layer's call is replayed without its decoder (checkpointing a list of
# attention layers recomputes each on its own inputs).
STAND_IN_DTYPE = tf.int8


class _Stand:
    """The sliding window of the attention layer whose decoder hands it the
    stand-in (None: none), set when the decoder is taken over."""

    def __init__(self):
        self.window = None


def _window(decoder, attention):
    """The sliding window this layer's attention applies, or None: Mistral's
    is the decoder's `sliding_window` (inside its mask); Qwen2's and Gemma
    2's the attention's `sliding_window_size` where
    `use_sliding_window_attention` (both keep keys `i - window < j <= i`).
    """
    if type(decoder).__name__ == "MistralTransformerDecoder":
        return decoder.sliding_window
    if getattr(attention, "use_sliding_window_attention", False):
        return int(attention.sliding_window_size)
    return None


def _key_padding(x, padding_mask):
    """The stand-in: `[B, 1, S]` of `STAND_IN_DTYPE`, the keys that are
    tokens (keras-hub's `merge_padding_and_attention_mask` without an
    attention mask), all ones without padding."""
    if padding_mask is None:
        padding_mask = getattr(x, "_keras_mask", None)
    if padding_mask is None:
        shape = tf.stack([tf.shape(x)[0], 1, tf.shape(x)[1]])
        return tf.ones(shape, STAND_IN_DTYPE)
    return tf.cast(tf.expand_dims(padding_mask, 1), STAND_IN_DTYPE)


def patch_hub_decoder(state, decoder) -> None:
    """Replaces a keras-hub decoder's mask method on the instance (see the
    module's docstring) when its attention layer is taken over."""
    method, attribute = DECODERS[type(decoder).__name__]
    attention = getattr(decoder, attribute, None)
    stand = getattr(attention, "__dict__", {}).get(_STAND)
    if stand is None:
        return
    original = getattr(decoder, method)
    # keras-hub's own signature (the instance may hold an earlier takeover's
    # replacement, of `*args, **kwargs`), `self` bound to None.
    signature = inspect.signature(getattr(type(decoder), method))
    stand.window = _window(decoder, attention)

    def mask(*args, **kwargs):
        # (sequence, padding, [attention mask,] cache, cache index): the
        # five of the Llama-like decoders (Phi-3 names its cache
        # `attention_cache`), Gemma's four.
        bound = signature.bind(None, *args, **kwargs).arguments
        sequence, padding, *rest = list(bound.values())[1:]
        own_mask = rest[0] if len(rest) == 3 else None
        cache = rest[-2]
        if cache is not None or own_mask is not None:
            return original(*args, **kwargs)
        return _key_padding(sequence, padding)

    replace_on_instance(state, decoder, method, mask)


def is_hub_decoder(layer) -> bool:
    """Whether `layer` is one of keras-hub's decoders around those classes."""
    return type(layer).__name__ in DECODERS


def is_hub_attention(layer) -> bool:
    """Whether `layer` is one of keras-hub's attention classes taken over."""
    name = type(layer).__name__
    reads = READS.get(name, _READS + (GROUPS.get(name, ""),))
    return name in FAMILIES and all(hasattr(layer, a) for a in reads)


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
    stand = _Stand()
    replace_on_instance(state, layer, _STAND, stand)
    if type(layer).__name__ == "CachedGemmaAttention":
        compute_attention = _gemma(layer, state.report, stand)
        replace_on_instance(
            state, layer, "_compute_attention", compute_attention
        )
        return

    sliding = None
    if getattr(layer, "use_sliding_window_attention", False):
        sliding = layer._mask_sliding_window
    scale = float(layer._inv_norm_factor)

    def compute_attention(
        query, key, value, attention_mask=None, cache_update_index=None
    ):
        return _attend(
            stand,
            state.report,
            query,
            key,
            value,
            attention_mask,
            cache_update_index,
            scale=scale,
            sliding=sliding,
        )

    replace_on_instance(state, layer, "_compute_attention", compute_attention)
    # keras-hub's `call` repeats the key/value heads by this count before
    # `_compute_attention`; at 1 it keeps the shared heads, which the blocks
    # read per block.
    replace_on_instance(state, layer, GROUPS[type(layer).__name__], 1)


def _gemma(layer, report, stand):
    if layer.query_head_dim_normalize:
        scale = 1.0 / float(layer.head_dim) ** 0.5
    else:
        scale = 1.0 / float(layer.hidden_dim // layer.num_query_heads) ** 0.5
    cap = layer.logit_soft_cap

    sliding = None
    if layer.use_sliding_window_attention:
        sliding = layer._mask_sliding_window

    def compute_attention(
        q, k, v, attention_mask, training=False, cache_update_index=0
    ):
        # Query head n reads key/value head n // groups, as Gemma's
        # (kv, group) reshape of the queries does: the blocks' order.
        # The query scaled before the scores, as Gemma does (the same
        # rounding); the blocks then scale by 1.
        return _attend(
            stand,
            report,
            q * tf.cast(scale, q.dtype),
            k,
            v,
            attention_mask,
            cache_update_index,
            scale=1.0,
            soft_cap=None if cap is None else float(cap),
            sliding=sliding,
        )

    return compute_attention


def _attend(
    stand,
    report,
    query,
    key,
    value,
    attention_mask,
    cache_update_index,
    *,
    scale,
    soft_cap=None,
    sliding=None,
):
    """The blocks, with the mask keras-hub's `_compute_attention` applies:
    the decoder's stand-in (the key padding `[B, 1, S]` of
    `STAND_IN_DTYPE`; causal and the window made per block), or its whole
    mask (with a cache) through the layer's `_mask_sliding_window`. The
    block size is the report's when the step is traced. Rows whose every
    key is masked are 0, as keras-hub's `keras.layers.Softmax` makes them
    (Keras 3.15; where Keras gives the uniform softmax instead, the blocks
    do too)."""
    window = stand.window
    if attention_mask is not None and attention_mask.dtype == STAND_IN_DTYPE:
        keys = tf.cast(attention_mask, tf.bool)  # [B, 1, S]
        mask, causal = keys[:, None], True
        seen = rows_seen(keys[:, 0], tf.shape(keys)[-1], window)  # T = S
    else:
        mask, causal, window, seen = attention_mask, False, None, None
        if mask is not None:
            if sliding is not None:
                # the index as keras-hub passes it (a tensor in generate)
                index = 0 if cache_update_index is None else cache_update_index
                mask = sliding(mask, cache_update_index=index)
            mask = tf.cast(mask, tf.bool)[:, None]  # [B, 1, T, S]
            seen = tf.reduce_any(mask[:, 0], axis=-1)
    out = dot_product_attention(
        query,
        key,
        value,
        mask=mask,
        is_causal=causal,
        window=window,
        scale=scale,
        block_elements=report.block_elements,
        soft_cap=soft_cap,
    )
    if seen is None or not _softmax_zeroes_masked_rows():
        return out
    return tf.where(seen[:, :, None, None], out, tf.zeros_like(out))


@functools.cache
def _softmax_zeroes_masked_rows() -> bool:
    """Whether `keras.layers.Softmax` gives 0 for a row whose every entry
    is masked (Keras 3.15 does; keras-hub's attention layers use it)."""
    with tf.init_scope():
        out = keras.layers.Softmax()(
            tf.zeros((1, 2)), mask=tf.constant([[False, False]])
        )
        return float(tf.reduce_max(tf.abs(out))) == 0.0
