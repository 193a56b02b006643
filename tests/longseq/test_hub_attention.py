"""Chunked attention on keras-hub's open-LLM families (#48): Llama,
Mistral, Qwen2, Phi-3, Gemma and Gemma 2 from tiny random configs, each
built from its keras-hub class. One update with both options equals plain
Keras within the floor measured in the same run (the batch with its rows
swapped), with padding and `ignore_class`; the logged loss too;
`generate` after training gives the unwrapped model's tokens; a block of
a few keys gives the whole-row block's output."""

from __future__ import annotations

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfmemopt
from tests.longseq.test_gpt2 import _diff
from tests.longseq.test_gpt2 import _update
from tfmemopt.longseq import _hub_attention

keras_hub = pytest.importorskip("keras_hub")

V, T, B = 97, 24, 3
# (backbone, task, extra backbone arguments): 4 query heads sharing 2
# key-value heads; Qwen2 with its own sliding window (8 tokens).
FAMILIES = {
    "llama": ("LlamaBackbone", "LlamaCausalLM", {}),
    "mistral": ("MistralBackbone", "MistralCausalLM", {"sliding_window": 8}),
    "qwen": (
        "QwenBackbone",
        "QwenCausalLM",
        {"use_sliding_window_attention": True, "sliding_window_size": 8},
    ),
    "phi3": ("Phi3Backbone", "Phi3CausalLM", {}),
    "gemma": ("GemmaBackbone", "GemmaCausalLM", {"head_dim": 8}),
    # Gemma 2's attention: a soft cap small enough to act on these scores,
    # a sliding window, the query scaled by hidden_dim / heads.
    "gemma2": (
        "GemmaBackbone",
        "GemmaCausalLM",
        {
            "head_dim": 8,
            "query_head_dim_normalize": False,
            "use_post_ffw_norm": True,
            "use_post_attention_norm": True,
            "attention_logit_soft_cap": 0.5,
            "use_sliding_window_attention": True,
            "sliding_window_size": 8,
        },
    ),
}


def _lm(family):
    backbone, task, extra = FAMILIES[family]
    keras.utils.set_random_seed(1)
    made = getattr(keras_hub.models, backbone)(
        vocabulary_size=V,
        num_layers=1,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=48,
        **extra,
    )
    return getattr(keras_hub.models, task)(backbone=made, preprocessor=None)


def _data():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, V, size=(B, T))
    padding = np.ones((B, T), bool)
    padding[1, -5:] = False
    x = {"token_ids": tokens, "padding_mask": padding}
    y = np.roll(tokens, -1, axis=1)
    y[0, :3] = 5  # ignore_class
    sw = padding.astype("float32")
    return x, y, sw


def _compile(model):
    model.compile(
        keras.optimizers.SGD(0.5),
        keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=5
        ),
        weighted_metrics=[],
    )
    return model


# Llama (and generate), Qwen2 (its own window), Gemma 2 (soft cap, query
# scale, key/value heads repeated here) in `make test`; Mistral, Phi-3
# and Gemma 1 run the same path as one of those: `make test-full`.
_SAME_PATH = pytest.mark.extended(
    reason="the same replacement as Llama's (Mistral, Phi-3) or Gemma 2's "
    "(Gemma 1), which run in make test"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "family",
    [
        pytest.param(f, marks=_SAME_PATH)
        if f in ("mistral", "phi3", "gemma")
        else f
        for f in sorted(FAMILIES)
    ],
)
def test_both_options_equal_plain_keras(family):
    x, y, sw = _data()
    plain = _compile(_lm(family))
    before = [w.numpy() for w in plain.trainable_variables]
    want_loss, want = _update(plain, x, y, sw)
    # The floor: the same update with the batch's rows in other orders
    # (the sums over the batch reordered; the blocks reorder the softmax's
    # sum over keys instead, which one layer's row swaps can leave near
    # 0: Qwen2 measured 7.5e-9 against the blocks' 6.0e-8, 1.3e-6 of the
    # update, hence also 2^-19 of it).
    floor = max(
        _diff(want, _update(_compile(_lm(family)), x, y, sw, perm)[1])
        for perm in (np.array([2, 0, 1]), np.array([1, 2, 0]))
    )
    size = _diff(want, before)

    model = tfmemopt.Model.wrap(
        _lm(family), chunked_loss=True, attention="chunked"
    )
    report = model.long_sequences
    assert len(report.attention_layers) == 1, report
    report.block_elements = 2 * 4 * T * 5  # 5 keys per block (B=2 rows)
    _compile(model)
    got_loss, got = _update(model, x, y, sw)
    assert size > 1e-2
    assert _diff(want, got) <= max(4 * floor, 2**-19 * size), (
        _diff(want, got),
        floor,
    )
    assert abs(got_loss - want_loss) <= 2e-6 * abs(want_loss)
    if family in ("llama", "gemma2"):  # generate: keras-hub's cache path
        # (Gemma 2: its sliding window at a cache index that is a tensor)
        plain.set_weights(model.inner.get_weights())
        prompt = {
            "token_ids": x["token_ids"][:1, :T].astype("int32"),
            "padding_mask": np.arange(T)[None] < 6,
        }
        inner = model.inner
        for lm in (inner, plain):  # keras-hub's default samples at random
            lm.sampler = keras_hub.samplers.GreedySampler()
            lm.generate_function = None
        np.testing.assert_array_equal(
            inner.generate(prompt, max_length=T, stop_token_ids=None)[
                "token_ids"
            ],
            plain.generate(prompt, max_length=T, stop_token_ids=None)[
                "token_ids"
            ],
        )


def test_the_blocks_cut_the_scores():
    """The replacement really runs in blocks: a block smaller than one
    query's keys changes nothing but the kernel's path (the output equals
    the whole-row block's within float32 rounding)."""
    x, _, _ = _data()
    outs = []
    for block in (1 << 20, 4 * 4 * 3):
        model = tfmemopt.Model.wrap(
            _lm("llama"), attention="chunked", chunked_loss=False
        )
        model.long_sequences.block_elements = block
        outs.append(keras.ops.convert_to_numpy(model(x, training=False)))
    np.testing.assert_allclose(outs[0], outs[1], atol=2e-5)


def test_keras_hub_still_has_what_the_takeover_reads():
    """Fails when keras-hub renames what `_hub_attention` replaces or
    reads: the method and its arguments, the scale, the windows, Gemma's
    settings."""
    layers = {
        type(layer).__name__: layer
        for family in FAMILIES
        for layer in _lm(family).backbone._flatten_layers()
        if type(layer).__name__ in _hub_attention.FAMILIES
    }
    assert set(layers) == set(_hub_attention.FAMILIES), layers
    for name, layer in layers.items():
        assert _hub_attention.is_hub_attention(layer), name
        params = list(inspect.signature(layer._compute_attention).parameters)
        want = (
            ["q", "k", "v", "attention_mask", "training", "cache_update_index"]
            if name == "CachedGemmaAttention"
            else ["query", "key", "value", "attention_mask"]
        )
        assert params[: len(want)] == want, (name, params)
    assert hasattr(layers["QwenAttention"], "_mask_sliding_window")


def test_other_attention_and_gemma_dropout_are_refused_with_the_fix():
    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GPTNeoXBackbone(
        vocabulary_size=V,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
    )
    lm = keras_hub.models.GPTNeoXCausalLM(backbone=backbone, preprocessor=None)
    with pytest.raises(ValueError, match="GPTNeoXAttention") as e:
        tfmemopt.Model.wrap(lm, chunked_loss=True, attention="chunked")
    assert "chunked_loss=True alone still applies" in str(e.value)
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=V,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
        head_dim=8,
        dropout=0.1,
    )
    lm = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    with pytest.raises(ValueError, match="dropout=0.0"):
        tfmemopt.Model.wrap(lm, attention="chunked")


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_shared_key_value_heads_reach_the_blocks_unrepeated(family):
    """Grouped-query attention without the repeat: while taken over,
    keras-hub's repeat of the 2 shared key/value heads to the 4 query heads
    (Llama's `call`) is a repeat by 1, so `_compute_attention` receives the
    shared heads; Gemma receives them anyway. Undone, keras-hub's own group
    count is back."""
    lm = _lm(family)
    (layer,) = [
        layer
        for layer in lm.backbone._flatten_layers()
        if type(layer).__name__ in _hub_attention.FAMILIES
    ]
    attribute = _hub_attention.GROUPS.get(type(layer).__name__)
    if attribute:
        assert getattr(layer, attribute) == 2
    report = tfmemopt.longseq.enable_long_sequences(lm, chunked_loss=False)
    assert len(report.attention_layers) == 1
    if attribute:
        assert getattr(layer, attribute) == 1
    replaced = layer._compute_attention
    seen = []

    def recording(query, key, value, *args, **kwargs):
        seen.append((query.shape[2], key.shape[2], value.shape[2]))
        return replaced(query, key, value, *args, **kwargs)

    layer.__dict__["_compute_attention"] = recording
    x, _, _ = _data()
    lm(x, training=False)
    assert seen == [(4, 2, 2)], seen
    layer.__dict__["_compute_attention"] = replaced
    tfmemopt.longseq.disable_long_sequences(lm)
    if attribute:
        assert getattr(layer, attribute) == 2
    assert "_compute_attention" not in layer.__dict__


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_stand_in_mask_is_keras_hubs_mask(family):
    """While training, each decoder hands its attention the key padding
    `[B, 1, S]` and the blocks make the causal mask (and the family's
    window) per block. Here that mask, made whole, equals the one keras-hub
    builds (its decoder's mask method, then Qwen2's and Gemma 2's
    `_mask_sliding_window`) on a batch with padding; fails when keras-hub
    changes how it masks."""
    from tfmemopt.longseq import _attention

    lm = _lm(family)
    x, _, _ = _data()
    padding = np.array(x["padding_mask"])
    padding[2, :4] = False  # left padding too
    (decoder,) = [
        layer
        for layer in lm.backbone._flatten_layers()
        if type(layer).__name__ in _hub_attention.DECODERS
    ]
    method, attribute = _hub_attention.DECODERS[type(decoder).__name__]
    attention = getattr(decoder, attribute)
    h = np.zeros((B, T, 32), "float32")
    # (x, padding, cache, index) for Gemma, (x, padding, attention mask,
    # cache, index) for the others
    if method == "_compute_attention_mask":
        args = (h, padding, None, 0)
    else:
        args = (h, padding, None, None, None)
    want = getattr(decoder, method)(*args)
    if getattr(attention, "use_sliding_window_attention", False):
        want = attention._mask_sliding_window(want, cache_update_index=0)
    want = np.asarray(want).astype(bool)

    tfmemopt.longseq.enable_long_sequences(lm, chunked_loss=False)
    window = attention.__dict__[_hub_attention._STAND].window
    keys = getattr(decoder, method)(*args)
    assert keys.dtype == _hub_attention.STAND_IN_DTYPE
    assert tuple(keys.shape) == (B, 1, T)
    assert window == (8 if family in ("mistral", "qwen", "gemma2") else None)
    got = _attention._block_mask(
        tf.cast(keys, tf.bool)[:, None], True, 0, T, 0, T, window
    )
    np.testing.assert_array_equal(np.asarray(got)[:, 0], want)
    tfmemopt.longseq.disable_long_sequences(lm)
    assert method not in decoder.__dict__


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_left_padding_gives_keras_hubs_outputs(family):
    """Rows that see no token (left padding): Gemma's `call` zeroes them
    from its whole mask, the others attend uniformly; with the stand-in
    mask the logits equal keras-hub's at every position."""
    lm = _lm(family)
    x, _, _ = _data()
    x = dict(x, padding_mask=np.array(x["padding_mask"]))
    x["padding_mask"][2, :4] = False
    want = keras.ops.convert_to_numpy(lm(x, training=False))
    tfmemopt.longseq.enable_long_sequences(lm, chunked_loss=False)
    got = keras.ops.convert_to_numpy(lm(x, training=False))
    tfmemopt.longseq.disable_long_sequences(lm)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


def test_a_second_takeover_and_attention_checkpointing_stay_exact():
    """Llama taken over twice (`estimate_memory` of the model a wrapper
    holds takes its layers over again for the trace) and its attention
    layer checkpointed on its own (the recompute replays the layer without
    its decoder, so the stand-in mask is recognised from the tensor): one
    update equal to plain Keras within the floor."""
    x, y, sw = _data()
    plain = _compile(_lm("llama"))
    before = [w.numpy() for w in plain.trainable_variables]
    want_loss, want = _update(plain, x, y, sw)
    floor = _diff(
        want, _update(_compile(_lm("llama")), x, y, sw, np.array([2, 0, 1]))[1]
    )
    lm = _lm("llama")
    (attention,) = [
        layer.name
        for layer in lm.backbone._flatten_layers()
        if type(layer).__name__ == "LlamaAttention"
    ]
    model = tfmemopt.Model.wrap(
        lm, chunked_loss=True, attention="chunked", checkpointing=[attention]
    )
    model.long_sequences.block_elements = 2 * 4 * T * 5  # 5 keys a block
    report = tfmemopt.checkpointing.checkpointing_report(lm)
    assert report is not None and len(report.segments) == 1, report
    _compile(model)
    tfmemopt.estimate_memory(
        lm, B, sequence_length=T, chunked_loss=True, attention="chunked"
    )
    got_loss, got = _update(model, x, y, sw)
    assert abs(got_loss - want_loss) <= 2e-6 * abs(want_loss)
    assert _diff(want, got) <= max(4 * floor, 2**-19 * _diff(want, before)), (
        _diff(want, got),
        floor,
    )
