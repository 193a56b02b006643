"""`estimate_memory(..., chunked_loss=..., attention=...)`: the step is
traced as `tfmemopt.Model` runs it with the options, and the logits and
attention-score terms appear in the breakdown (`MemoryEstimate.terms`)."""

import keras
import pytest

import tfmemopt
from tfmemopt._utils import format_bytes

VOCAB, T = 512, 256


def lm(compiled=True):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 32)(inputs)
    a = keras.layers.MultiHeadAttention(4, 8)(h, h, use_causal_mask=True)
    model = keras.Model(inputs, keras.layers.Dense(VOCAB)(h + a))
    if compiled:
        model.compile(
            "adam",
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def test_terms_and_options():
    model = lm()
    est = {
        key: tfmemopt.estimate_memory(model, 8, **kw)
        for key, kw in {
            "plain": {},
            "loss": dict(chunked_loss=True),
            "attention": dict(attention="chunked"),
            "both": dict(chunked_loss=True, attention="chunked"),
        }.items()
    }
    plain = est["plain"].terms
    logits = 8 * T * VOCAB * 4  # one float32 copy of the logits
    scores = 8 * 4 * T * T * 4  # one float32 copy of the scores
    assert plain["logits"] >= logits and plain["attention_scores"] >= scores
    assert "of which logits" in est["plain"].table()
    # Each option removes its own term; the other stays.
    assert est["loss"].terms["logits"] < logits / 4
    assert est["loss"].terms["attention_scores"] == plain["attention_scores"]
    assert est["attention"].terms["attention_scores"] < scores / 4
    assert est["attention"].terms["logits"] == plain["logits"]
    assert (
        est["both"].total
        < min(est["loss"].total, est["attention"].total)
        < est["plain"].total
    )
    assert est["both"].settings["chunked_loss"] is True
    # The model's layers are given back after the trace.
    mha = [
        layer
        for layer in model.layers
        if isinstance(layer, keras.layers.MultiHeadAttention)
    ][0]
    assert "_compute_attention" not in mha.__dict__
    # A tfmemopt.Model with the options: its own are estimated, with its
    # compiled loss (the model it wraps is not compiled).
    wrapped = tfmemopt.Model.wrap(
        lm(compiled=False), chunked_loss=True, attention="chunked"
    )
    wrapped.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    own = tfmemopt.estimate_memory(wrapped, 8)
    assert own.settings["attention"] == "chunked"
    assert own.total == est["both"].total
    with pytest.raises(ValueError, match="its own long-sequence options"):
        tfmemopt.estimate_memory(wrapped, 8, chunked_loss=False)
    with pytest.raises(ValueError, match="attention"):
        tfmemopt.estimate_memory(model, 8, attention="flash")


def test_plan_proposes_the_options_when_the_terms_do_not_fit():
    import inspect

    margin = inspect.signature(tfmemopt.plan).parameters["margin"].default
    model = lm()
    # Batch 2: chunked attention's loop fails to trace at batch 1 (a
    # shape invariant, longseq/_attention.py), which the plan skips.
    both = tfmemopt.estimate_memory(
        model, 2, chunked_loss=True, attention="chunked"
    )
    budget = int(both.total * 1.02 / (1 - margin))
    allow = ("checkpointing",)
    with pytest.raises(ValueError):  # nothing else fits
        tfmemopt.plan(model, 2, budget, allow=allow)
    p = tfmemopt.plan(model, 2, budget, allow=allow + ("long_sequences",))
    assert p.chunked_loss or p.attention
    assert p.estimated_peak <= budget * (1 - margin)
    assert "the same update within float32 rounding" in p.why
    # What is never formed, in a unit that shows it (not "0.0 MiB").
    plain = tfmemopt.estimate_memory(model, 2)
    if p.chunked_loss:
        said = format_bytes(plain.terms["logits"])
        assert f"the {said} the head and the loss keep" in p.why, p.why
    if p.attention:
        said = format_bytes(plain.terms["attention_scores"])
        assert f"the {said} the attention layers keep" in p.why, p.why
    assert "the 0.0 MiB" not in p.why
    kwargs = p.model_kwargs
    assert kwargs.get("chunked_loss") == p.chunked_loss
    applied = p.apply(model)
    assert applied.long_sequences is not None


def test_plan_says_small_terms_in_a_unit_that_shows_them():
    # A small model's logits: "96 B", not "0.0 MiB" (which read as if the
    # option saved nothing).
    from tfmemopt.tuning._plan_chosen import _long_sequence_text

    plain = {"checkpointing": None, "peak": 1, "terms": {"logits": 96}}
    plain["terms"]["attention_scores"] = 3 * 1024
    text = _long_sequence_text(
        {"chunked_loss": True, "attention": "chunked"}, [plain]
    )
    assert "the 96 B the head and the loss keep" in text, text
    assert "the 3.0 KiB the attention layers keep" in text, text


def test_a_refused_chunked_loss_is_said_as_raised():
    # A softmax head: the refusal, not tf.function's "in user code:" trace.
    inputs = keras.Input((16,), dtype="int32")
    h = keras.layers.Embedding(100, 8)(inputs)
    head = keras.layers.Dense(100, activation="softmax", name="head")(h)
    model = keras.Model(inputs, head)
    model.compile("adam", "sparse_categorical_crossentropy")
    with pytest.raises(ValueError) as raised:
        tfmemopt.estimate_memory(model, 4, chunked_loss=True)
    message = str(raised.value)
    assert message.startswith("chunked_loss=True cannot compute"), message
    assert "in user code" not in message and "'softmax'" in message


def test_uncompiled_model_is_estimated_with_the_loss_chunked_loss_computes():
    # It was refused with "Received: loss=...mean_squared_error", the
    # estimator's own default, which the user never passed.
    compiled = tfmemopt.estimate_memory(lm(), 2, chunked_loss=True)
    bare = tfmemopt.estimate_memory(lm(compiled=False), 2, chunked_loss=True)
    assert bare.total == compiled.total, (bare.total, compiled.total)
    assert bare.terms == compiled.terms


def test_logits_are_what_the_head_and_the_loss_keep():
    """`terms["logits"]` is the head's and the loss's, not a checkpointed
    segment's kept tensors (their scopes are no layer's), nor a larger
    Dense's inside a block (the head is the layer that makes the output)."""
    keras.utils.set_random_seed(0)
    layers = keras.layers
    inputs = keras.Input((28, 28, 1))
    h = layers.Conv2D(8, 3, activation="relu")(inputs)
    h = layers.MaxPooling2D()(h)
    h = layers.Conv2D(16, 3, activation="relu")(h)
    h = layers.Flatten()(layers.MaxPooling2D()(h))
    cnn = keras.Model(inputs, layers.Dense(10)(h))
    cnn.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    logits = 64 * 10 * 4
    for checkpointing in (None, "auto"):
        est = tfmemopt.estimate_memory(cnn, 64, checkpointing=checkpointing)
        assert logits <= est.terms["logits"] <= 2 * logits, (
            checkpointing,
            est.terms,
        )
    # A block's feed-forward Dense keeps [32, 100, 64] floats; the head,
    # Dense(2) on a pooled vector, makes 32 x 2 of them.
    tokens = keras.Input((100,), dtype="int32")
    x = layers.Embedding(1000, 32)(tokens)
    x = x + keras.Sequential(
        [layers.Dense(64, activation="relu"), layers.Dense(32)]
    )(x)
    x = layers.Dense(20, activation="relu")(layers.GlobalAveragePooling1D()(x))
    classifier = keras.Model(tokens, layers.Dense(2, activation="softmax")(x))
    classifier.compile("adam", "sparse_categorical_crossentropy")
    est = tfmemopt.estimate_memory(classifier, 32)
    assert est.terms["logits"] <= 4 * 32 * 2 * 4, est.terms
    # The head behind an op on the output (followed back), and in a
    # subclassed model with an op in its own scope outside every layer.
    inputs = keras.Input((64,))
    h = layers.Dense(256, activation="relu")(inputs)
    tanh = keras.Model(inputs, keras.ops.tanh(layers.Dense(10)(h)))
    tanh.compile("adam", "mse")
    assert tfmemopt.estimate_memory(tanh, 64).terms["logits"] <= 2 * logits

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.d1, self.d2 = layers.Dense(1024), layers.Dense(1024)
            self.head = layers.Dense(10)

        def call(self, x):
            h = self.d1(x)
            return self.head(self.d2(h * keras.ops.sigmoid(h)))

    net = Net()
    net(keras.ops.zeros((1, 64)))
    net.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    est = tfmemopt.estimate_memory(net, 64)
    assert est.terms["logits"] <= 2 * logits, est.terms
    assert est.activations > 100 * logits


def test_plan_takes_the_chunked_loss_where_it_is_faster_than_recompute():
    # Checkpointing fits and so does the chunked loss: the chunked loss
    # costs less step time (x1.15 against x1.33, docs/batch_size.md), so
    # the plan takes it although something fitted without it (#47).
    import inspect

    margin = inspect.signature(tfmemopt.plan).parameters["margin"].default
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,), dtype="int32")
    h = keras.layers.Embedding(4096, 256)(inputs)
    for _ in range(4):  # activations checkpointing can drop
        inner = keras.layers.Dense(256, activation="gelu")(h)
        h = h + keras.layers.Dense(256, activation="gelu")(inner)
    model = keras.Model(inputs, keras.layers.Dense(4096)(h))
    model.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    plain = tfmemopt.estimate_memory(model, 8)
    ckpt = tfmemopt.estimate_memory(model, 8, checkpointing="auto")
    loss = tfmemopt.estimate_memory(model, 8, chunked_loss=True)
    budget = int(max(ckpt.total, loss.total) * 1.02 / (1 - margin))
    assert plain.total > budget * (1 - margin)  # the plain step does not fit
    p = tfmemopt.plan(
        model, 8, budget, allow=("checkpointing", "long_sequences")
    )
    assert p.chunked_loss and p.checkpointing is None, p
    assert p.relative_step_time < 1.33
    # What it traded: the next fastest that fits, checkpointing.
    assert "the next fastest that fits 1.33x" in p.why, p.why
    assert "checkpointing 'auto'" in p.why, p.why


def test_plan_combines_a_smaller_state_with_the_chunked_loss():
    # Neither the 8-bit state nor the chunked loss fits alone; together
    # they do (the recipe of a long-context fine-tune, #47).
    import inspect

    margin = inspect.signature(tfmemopt.plan).parameters["margin"].default
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,), dtype="int32")
    h = keras.layers.Embedding(8192, 64)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(8192)(h))
    model.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    eight = tfmemopt.optimizers.Adam8bit()
    both = tfmemopt.estimate_memory(
        model, 2, optimizer=eight, chunked_loss=True
    )
    budget = int(both.total * 1.02 / (1 - margin))
    limit = budget * (1 - margin)
    assert tfmemopt.estimate_memory(model, 2, chunked_loss=True).total > limit
    assert tfmemopt.estimate_memory(model, 2, optimizer=eight).total > limit
    p = tfmemopt.plan(
        model, 2, budget, allow=("optimizer_state", "long_sequences")
    )
    assert p.optimizer == "Adam8bit" and p.chunked_loss, p
    assert p.estimated_peak <= limit
