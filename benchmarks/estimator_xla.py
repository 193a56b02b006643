"""`estimate_memory(..., jit_compile=True)` against the step XLA runs (#49).

A held-out set, chosen before the first run and measured once: 24 models in
6 families (dense, convolutional, recurrent, attention, embedding/text,
keras-hub language models), some with tfmemopt's options (accumulation,
checkpointing, chunked loss, mixed_bfloat16). No rule is fitted to any of
them: the estimate is XLA's own buffer assignment of the compiled step.

Each case runs in a fresh process, twice:

- `grown`: TensorFlow's CPU allocator first holds one 4 GiB region (an
  `Empty` tensor made and freed, its pages never touched), so that every
  later allocation is split from it at its own size, as on a GPU, whose
  allocator takes its memory up front. This is the figure the estimate is
  judged by: what the step asks for.
- `plain`: the allocator as a fresh process has it: it grows in regions of
  powers of two and may hold a large request (XLA's one temporary buffer)
  in a larger chunk, which its statistics count whole.

Measured: `tfmemopt.Model` with the case's options, compiled with
`jit_compile=True`; the step's peak above what was allocated before the
model was built (weights, optimizer state and the batch in it), from
`tf.config.experimental.get_memory_info("CPU:0")`, median of 2 steps after
the first. Estimated: `tfmemopt.estimate_memory(model, batch,
jit_compile=True)` on the same model after the measurement, its compile
time reported.

    python benchmarks/estimator_xla.py           # writes BENCHMARKS.md
    python benchmarks/estimator_xla.py mlp_relu  # again, the rest kept

Results are kept in benchmarks/estimator_xla.json, one entry per case.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import fresh_process  # noqa: E402
from _report import median  # noqa: E402
from _report import table  # noqa: E402
from _report import write_section  # noqa: E402

# name: (family, batch, options)
CASES = {
    "mlp_relu": ("dense", 1024, {}),
    "mlp_deep": ("dense", 512, {}),
    "mlp_bn_dropout": ("dense", 512, {}),
    "mlp_wide_acc4": ("dense", 256, {"accumulation_steps": 4}),
    "cnn_bn": ("conv", 32, {}),
    "vgg_small": ("conv", 64, {}),
    "resnet_small_ckpt": ("conv", 32, {"checkpointing": "auto"}),
    "mobilenet_v2": ("conv", 16, {}),
    "separable_acc2": ("conv", 32, {"accumulation_steps": 2}),
    "lstm": ("recurrent", 64, {}),
    "gru_stack": ("recurrent", 64, {}),
    "bilstm_acc2": ("recurrent", 32, {"accumulation_steps": 2}),
    "encoder": ("attention", 16, {}),
    "decoder_causal": ("attention", 8, {}),
    "vit_small": ("attention", 32, {}),
    "encoder_ckpt": ("attention", 16, {"checkpointing": "auto"}),
    "encoder_bf16": ("attention", 16, {"policy": "mixed_bfloat16"}),
    "emb_pool": ("text", 256, {}),
    "conv1d_text": ("text", 128, {}),
    "emb_big_acc4": ("text", 256, {"accumulation_steps": 4}),
    "gpt2_tiny": ("keras-hub", 4, {}),
    "gpt2_chunked": ("keras-hub", 4, {"chunked_loss": True}),
    "llama_tiny": ("keras-hub", 1, {}),
    "llama_acc2_ckpt": (
        "keras-hub",
        2,
        {"accumulation_steps": 2, "checkpointing": "auto"},
    ),
}

_BUILD = r"""
import json, os, statistics, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np, keras, tensorflow as tf
from keras import layers
import tfmemopt
from tfmemopt.memory import device_memory, reset_peak
def dense(width, depth, features, bn=False):
    inp = keras.Input((features,)); h = inp
    for _ in range(depth):
        h = layers.Dense(width)(h)
        if bn:
            h = layers.BatchNormalization()(h)
        h = layers.ReLU()(h)
        if bn:
            h = layers.Dropout(0.1)(h)
    return inp, layers.Dense(10)(h), ("f", (features,)), 10

def conv(kind):
    inp = keras.Input((32, 32, 3) if kind != "cnn_bn" else (64, 64, 3)); h = inp
    if kind == "cnn_bn":
        for f in (32, 64, 128):
            h = layers.Conv2D(f, 3, padding="same")(h)
            h = layers.BatchNormalization()(h)
            h = layers.ReLU()(h)
            h = layers.MaxPooling2D()(h)
    elif kind == "vgg_small":
        for f in (32, 64):
            h = layers.Conv2D(f, 3, padding="same", activation="relu")(h)
            h = layers.Conv2D(f, 3, padding="same", activation="relu")(h)
            h = layers.MaxPooling2D()(h)
        h = layers.Conv2D(128, 3, padding="same", activation="relu")(h)
    elif kind == "resnet_small_ckpt":
        h = layers.Conv2D(32, 3, padding="same")(h)
        for _ in range(4):
            r = layers.Conv2D(32, 3, padding="same", activation="relu")(h)
            r = layers.Conv2D(32, 3, padding="same")(r)
            h = layers.ReLU()(layers.Add()([h, r]))
    else:  # separable
        for f in (32, 64, 128):
            h = layers.SeparableConv2D(f, 3, padding="same")(h)
            h = layers.BatchNormalization()(h)
            h = layers.ReLU()(h)
            h = layers.MaxPooling2D()(h)
    h = layers.GlobalAveragePooling2D()(h)
    return inp, layers.Dense(10)(h), ("f", tuple(inp.shape[1:])), 10

def recurrent(kind, T=100):
    inp = keras.Input((T,), dtype="int32")
    h = layers.Embedding(5000, 64)(inp)
    if kind == "lstm":
        h = layers.LSTM(128)(h)
    elif kind == "gru_stack":
        h = layers.GRU(64, return_sequences=True)(h)
        h = layers.GRU(64)(h)
    else:
        h = layers.Bidirectional(layers.LSTM(64))(h)
    return inp, layers.Dense(10)(h), ("i", (T,), 5000), 10

def block(h, D, heads, causal=False):
    a = layers.MultiHeadAttention(heads, D // heads)(
        h, h, use_causal_mask=causal)
    h = layers.LayerNormalization()(h + a)
    f = layers.Dense(4 * D, activation="gelu")(h)
    return layers.LayerNormalization()(h + layers.Dense(D)(f))

def attention(kind):
    if kind == "vit_small":
        inp = keras.Input((32, 32, 3))
        h = layers.Conv2D(128, 4, strides=4)(inp)
        h = layers.Reshape((64, 128))(h)
        for _ in range(4):
            h = block(h, 128, 4)
        h = layers.GlobalAveragePooling1D()(h)
        out = layers.Dense(10, dtype="float32")(h)
        return inp, out, ("f", (32, 32, 3)), 10
    T, D, V = (256, 128, 2000) if kind == "decoder_causal" else (128, 256, 1000)
    inp = keras.Input((T,), dtype="int32")
    h = layers.Embedding(V, D)(inp)
    for _ in range(2):
        h = block(h, D, 4, causal=kind == "decoder_causal")
    out = layers.Dense(V, dtype="float32")(h)
    return inp, out, ("i", (T,), V), ("seq", V)

def text(kind):
    T = 200
    inp = keras.Input((T,), dtype="int32")
    if kind == "emb_pool":
        h = layers.Embedding(20000, 128)(inp)
        h = layers.GlobalAveragePooling1D()(h)
        h = layers.Dense(64, activation="relu")(h)
    elif kind == "conv1d_text":
        h = layers.Embedding(10000, 128)(inp)
        h = layers.Conv1D(128, 5, activation="relu")(h)
        h = layers.Conv1D(128, 5, activation="relu")(h)
        h = layers.GlobalMaxPooling1D()(h)
    else:
        h = layers.Embedding(50000, 256)(inp)
        h = layers.Dense(256, activation="relu")(h)
        h = layers.GlobalAveragePooling1D()(h)
    V = 50000 if kind == "emb_big_acc4" else 20000
    return inp, layers.Dense(10)(h), ("i", (T,), V), 10

def hub(kind):
    import keras_hub
    if kind.startswith("gpt2"):
        T, V = 512, 5000
        bb = keras_hub.models.GPT2Backbone(vocabulary_size=V, num_layers=2,
            num_heads=4, hidden_dim=128, intermediate_dim=512,
            max_sequence_length=T)
        lm = keras_hub.models.GPT2CausalLM(backbone=bb, preprocessor=None)
    else:
        T, V = 1024, 32000
        bb = keras_hub.models.LlamaBackbone(vocabulary_size=V, num_layers=2,
            num_query_heads=4, num_key_value_heads=2, hidden_dim=128,
            intermediate_dim=256)
        lm = keras_hub.models.LlamaCausalLM(backbone=bb, preprocessor=None)
    return lm, T, V

def build_case(name, batch, options):
    # (model, x, y, estimate_memory's extra arguments) of a case
    options = dict(options)
    rng = np.random.default_rng(0)
    policy = options.pop("policy", None)
    if policy:
        keras.config.set_dtype_policy(policy)
    x = y = None
    if name.startswith(("gpt2", "llama")):
        lm, T, V = hub(name)
        model = tfmemopt.Model.wrap(lm, **options)
        x = {"token_ids": rng.integers(0, V, (batch, T)).astype("int32"),
             "padding_mask": np.ones((batch, T), "int32")}
        y = rng.integers(0, V, (batch, T)).astype("int32")
        est_kwargs = {"sequence_length": T}
    else:
        if name.startswith("mlp"):
            spec = {"mlp_relu": (1024, 4, 512), "mlp_deep": (512, 8, 256),
                    "mlp_bn_dropout": (1024, 3, 784),
                    "mlp_wide_acc4": (4096, 2, 1024)}[name]
            built = dense(*spec, bn=name == "mlp_bn_dropout")
        elif name == "mobilenet_v2":
            m = keras.applications.MobileNetV2(input_shape=(96, 96, 3),
                alpha=0.35, weights=None, classes=10)
            built = (m.inputs[0], m.outputs[0], ("f", (96, 96, 3)), 10)
        elif name in ("cnn_bn", "vgg_small", "resnet_small_ckpt",
                      "separable_acc2"):
            built = conv(name)
        elif name in ("lstm", "gru_stack", "bilstm_acc2"):
            built = recurrent(name)
        elif name in ("encoder", "decoder_causal", "vit_small", "encoder_ckpt",
                      "encoder_bf16"):
            built = attention("decoder_causal" if name == "decoder_causal"
                              else "vit_small" if name == "vit_small"
                              else "encoder")
        else:
            built = text(name)
        inp, out, xspec, classes = built
        model = tfmemopt.Model(inp, out, **options)
        if xspec[0] == "f":
            x = rng.random((batch,) + xspec[1], dtype="float32")
        else:
            x = rng.integers(0, xspec[2], (batch,) + xspec[1]).astype("int32")
        if isinstance(classes, tuple):
            y = rng.integers(0, classes[1], (batch,) + xspec[1]).astype("int32")
        else:
            y = rng.integers(0, classes, (batch,)).astype("int32")
        est_kwargs = {}
    keras.config.set_dtype_policy("float32")
    return model, x, y, est_kwargs
"""

_CHILD = (
    _BUILD
    + r"""
name, batch, options, mode = json.loads(sys.argv[1])
if mode == "grown":
    t = tf.raw_ops.Empty(shape=[1 << 30], dtype=tf.float32, init=False)
    del t
tf.constant(0.0) + 1.0
base = device_memory()["current"]
keras.utils.set_random_seed(0)

model, x, y, est_kwargs = build_case(name, batch, options)
model.compile(
    optimizer=keras.optimizers.Adam(1e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    jit_compile=True,
)
model.train_on_batch(x, y)
peaks = []
for _ in range(2):
    reset_peak()
    model.train_on_batch(x, y)
    peaks.append(device_memory()["peak"] - base)
out = {"measured": statistics.median(peaks), "peaks": peaks}
if mode == "grown":
    est = tfmemopt.estimate_memory(model, batch, jit_compile=True, **est_kwargs)
    out["estimate"] = est.total
    out["compiled"] = est.compiled
    out["fallback"] = [n for n in est.notes if "not compiled" in n]
print("@@" + json.dumps(out))
"""
)


def cell(name, mode):
    family, batch, options = CASES[name]
    arg = json.dumps([name, batch, dict(options), mode])
    value, stderr = fresh_process(_CHILD, arg, timeout=1200)
    if value is None:
        return {"error": (stderr.strip().splitlines() or ["?"])[-1][:160]}
    return value


RESULTS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "estimator_xla.json"
)


def main(names):
    """Runs `names` (each case twice, fresh processes), stores them in
    estimator_xla.json beside the others, and writes the table once every
    case has a result."""
    stored = {}
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            stored = json.load(f)
    for name in names:
        stored[name] = {
            "grown": cell(name, "grown"),
            "plain": cell(name, "plain"),
        }
        print(name, stored[name], flush=True)
        with open(RESULTS, "w") as f:
            json.dump(stored, f, indent=1, sort_keys=True)
    rows, errors, by_family = [], [], {}
    mib = 2**20
    for name in CASES:
        if name not in stored:
            continue
        family, batch, options = CASES[name]
        grown, plain = stored[name]["grown"], stored[name]["plain"]
        if "error" in grown or grown.get("fallback"):
            why = grown.get("error") or grown["fallback"][0][:160]
            rows.append([name, family, batch, "-", "-", "-", "-", "-", why])
            print(rows[-1], flush=True)
            continue
        error = (grown["estimate"] - grown["measured"]) / grown["measured"]
        errors.append(abs(error))
        by_family.setdefault(family, []).append(abs(error))
        chunk = f"{plain['measured'] / mib:.1f}" if "measured" in plain else "-"
        rows.append(
            [
                name,
                family,
                batch,
                ", ".join(f"{k}={v}" for k, v in options.items()) or "-",
                f"{grown['measured'] / mib:.1f}",
                f"{grown['estimate'] / mib:.1f}",
                f"{100 * error:+.1f}%",
                chunk,
                f"{grown['compiled']['compile_seconds']:.1f}",
            ]
        )
        print(rows[-1], flush=True)
    summary = (
        f"Median |error| {100 * median(errors):.1f}%, worst "
        f"{100 * max(errors):.1f}% over {len(errors)} cases; per family "
        + ", ".join(
            f"{f} {100 * median(v):.1f}% (worst {100 * max(v):.1f}%)"
            for f, v in by_family.items()
        )
        + "."
        if errors
        else "No case estimated."
    )
    body = (
        "## estimator_xla\n\n"
        "`estimate_memory(model, batch, jit_compile=True)` (XLA's buffer "
        "assignment of the compiled step, nothing fitted) against the "
        "step measured under XLA on this CPU: `python "
        "benchmarks/estimator_xla.py`. A held-out set of "
        f"{len(CASES)} models in 6 families, measured once; Adam, "
        "`tfmemopt.Model` with the options shown. `measured`: the step's "
        "peak with the allocator grown first (every allocation at its own "
        "size, as on a GPU); `plain allocator`: the same step in a fresh "
        "process without it, where a large buffer may sit in a larger "
        "chunk; `compile s`: the estimate's trace and compile.\n\n"
        + table(
            [
                "model",
                "family",
                "batch",
                "options",
                "measured MiB",
                "estimated MiB",
                "error",
                "plain allocator MiB",
                "compile s",
            ],
            rows,
        )
        + "\n\n"
        + summary
    )
    if all(name in stored for name in CASES):
        write_section("estimator_xla", body)
    print(summary)


if __name__ == "__main__":
    main(sys.argv[1:] or list(CASES))
