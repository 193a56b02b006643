"""A keras-hub GPT2CausalLM taken over: tied head, merged attention mask."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

import tfmemopt

keras_hub = pytest.importorskip("keras_hub")

V, T, B = 61, 12, 4


def _gpt2(dropout=0.0):
    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=V,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=16,
        dropout=dropout,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def _data():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, V, size=(B, T))
    padding = np.ones((B, T), bool)
    padding[1, -4:] = False
    padding[2, -7:] = False
    x = {"token_ids": tokens, "padding_mask": padding}
    y = np.roll(tokens, -1, axis=1)
    y[0, :2] = 5  # ignore_class
    sw = (padding * rng.uniform(0.5, 2.0, size=(B, T))).astype("float32")
    return x, y, sw


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, ignore_class=5
    )


def _update(model, x, y, sw, perm=None):
    if perm is not None:
        x = {k: v[perm] for k, v in x.items()}
        y, sw = y[perm], sw[perm]
    logs = model.train_on_batch(x, y, sample_weight=sw, return_dict=True)
    return logs["loss"], [w.numpy() for w in model.trainable_variables]


def _diff(a, b):
    return max(float(np.abs(p - q).max()) for p, q in zip(a, b))


def test_gpt2_both_options_exact_and_saved(tmp_path):
    x, y, sw = _data()
    plain = _gpt2()
    plain.compile(keras.optimizers.SGD(0.5), _loss())
    before = [w.numpy() for w in plain.trainable_variables]
    want_loss, want = _update(plain, x, y, sw)
    other = _gpt2()
    other.compile(keras.optimizers.SGD(0.5), _loss())
    floor = _diff(want, _update(other, x, y, sw, np.array([3, 1, 0, 2]))[1])
    size = _diff(want, before)

    model = tfmemopt.Model.wrap(_gpt2(), chunked_loss=True, attention="chunked")
    report = model.long_sequences
    report.chunk_elements = V * 5  # 5 tokens per chunk: 10 chunks
    report.block_elements = 2 * 2 * T * 5
    assert "token_embedding" in report.head_candidates[-1]
    assert len(report.attention_layers) == 2
    model.compile(keras.optimizers.SGD(0.5), _loss())
    got_loss, got = _update(model, x, y, sw)
    assert report.head.endswith("token_embedding")
    assert "token_embedding" in str(report)
    assert size > 1e-2
    assert _diff(want, got) <= max(4 * floor, 2**-20 * size)
    assert abs(got_loss - want_loss) <= 2e-6 * abs(want_loss)
    np.testing.assert_allclose(
        model.predict(x, verbose=0), plain.predict(x, verbose=0), atol=1e-5
    )

    # The options survive .keras; the loaded model resumes exactly.
    path = str(tmp_path / "gpt2.keras")
    model.save(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = keras.saving.load_model(path)
    # Not the inner task's compile state (Keras warned that `compile()`
    # was not called for it).
    assert not [w for w in caught if "compile()" in str(w.message)], caught
    assert loaded.get_config()["chunked_loss"] is True
    assert loaded.get_config()["attention"] == "chunked"
    assert loaded.long_sequences.head_candidates == report.head_candidates
    for m in (model, loaded):  # the sizes are the session's, not saved
        m.long_sequences.chunk_elements = V * 5
        m.long_sequences.block_elements = 2 * 2 * T * 5
    _, after = _update(model, x, y, sw)
    _, after_loaded = _update(loaded, x, y, sw)
    assert _diff(after, after_loaded) == 0.0


def test_gpt2_attention_dropout_refused_loss_alone_accepted():
    with pytest.raises(ValueError, match="dropout=0.0"):
        tfmemopt.Model.wrap(_gpt2(dropout=0.1), attention="chunked")
    model = tfmemopt.Model.wrap(_gpt2(dropout=0.1), chunked_loss=True)
    assert model.long_sequences.attention is None


def test_composes_with_mixed_float16_and_checkpointing():
    x, y, sw = _data()
    extra = {"checkpointing": "auto"}

    def update(**options):
        keras.config.set_dtype_policy("mixed_float16")
        try:
            model = tfmemopt.Model.wrap(_gpt2(), **extra, **options)
        finally:
            keras.config.set_dtype_policy("float32")
        # A small initial scale: the first step is not skipped as
        # non-finite (float16 overflows at Keras's 2**15 here).
        optimizer = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.5), initial_scale=2**6
        )
        model.compile(optimizer, _loss())
        return model, _update(model, x, y, sw)[1]

    _, want = update()
    before = [w.numpy() for w in _gpt2().trainable_variables]
    model, got = update(chunked_loss=True, attention="chunked")
    assert model.long_sequences.head.endswith("token_embedding")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    # The floor: float16's resolution (2**-10) of the whole update.
    size = _diff(want, before)
    floor = 2**-10 * size
    err = _diff(want, got)
    assert size > 1e-2 and err <= 4 * floor, (err, floor, size)


def test_estimating_the_wrapped_model_leaves_the_wrapper_working():
    """`estimate_memory(lm, chunked_loss=True, attention="chunked")` of the
    model a `Model.wrap(lm, ...)` holds takes the same layers over for its
    trace and undoes it after; undoing removed the wrapper's takeover too,
    and its next step failed ("chunked_loss=True needs the model's output
    to be the logits of a linear head": a fresh-user trial)."""
    x, y, sw = _data()
    lm = _gpt2()
    model = tfmemopt.Model.wrap(lm, chunked_loss=True, attention="chunked")
    model.compile(keras.optimizers.SGD(0.5), _loss())
    tfmemopt.estimate_memory(
        lm, B, sequence_length=T, chunked_loss=True, attention="chunked"
    )
    loss, _ = _update(model, x, y, sw)
    assert np.isfinite(loss)
    assert model.long_sequences.head.endswith("token_embedding")
    # The options undone on `lm` alone: its own call is the wrapper's again.
    assert "call" in vars(lm.backbone.token_embedding)
