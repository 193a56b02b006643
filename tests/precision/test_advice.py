"""check_precision, check_alignment: planted problems are found."""

import keras
import pytest
from tfmemopt.mixed_precision import Hardware

import tfmemopt
from tfmemopt.precision._advice import check_alignment
from tfmemopt.precision._advice import check_precision
from tfmemopt.precision._findings import Finding
from tfmemopt.precision._findings import Findings
from tfmemopt.precision._findings import pad_to_multiple


def _mlp(policy, hidden_dtype=None, out_dtype="float32", act="softmax"):
    keras.config.set_dtype_policy(policy)
    inputs = keras.Input((32,))
    x = keras.layers.Dense(64, activation="relu", name="h1")(inputs)
    x = keras.layers.Dense(64, dtype=hidden_dtype, name="h2")(x)
    outputs = keras.layers.Dense(16, activation=act, dtype=out_dtype)(x)
    model = keras.Model(inputs, outputs)
    keras.config.set_dtype_policy("float32")
    return model


class _Block(keras.layers.Layer):
    """A custom layer hiding a float32-pinned Dense and a 16-bit softmax."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(64, dtype="float32", name="inner")
        self.probs = keras.layers.Softmax(name="inner_softmax")

    def call(self, x):
        return self.probs(self.inner(x))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_clean_models_have_no_precision_findings(policy):
    model = _mlp(policy)
    model.compile(optimizer="adam", loss="mse")
    assert check_precision(model) == []
    assert str(check_precision(model)) == "No findings."


def test_clean_float16_model_compiled_with_loss_scaling():
    keras.config.set_dtype_policy("mixed_float16")
    model = _mlp("mixed_float16")
    model.compile(optimizer="adam", loss="mse")  # auto_scale_loss=True
    keras.config.set_dtype_policy("float32")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert check_precision(model) == []


def test_output_and_softmax_in_16_bits_are_found():
    model = _mlp("mixed_bfloat16", out_dtype=None, act="log_softmax")
    out_name = model.layers[-1].name
    findings = check_precision(model)
    assert findings.codes == ["output-16bit", "softmax-16bit"]
    assert {f.layer for f in findings} == {out_name}
    assert "log_softmax is computed in bfloat16" in findings[1].message
    assert model.outputs[0].dtype == "bfloat16"  # the plant is real


def test_16bit_output_without_softmax_is_found():
    model = _mlp("mixed_float16", out_dtype=None, act=None)
    assert check_precision(model).codes == ["output-16bit"]


def test_missing_loss_scaling_in_custom_loop_is_found():
    model = _mlp("mixed_float16")
    assert check_precision(model) == []  # not compiled, nothing to judge
    plain = keras.optimizers.SGD(0.1)
    findings = check_precision(model, optimizer=plain)
    assert findings.codes == ["no-loss-scaling"]
    assert "LossScaleOptimizer" in findings[0].message
    scaled = keras.optimizers.LossScaleOptimizer(plain)
    assert check_precision(model, optimizer=scaled) == []


def test_compile_without_loss_scaling_is_found():
    model = _mlp("mixed_float16")
    model.compile(optimizer="adam", loss="mse", auto_scale_loss=False)
    assert check_precision(model).codes == ["no-loss-scaling"]


def test_bfloat16_needs_no_loss_scaling():
    model = _mlp("mixed_bfloat16")
    assert check_precision(model, optimizer=keras.optimizers.SGD()) == []


def test_needless_float32_layers_are_found_but_outputs_are_not():
    model = _mlp("mixed_bfloat16", hidden_dtype="float32")
    findings = check_precision(model)
    assert findings.codes == ["needless-float32"]
    assert findings[0].layer == "h2"
    # All-float32 models pin nothing.
    assert check_precision(_mlp("float32", hidden_dtype="float32")) == []


def test_nested_layers_are_searched_and_attention_is_a_leaf():
    keras.config.set_dtype_policy("mixed_bfloat16")
    inputs = keras.Input((8, 64))
    x = keras.layers.MultiHeadAttention(4, 16)(inputs, inputs)
    x = _Block(name="block")(x)
    outputs = keras.layers.Dense(8, dtype="float32")(x)
    model = keras.Model(inputs, outputs)
    keras.config.set_dtype_policy("float32")
    findings = check_precision(model)
    assert sorted((f.code, f.layer) for f in findings) == [
        ("needless-float32", "inner"),
        ("softmax-16bit", "inner_softmax"),
    ]


def test_subclassed_model_output_is_checked():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(32, dtype="mixed_float16")
            self.head = keras.layers.Dense(4, dtype="mixed_float16")

        def call(self, x):
            return self.head(self.hidden(x))

    net = Net()
    out = net(keras.ops.ones((2, 8)))
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    assert check_precision(net).codes == ["output-16bit"]


def _aligned(policy="mixed_bfloat16"):
    keras.config.set_dtype_policy(policy)
    tokens = keras.Input((16,), dtype="int32")
    x = keras.layers.Embedding(32000, 512, name="emb")(tokens)
    x = keras.layers.MultiHeadAttention(8, 64, name="mha")(x, x)
    x = keras.layers.Conv1D(128, 3, padding="same", name="conv")(x)
    x = keras.layers.Dense(2048, name="ffn")(x)
    outputs = keras.layers.Dense(10, dtype="float32", name="head")(x)
    model = keras.Model(tokens, outputs)
    keras.config.set_dtype_policy("float32")
    return model


def _misaligned(policy="mixed_float16"):
    keras.config.set_dtype_policy(policy)
    tokens = keras.Input((16,), dtype="int32")
    x = keras.layers.Embedding(50257, 500, name="emb")(tokens)
    x = keras.layers.MultiHeadAttention(12, 60, name="mha")(x, x)
    x = keras.layers.Conv1D(100, 3, padding="same", name="conv")(x)
    x = keras.layers.Dense(3000, name="ffn")(x)
    x = keras.layers.Dense(2056, name="wide")(x)
    outputs = keras.layers.Dense(10, dtype="float32", name="head")(x)
    model = keras.Model(tokens, outputs)
    keras.config.set_dtype_policy("float32")
    return model


def _rows(findings):
    return sorted(
        (f.layer, f.attribute, f.value, f.suggested) for f in findings
    )


@pytest.mark.parametrize("hardware", ["v100", "a100", "h100", "tpu", "cpu"])
def test_aligned_model_has_no_findings(hardware):
    batch = 8 * (8 if hardware == "tpu" else 1) * 4
    assert check_alignment(_aligned(), batch, hardware=hardware) == []


def test_misaligned_model_on_v100():
    findings = check_alignment(_misaligned(), batch_size=60, hardware="v100")
    # Multiples of 8 everywhere (no 64 rule below compute capability 8.0);
    # heads x key_dim = 720, ffn 3000 and wide 2056 are multiples of 8, and
    # 60 sequences x 16 tokens = 960 matmul rows are too.
    assert _rows(findings) == sorted(
        [
            ("conv", "filters", 100, 104),
            ("emb", "embedding dim", 500, 504),
            ("emb", "vocabulary", 50257, 50264),
            ("mha", "key_dim", 60, 64),
        ]
    )
    assert all(f.severity == "warning" for f in findings)


def test_misaligned_model_on_a100_prefers_64_for_large_dims():
    findings = check_alignment(_misaligned(), hardware="a100")
    assert _rows(findings) == sorted(
        [
            ("conv", "filters", 100, 104),
            ("emb", "embedding dim", 500, 504),
            ("emb", "vocabulary", 50257, 50304),
            ("ffn", "units", 3000, 3008),
            ("mha", "key_dim", 60, 64),
            ("wide", "units", 2056, 2112),
        ]
    )
    by_key = {(f.layer, f.attribute): f for f in findings}
    vocab = by_key[("emb", "vocabulary")]
    assert vocab.cost_pct == pytest.approx(100 * 47 / 50257)
    assert "+0.09% padding" in vocab.message and "emb" in str(vocab)
    # 3000 and 2056 are multiples of 8 but not of 64: a smaller gain.
    assert by_key[("wide", "units")].severity == "info"
    assert by_key[("ffn", "units")].severity == "info"
    assert vocab.severity == "warning"


def test_misaligned_model_on_tpu_uses_128_and_per_core_batch():
    findings = check_alignment(_misaligned(), batch_size=96, hardware="tpu")
    rows = _rows(findings)
    assert ("<batch>", "batch_size", 96, 128) in rows  # 8 cores x 8
    assert ("emb", "vocabulary", 50257, 50304) in rows
    assert ("emb", "embedding dim", 500, 512) in rows
    assert ("mha", "heads x key_dim", 720, 768) in rows
    assert ("mha", "key_dim", 60, 64) in rows
    assert ("ffn", "units", 3000, 3072) in rows
    # conv 100 < 128: the TPU pads a single tile itself, nothing to gain.
    assert not any(r[0] == "conv" for r in rows)


def test_float32_uses_tf32_multiples_on_ampere_and_nothing_on_volta():
    model = _misaligned("float32")
    rows = _rows(check_alignment(model, hardware="a100"))
    assert ("emb", "vocabulary", 50257, 50260) in rows
    assert ("conv", "filters", 100, 100) not in rows
    assert check_alignment(model, hardware="v100") == []


def test_policy_is_read_from_the_model_or_forced():
    model = _misaligned("float32")
    assert check_alignment(model, hardware="v100") == []
    forced = check_alignment(model, hardware="v100", policy="mixed_float16")
    assert ("conv", "filters", 100, 104) in _rows(forced)
    mixed = check_alignment(_misaligned("mixed_float16"), hardware="v100")
    assert _rows(mixed) == _rows(forced)
    # A float32 model stays float32 whatever the global policy says.
    keras.config.set_dtype_policy("mixed_float16")
    assert check_alignment(model, hardware="v100") == []


def test_hardware_object_with_several_gpus_checks_per_device_batch():
    two = Hardware("gpu", "A100", (8, 0), count=2)
    model = _mlp("mixed_bfloat16")
    rows = _rows(check_alignment(model, batch_size=40, hardware=two))
    assert rows == [("<batch>", "batch_size", 40, 48)]
    assert check_alignment(model, batch_size=48, hardware=two) == []


def test_batch_counts_matmul_rows_of_sequences():
    keras.config.set_dtype_policy("mixed_float16")
    inputs = keras.Input((5, 32))
    outputs = keras.layers.Dense(16, dtype="float32")(inputs)
    model = keras.Model(inputs, outputs)
    keras.config.set_dtype_policy("float32")
    # 8 x 5 = 40 rows: aligned; 12 x 5 = 60 is not, 16 x 5 = 80 is.
    assert check_alignment(model, batch_size=8, hardware="v100") == []
    findings = check_alignment(model, batch_size=12, hardware="v100")
    assert _rows(findings) == [("<batch>", "batch_size", 12, 16)]
    assert "batch x 5 rows per sample" in findings[0].message
    assert findings[0].cost_pct == pytest.approx(100 * 4 / 12)
    # Token ids: 16 tokens per sample make any batch 16 x b rows.
    assert (
        check_alignment(_misaligned(), 3, hardware="v100").codes
        == ["alignment"] * 4
    )


def test_findings_table_and_str():
    findings = check_alignment(_misaligned(), batch_size=60, hardware="v100")
    text = findings.table()
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["severity", "code", "layer", "setting"]
    assert len(lines) == len(findings) + 1
    assert "50264" in text and "0.01" in text
    md = findings.table(markdown=True)
    assert md.splitlines()[1].startswith("|---|")
    assert str(findings).count("\n") == len(findings) - 1
    assert Findings().table() == "No findings."
    one = Finding("alignment", "info", "x", "msg")
    assert str(one) == "[info] x: msg"


@pytest.mark.parametrize(
    "n, multiple, expected",
    [(50257, 64, 50304), (64, 64, 64), (1, 8, 8), (9, 8, 16), (7, 1, 7)],
)
def test_pad_to_multiple(n, multiple, expected):
    assert pad_to_multiple(n, multiple) == expected


def test_bad_input_messages():
    with pytest.raises(ValueError, match="`multiple` must be an integer >= 1"):
        pad_to_multiple(10, 0)
    with pytest.raises(TypeError, match="n=10.5 \\(of type float\\)"):
        pad_to_multiple(10.5, 8)
    with pytest.raises(TypeError, match="must be a built keras.Model"):
        check_precision("model")
    model = _aligned()
    with pytest.raises(ValueError, match="policy='fp17'"):
        check_alignment(model, policy="fp17", hardware="a100")
    with pytest.raises(ValueError, match="batch_size=0"):
        check_alignment(model, batch_size=0, hardware="a100")
    with pytest.raises(ValueError, match="hardware='k80'"):
        check_alignment(model, hardware="k80")


def test_top_level_names():
    assert tfmemopt.check_precision is check_precision
    assert tfmemopt.check_alignment is check_alignment
    assert tfmemopt.pad_to_multiple is pad_to_multiple
    assert tfmemopt.mixed_precision.configure is not None


def test_optimizer_must_be_an_instance():
    # "adam" was accepted and checked as no optimizer (no findings).
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(TypeError, match="optimizer='adam'.*keras.optimizers"):
        check_precision(model, optimizer="adam")
