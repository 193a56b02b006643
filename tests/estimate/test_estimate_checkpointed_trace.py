"""`estimate_memory(..., checkpointing="auto")` traces the library's own
recompute (`enable_checkpointing` applied for the trace and undone): the
estimate is that of the model checkpointed by the user, and the user's
model is left as it was (no checkpointing, its traced functions kept)."""

import keras
import numpy as np

import tfmemopt
from tfmemopt import estimate_memory
from tfmemopt.checkpointing import checkpointing_report


def _residual(blocks=4, width=128):
    x = inp = keras.Input((width,))
    x = keras.layers.Dense(width)(x)
    for _ in range(blocks):
        h = keras.layers.Dense(2 * width, activation="gelu")(x)
        h = keras.layers.Dense(width)(h)
        x = keras.layers.Add()([x, h])
    return keras.Model(inp, keras.layers.Dense(1)(x))


def test_estimate_is_the_checkpointed_models():
    keras.utils.set_random_seed(0)
    model = _residual()
    model.compile(optimizer="adam", loss="mse")
    x = np.zeros((8, 128), "float32")
    model.fit(x, np.zeros((8, 1), "float32"), epochs=1, verbose=0)
    train_function = model.train_function
    est = estimate_memory(model, 512, checkpointing="auto")
    # The user's model: not checkpointed, its traced step kept.
    assert checkpointing_report(model) is None
    assert model.train_function is train_function
    plain = estimate_memory(model, 512)
    assert est.total < plain.total
    # The same model checkpointed by the user: the same estimate.
    report = tfmemopt.enable_checkpointing(model, "auto")
    own = estimate_memory(model, 512)
    assert own.total == est.total
    assert own.activations == est.activations
    note = next(n for n in est.notes if n.startswith("checkpointing"))
    assert f"{len(report.segments)} segments" in note
    # Asked for on top of the model's own: traced as it is, and said.
    again = estimate_memory(model, 512, checkpointing="auto")
    assert again.total == est.total
    assert any("the model's own" in n for n in again.notes)
    tfmemopt.disable_checkpointing(model)


def test_an_int_policy_keeps_the_rule():
    # `enable_checkpointing` has no "layers per segment" policy.
    model = _residual(blocks=2, width=64)
    est = estimate_memory(model, 256, checkpointing=2)
    assert any("by rule" in n for n in est.notes)
    assert checkpointing_report(model) is None


def test_a_failed_checkpointed_trace_falls_back_to_the_rule(monkeypatch):
    from tfmemopt.estimate import _traced_model

    model = _residual(blocks=2, width=64)
    real = _traced_model.trace_step
    calls = []

    def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("cannot trace")
        return real(*args, **kwargs)

    model.compile(optimizer="adam", loss="mse")
    x = np.zeros((8, 64), "float32")
    model.fit(x, np.zeros((8, 1), "float32"), epochs=1, verbose=0)
    kept = model.train_function
    monkeypatch.setattr(_traced_model, "trace_step", fails_once)
    est = estimate_memory(model, 256, checkpointing="auto")
    assert any("could not be traced (RuntimeError" in n for n in est.notes)
    assert any("by rule" in n for n in est.notes)
    assert checkpointing_report(model) is None
    assert model.train_function is kept


def test_the_recompute_reads_the_weights_without_a_copy():
    # The recompute's inputs and weights wait for the incoming gradient
    # through whole-tensor slices, which hand the buffer on: a weight's
    # costs nothing (it was counted as a copy of each of a segment's
    # weights: a checkpointed MLP with dropout +13.9%, now +3.3%).
    model = keras.Sequential(
        [keras.Input((1024,))]
        + [keras.layers.Dense(1024, activation="relu") for _ in range(9)]
    )
    plain = estimate_memory(model, 8)
    auto = estimate_memory(model, 8, checkpointing="auto")
    # Batch 8: the activations are 32 KiB a layer, each weight 4 MiB.
    assert abs(auto.total - plain.total) < 2**20


class PlainStack(tfmemopt.Model):
    """A subclassed model of plain layers: `enable_checkpointing` finds
    no block to recompute, so `"auto"` cannot be applied."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = [keras.layers.Dense(512, "relu") for _ in range(8)]
        self.head = keras.layers.Dense(1)

    def call(self, x):
        for layer in self.hidden:
            x = layer(x)
        return self.head(x)


def test_a_policy_the_library_refuses_saves_nothing_and_plan_skips_it():
    model = PlainStack()
    model(np.zeros((2, 512), "float32"))
    plain = estimate_memory(model, 512)
    auto = estimate_memory(model, 512, checkpointing="auto")
    assert auto.total == plain.total
    assert any("estimated without checkpointing" in n for n in auto.notes)
    # The rule promised a saving here; `fit` would raise.
    p = tfmemopt.plan(model, 512, memory_budget=int(0.85 * plain.total))
    assert p.checkpointing is None


def test_unbuilt_rebuilt_and_nested_models_trace_the_same_step():
    # Unbuilt: the trace builds it, then traces it checkpointed.
    def stack():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [keras.layers.Dense(256, activation="relu") for _ in range(9)]
        )

    unbuilt = estimate_memory(
        stack(), 256, checkpointing="auto", input_shape=(256,)
    )
    built = stack()
    built.build((None, 256))
    est = estimate_memory(built, 256, checkpointing="auto")
    assert unbuilt.total == est.total
    assert any("traced with enable_checkpointing" in n for n in unbuilt.notes)
    # Rebuilt under another policy: the user's own checkpointing kept.
    mixed = estimate_memory(
        built, 256, policy="mixed_bfloat16", checkpointing="auto"
    )
    tfmemopt.enable_checkpointing(built, "auto")
    own = estimate_memory(built, 256, policy="mixed_bfloat16")
    assert own.total == mixed.total
    tfmemopt.disable_checkpointing(built)
    # Enabled by the user on a model inside: traced as it is.
    inner = _residual(blocks=4, width=64)
    x = inp = keras.Input((64,))
    outer = keras.Model(inp, keras.layers.Dense(1)(inner(x)))
    tfmemopt.enable_checkpointing(inner, "auto")
    nested = estimate_memory(outer, 256, checkpointing="auto")
    assert any("the model's own" in n for n in nested.notes)
    assert checkpointing_report(outer) is None
