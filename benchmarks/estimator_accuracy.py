"""How close `tfmemopt.estimate_memory` is to the measured peak of a step.

For each case (model, variant, batch), in a fresh process: the CPU
allocator's usage is read before the model is built, the model is built and
compiled (Adam, MSE or sparse cross-entropy), one warm-up step runs, then
the peak of 3 more
`train_on_batch` steps above that starting usage is measured
(`TF_ENABLE_ONEDNN_OPTS=1`, oneDNN's allocator keeps statistics) and the
median is compared with the estimate's total. Variants at the middle batch
size: `tfmemopt.Model(accumulation_steps=4)`,
`tfmemopt.enable_checkpointing(model, "auto")`, and the model built under
`mixed_bfloat16` (estimated from the float32 model with `policy=`).

Run: `.venv/bin/python benchmarks/estimator_accuracy.py [--quick]
[--partial] [MODEL ...]` (named models are measured again, the others' rows
are kept), `--reestimate` (new estimates for the stored measurements, after
a change to the estimator; trains nothing) or `--table` (the table again).
`--design`, `--heldout`, `--heldout2`, `--heldout3`, `--heldout4`,
`--heldout5`, `--heldout6`, `--heldout7`, `--heldout8`, `--heldout9`,
`--heldout10`, `--heldout11`, `--heldout12`, `--heldout13`,
`--heldout14`, `--heldout15`, `--heldout16`, `--heldout17`,
`--heldout18`, `--heldout19` or `--heldout20` measure one set's models;
with `--again`,
one more run of them, each case's `measured` the median over the runs
(the held-out sets are the median of 3 runs: run once, then twice with
`--again`). The
third to twentieth held-out sets are measured without an estimate (their
rows' `estimate` is null, and the table leaves their models out until
they have one): each is estimated once, by `--heldout3 --reestimate`,
`--heldout4 --reestimate`, `--heldout5 --reestimate`, `--heldout6
--reestimate`, `--heldout7 --reestimate`, `--heldout8 --reestimate`,
`--heldout9 --reestimate`, `--heldout10 --reestimate`, `--heldout11
--reestimate`, `--heldout12 --reestimate`, `--heldout13 --reestimate`,
`--heldout14 --reestimate`, `--heldout15 --reestimate`,
`--heldout16 --reestimate`, `--heldout17 --reestimate`,
`--heldout18 --reestimate`, `--heldout19 --reestimate` or
`--heldout20 --reestimate`, after the estimator's rules are final.

The estimate is for `tfmemopt.Model`'s train step (`trainer="tfmemopt"`),
which is what is measured.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _estimator_heldout import HELDOUT  # noqa: E402
from _estimator_heldout import VOCAB  # noqa: E402
from _estimator_heldout import build_heldout  # noqa: E402
from _estimator_heldout import optimizer_of  # noqa: E402
from _estimator_heldout2 import HELDOUT2  # noqa: E402
from _estimator_heldout2 import build_heldout2  # noqa: E402
from _estimator_heldout3 import HELDOUT3  # noqa: E402
from _estimator_heldout3 import build_heldout3  # noqa: E402
from _estimator_heldout4 import HELDOUT4  # noqa: E402
from _estimator_heldout4 import build_heldout4  # noqa: E402
from _estimator_heldout5 import HELDOUT5  # noqa: E402
from _estimator_heldout5 import build_heldout5  # noqa: E402
from _estimator_heldout6 import HELDOUT6  # noqa: E402
from _estimator_heldout6 import build_heldout6  # noqa: E402
from _estimator_heldout7 import HELDOUT7  # noqa: E402
from _estimator_heldout7 import build_heldout7  # noqa: E402
from _estimator_heldout8 import HELDOUT8  # noqa: E402
from _estimator_heldout8 import build_heldout8  # noqa: E402
from _estimator_heldout9 import HELDOUT9  # noqa: E402
from _estimator_heldout9 import build_heldout9  # noqa: E402
from _estimator_heldout10 import HELDOUT10  # noqa: E402
from _estimator_heldout10 import build_heldout10  # noqa: E402
from _estimator_heldout11 import HELDOUT11  # noqa: E402
from _estimator_heldout11 import build_heldout11  # noqa: E402
from _estimator_heldout12 import HELDOUT12  # noqa: E402
from _estimator_heldout12 import build_heldout12  # noqa: E402
from _estimator_heldout13 import HELDOUT13  # noqa: E402
from _estimator_heldout13 import build_heldout13  # noqa: E402
from _estimator_heldout14 import HELDOUT14  # noqa: E402
from _estimator_heldout14 import build_heldout14  # noqa: E402
from _estimator_heldout15 import HELDOUT15  # noqa: E402
from _estimator_heldout15 import build_heldout15  # noqa: E402
from _estimator_heldout16 import HELDOUT16  # noqa: E402
from _estimator_heldout16 import build_heldout16  # noqa: E402
from _estimator_heldout17 import HELDOUT17  # noqa: E402
from _estimator_heldout17 import build_heldout17  # noqa: E402
from _estimator_heldout18 import HELDOUT18  # noqa: E402
from _estimator_heldout18 import build_heldout18  # noqa: E402
from _estimator_heldout19 import HELDOUT19  # noqa: E402
from _estimator_heldout19 import build_heldout19  # noqa: E402
from _estimator_heldout20 import HELDOUT20  # noqa: E402
from _estimator_heldout20 import build_heldout20  # noqa: E402
from _estimator_table import summarize  # noqa: E402
from _estimator_table import write_table  # noqa: E402

ROOT = os.path.dirname(HERE)
MIB = 2**20

# name -> batch sizes (the middle one gets the variants)
MODELS = {
    "mlp": (256, 2048, 8192),
    "mlp_dropout": (256, 1024, 4096),
    "cnn": (32, 128, 512),
    "mobilenetv2_64": (8, 32, 64),
    "resnet50_64": (4, 16, 32),
    "transformer": (4, 16, 32),
    "lstm": (128, 512, 1024),
    "embedding": (64, 512, 2048),
    # Real models' shapes (issue #16): keras-io's text-classification
    # transformer (token + position embedding), keras-io's ViT (patches,
    # position embedding) and EfficientNetB0.
    "text_transformer": (8, 32, 64),
    "vit": (8, 32, 64),
    "efficientnetb0_64": (4, 16, 32),
}
VARIANTS = ("base", "accumulation=4", "checkpointing=auto", "mixed_bfloat16")
# Every model, the design set first; the held-out sets (issue #23) are in
# benchmarks/_estimator_heldout.py, _estimator_heldout2.py,
# _estimator_heldout3.py, _estimator_heldout4.py, _estimator_heldout5.py,
# _estimator_heldout6.py, _estimator_heldout7.py, _estimator_heldout8.py,
# _estimator_heldout9.py, _estimator_heldout10.py,
# _estimator_heldout11.py, _estimator_heldout12.py,
# _estimator_heldout13.py, _estimator_heldout14.py,
# _estimator_heldout15.py, _estimator_heldout16.py,
# _estimator_heldout17.py, _estimator_heldout18.py,
# _estimator_heldout19.py and _estimator_heldout20.py, with why each
# family is held out.
# The held-out sets in the order they were made: name -> (model -> cases,
# builder).
HELDOUT_SETS = {
    "heldout": (HELDOUT, build_heldout),
    "heldout2": (HELDOUT2, build_heldout2),
    "heldout3": (HELDOUT3, build_heldout3),
    "heldout4": (HELDOUT4, build_heldout4),
    "heldout5": (HELDOUT5, build_heldout5),
    "heldout6": (HELDOUT6, build_heldout6),
    "heldout7": (HELDOUT7, build_heldout7),
    "heldout8": (HELDOUT8, build_heldout8),
    "heldout9": (HELDOUT9, build_heldout9),
    "heldout10": (HELDOUT10, build_heldout10),
    "heldout11": (HELDOUT11, build_heldout11),
    "heldout12": (HELDOUT12, build_heldout12),
    "heldout13": (HELDOUT13, build_heldout13),
    "heldout14": (HELDOUT14, build_heldout14),
    "heldout15": (HELDOUT15, build_heldout15),
    "heldout16": (HELDOUT16, build_heldout16),
    "heldout17": (HELDOUT17, build_heldout17),
    "heldout18": (HELDOUT18, build_heldout18),
    "heldout19": (HELDOUT19, build_heldout19),
    "heldout20": (HELDOUT20, build_heldout20),
}
ALL = list(MODELS) + [
    name for models, _ in HELDOUT_SETS.values() for name in models
]
# The sets measured without an estimate until their one re-estimate.
MEASURE_ONLY = (
    "heldout3",
    "heldout4",
    "heldout5",
    "heldout6",
    "heldout7",
    "heldout8",
    "heldout9",
    "heldout10",
    "heldout11",
    "heldout12",
    "heldout13",
    "heldout14",
    "heldout15",
    "heldout16",
    "heldout17",
    "heldout18",
    "heldout19",
    "heldout20",
)


def set_of(name):
    """'design' (the rules were designed on it), 'heldout' (the first
    held-out set, used since to find defects), 'heldout2' (the second,
    measured once after it was fixed, used since to diagnose) or
    'heldout3' / ... / 'heldout20' (the third to twentieth, measured
    without an estimate, each estimated once after the rules are final)."""
    for which, (models, _) in HELDOUT_SETS.items():
        if name in models:
            return which
    return "design"


def _keras_io_layers():
    """keras-io's TokenAndPositionEmbedding, TransformerBlock, Patches and
    PatchEncoder (text_classification_with_transformer, image_classification
    _with_vision_transformer; Apache 2.0), as written there."""
    import keras
    from keras import layers
    from keras import ops

    class TokenAndPositionEmbedding(layers.Layer):
        def __init__(self, maxlen, vocab_size, embed_dim):
            super().__init__()
            self.token_emb = layers.Embedding(vocab_size, embed_dim)
            self.pos_emb = layers.Embedding(maxlen, embed_dim)

        def call(self, x):
            maxlen = ops.shape(x)[-1]
            positions = ops.arange(start=0, stop=maxlen, step=1)
            positions = self.pos_emb(positions)
            x = self.token_emb(x)
            return x + positions

    class TransformerBlock(layers.Layer):
        def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
            super().__init__()
            self.att = layers.MultiHeadAttention(
                num_heads=num_heads, key_dim=embed_dim
            )
            self.ffn = keras.Sequential(
                [
                    layers.Dense(ff_dim, activation="relu"),
                    layers.Dense(embed_dim),
                ]
            )
            self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
            self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
            self.dropout1 = layers.Dropout(rate)
            self.dropout2 = layers.Dropout(rate)

        def call(self, inputs):
            attn_output = self.att(inputs, inputs)
            attn_output = self.dropout1(attn_output)
            out1 = self.layernorm1(inputs + attn_output)
            ffn_output = self.ffn(out1)
            ffn_output = self.dropout2(ffn_output)
            return self.layernorm2(out1 + ffn_output)

    class Patches(layers.Layer):
        def __init__(self, patch_size):
            super().__init__()
            self.patch_size = patch_size

        def call(self, images):
            input_shape = ops.shape(images)
            batch_size = input_shape[0]
            height, width, channels = input_shape[1:4]
            num_patches_h = height // self.patch_size
            num_patches_w = width // self.patch_size
            patches = keras.ops.image.extract_patches(
                images, size=self.patch_size
            )
            return ops.reshape(
                patches,
                (
                    batch_size,
                    num_patches_h * num_patches_w,
                    self.patch_size * self.patch_size * channels,
                ),
            )

    class PatchEncoder(layers.Layer):
        def __init__(self, num_patches, projection_dim):
            super().__init__()
            self.num_patches = num_patches
            self.projection = layers.Dense(units=projection_dim)
            self.position_embedding = layers.Embedding(
                input_dim=num_patches, output_dim=projection_dim
            )

        def call(self, patch):
            positions = ops.expand_dims(
                ops.arange(start=0, stop=self.num_patches, step=1), axis=0
            )
            projected_patches = self.projection(patch)
            return projected_patches + self.position_embedding(positions)

    return TokenAndPositionEmbedding, TransformerBlock, Patches, PatchEncoder


def build(name):
    """(inputs, outputs, sparse labels?, number of classes) for `name`."""
    import keras
    from keras import layers

    which = set_of(name)
    if which != "design":
        return HELDOUT_SETS[which][1](name)
    if name == "mlp":
        x = inp = keras.Input((512,))
        for _ in range(8):
            x = layers.Dense(512, activation="relu")(x)
        return inp, layers.Dense(10)(x), False
    if name == "mlp_dropout":
        x = inp = keras.Input((256,))
        for _ in range(6):
            x = layers.Dense(1024, activation="gelu")(x)
            x = layers.Dropout(0.2)(x)
        return inp, layers.Dense(10)(x), False
    if name == "cnn":
        x = inp = keras.Input((32, 32, 3))
        for filters in (32, 64, 128):
            x = layers.Conv2D(filters, 3, padding="same")(x)
            x = layers.BatchNormalization()(x)
            x = layers.Activation("relu")(x)
            x = layers.MaxPooling2D()(x)
        x = layers.Flatten()(x)
        x = layers.Dropout(0.3)(x)
        return inp, layers.Dense(10)(x), True
    if name.startswith("mobilenetv2"):
        app = keras.applications.MobileNetV2(
            weights=None, input_shape=(64, 64, 3), classes=10
        )
        return app.inputs[0], app.outputs[0], True
    if name.startswith("resnet50"):
        app = keras.applications.ResNet50(
            weights=None, input_shape=(64, 64, 3), classes=10
        )
        return app.inputs[0], app.outputs[0], True
    if name == "transformer":
        x = inp = keras.Input((128, 128))
        for _ in range(3):
            h = layers.LayerNormalization()(x)
            h = layers.MultiHeadAttention(4, 32, dropout=0.1)(h, h)
            x = layers.Add()([x, h])
            h = layers.LayerNormalization()(x)
            h = layers.Dense(512, activation="gelu")(h)
            h = layers.Dense(128)(h)
            x = layers.Add()([x, h])
        x = layers.GlobalAveragePooling1D()(x)
        return inp, layers.Dense(10)(x), True
    if name == "lstm":
        # Every per-step tensor >= 256 KiB (the allocator statistics miss
        # smaller ones): batch x 512 floats at batch >= 128, also for the
        # micro-batches of 128 and the bfloat16 steps at batch 512.
        inp = keras.Input((32, 512))
        x = layers.LSTM(512)(inp)
        return inp, layers.Dense(10)(x), True
    if name == "embedding":
        inp = keras.Input((64,), dtype="int32")
        x = layers.Embedding(20000, 128)(inp)
        x = layers.Dense(256, activation="relu")(x)
        x = layers.GlobalAveragePooling1D()(x)
        return inp, layers.Dense(10)(x), True
    if name == "text_transformer":
        embedding, block, _, _ = _keras_io_layers()
        inp = keras.Input((256,), dtype="int32")
        x = embedding(256, 20000, 128)(inp)
        for _ in range(2):
            x = block(128, 4, 512)(x)
        x = layers.GlobalAveragePooling1D()(x)
        x = layers.Dropout(0.1)(x)
        x = layers.Dense(64, activation="relu")(x)
        return inp, layers.Dense(10)(x), True
    if name == "vit":
        _, _, patches, encoder = _keras_io_layers()
        inp = keras.Input((64, 64, 3))
        x = encoder(64, 128)(patches(8)(inp))
        for _ in range(4):
            h = layers.LayerNormalization(epsilon=1e-6)(x)
            h = layers.MultiHeadAttention(4, 32, dropout=0.1)(h, h)
            x = layers.Add()([h, x])
            h = layers.LayerNormalization(epsilon=1e-6)(x)
            h = layers.Dense(256, activation=keras.activations.gelu)(h)
            h = layers.Dropout(0.1)(h)
            h = layers.Dense(128, activation=keras.activations.gelu)(h)
            h = layers.Dropout(0.1)(h)
            x = layers.Add()([h, x])
        x = layers.LayerNormalization(epsilon=1e-6)(x)
        x = layers.Flatten()(x)
        x = layers.Dropout(0.5)(x)
        return inp, layers.Dense(10)(x), True
    if name.startswith("efficientnetb0"):
        app = keras.applications.EfficientNetB0(
            weights=None, input_shape=(64, 64, 3), classes=10
        )
        return app.inputs[0], app.outputs[0], True
    raise ValueError(name)


def cases(name, quick):
    which = set_of(name)
    if which != "design":
        table = HELDOUT_SETS[which][0][name]
        return table[:1] if quick else table
    batches = MODELS[name]
    out = [("base", b) for b in batches]
    if not quick:
        out += [(v, batches[1]) for v in VARIANTS[1:]]
    return out


def run_model(name, cases):
    """Child process: measure and estimate `cases` of one model.

    The benchmark runs each case in a fresh process: the allocator's
    statistics count whole chunks, so a tensor placed in a larger chunk
    that an earlier case freed counts the chunk (measured: a 3 MiB tensor
    in a freed 4 MiB chunk adds 4 MiB), and peaks depend on what ran
    before (mlp, mixed_bfloat16, batch 2048: 54.6 to 66.7 MiB after
    different earlier cases).
    """
    import keras
    import numpy as np

    import tfmemopt
    from tfmemopt.memory import device_memory
    from tfmemopt.memory import reset_peak

    rows = []
    for variant, batch in cases:
        keras.backend.clear_session()
        keras.config.set_dtype_policy("float32")
        keras.utils.set_random_seed(0)
        base = device_memory()["current"]
        if variant == "mixed_bfloat16":
            keras.config.set_dtype_policy("mixed_bfloat16")
        inp, out, sparse = build(name)
        keras.config.set_dtype_policy("float32")
        kwargs = {}
        if variant == "accumulation=4":
            kwargs["accumulation_steps"] = 4
        model = tfmemopt.Model(inp, out, **kwargs)
        error = ""
        if variant == "checkpointing=auto":
            try:
                tfmemopt.enable_checkpointing(model, "auto")
            except Exception as e:  # report, do not stop the benchmark
                error = f"enable_checkpointing failed: {type(e).__name__}"
        loss = _loss(sparse)
        model.compile(optimizer=optimizer_of(variant), loss=loss)
        x, y = _data(name, inp, out, sparse, batch, np)
        peaks = []
        try:
            model.train_on_batch(x, y)
            for _ in range(3):
                reset_peak()
                model.train_on_batch(x, y)
                peaks.append(device_memory()["peak"] - base)
        except Exception as e:
            error = error or f"training failed: {type(e).__name__}"
        # The third to twentieth held-out sets are measured only;
        # --reestimate estimates each once the estimator's rules are final.
        est, seconds = (
            (None, None)
            if set_of(name) in MEASURE_ONLY
            else estimate(name, variant, batch, loss)
        )
        rows.append(
            {
                "model": name,
                "set": set_of(name),
                "optimizer": type(optimizer_of(variant)).__name__,
                "variant": variant,
                "batch": batch,
                "measured": statistics.median(peaks) if peaks else None,
                "peaks": peaks,
                "estimate": est.total if est else None,
                "breakdown": est.to_dict() if est else {},
                "estimate_s": seconds,
                "error": error,
            }
        )
        del model
    return rows


def _data(name, inp, out, sparse, batch, np):
    """A batch (x, y) for the model's inputs and outputs: integer inputs
    from the model's vocabulary (a padding mask all ones), sparse labels
    over the last axis of the output; segment ids all 0."""
    import keras

    rng = np.random.default_rng(0)
    held_out = set_of(name) != "design"
    high = VOCAB if held_out else 20000

    def one(t):
        shape = (batch,) + tuple(t.shape[1:])
        if "int" not in str(t.dtype):
            return rng.random(shape, dtype="float32")
        if "padding_mask" in t.name:
            return np.ones(shape, "int32")
        if "segment_ids" in t.name:
            return np.zeros(shape, "int32")
        return rng.integers(0, high, size=shape).astype("int32")

    x = keras.tree.map_structure(one, inp)
    if sparse:
        shape = (batch,) + tuple(out.shape[1:-1])
        y = rng.integers(0, out.shape[-1], size=shape).astype("int32")
    else:
        y = rng.random((batch,) + tuple(out.shape[1:]), dtype="float32")
    return x, y


_SETTINGS = {
    "accumulation=4": {"accumulation_steps": 4},
    "checkpointing=auto": {"checkpointing": "auto"},
    "mixed_bfloat16": {"policy": "mixed_bfloat16"},
}


def _loss(sparse):
    import keras

    if sparse:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return "mse"


def estimate(name, variant, batch, loss=None):
    """(estimate, seconds) from a plain float32 copy; settings as arguments."""
    import keras

    import tfmemopt
    from tfmemopt.estimate import CPU_STATS_MIN_BYTES

    keras.backend.clear_session()
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    inp, out, sparse = build(name)
    plain = keras.Model(inp, out)
    plain.compile(optimizer=optimizer_of(variant), loss=loss or _loss(sparse))
    t0 = time.perf_counter()
    # Measured: tfmemopt.Model's train step, in every variant.
    # The measurement's view: oneDNN's allocator statistics do not count
    # allocations below 256 KiB, so neither does this estimate.
    est = tfmemopt.estimate_memory(
        plain,
        batch,
        trainer="tfmemopt",
        min_counted_bytes=CPU_STATS_MIN_BYTES,
        **_SETTINGS.get(variant, {}),
    )
    seconds = time.perf_counter() - t0
    est.notes.append(f"small_state={small_state(plain)}")
    return est, seconds


SMALL = 256 * 1024


def small_state(model):
    """Bytes of model state in allocations below 256 KiB (Adam).

    oneDNN's CPU allocator statistics do not count allocations below 256
    KiB: for these weights the weight, its gradient and its two Adam slots
    are invisible to the measurement (not to the estimate).
    """
    import math

    total = 0
    for v in model.weights:
        n = math.prod(v.shape) * 4
        if n < SMALL:
            total += n * (4 if v.trainable else 1)
    return total


def reestimate(names):
    """Child process: new estimates for the stored measurements of `names`."""
    path = os.path.join(HERE, "estimator_accuracy.json")
    with open(path) as f:
        rows = json.load(f)
    out = []
    for r in rows:
        if r["model"] in names:
            est, seconds = estimate(r["model"], r["variant"], r["batch"])
            r = dict(r, estimate=est.total, breakdown=est.to_dict())
            r["estimate_s"] = seconds
            out.append(r)
    return out


# --ablate RULE (with --reestimate): estimate without one of the rules that
# model the CPU allocator or Grappler's rewrites, to see which set each
# helps (issue #23).
# ("none": every rule on, the same summaries to compare with.)
ABLATIONS = ("none", "chunks", "grappler", "lists", "dedup")


def ablate(rule):
    """Child process: turn `rule` off in this process's estimator."""
    from tfmemopt.estimate import _step_graph
    from tfmemopt.estimate import _step_trace
    from tfmemopt.estimate import _temporaries
    from tfmemopt.estimate import _update

    if rule == "none":
        return
    if rule == "chunks":  # no whole allocator chunks: requested bytes
        _update.chunk_overhead = lambda *args: 0
    elif rule == "grappler":  # no rewrite of large gradient sums
        _temporaries.rewritten_sum_zeros = lambda step, *args: 0
    elif rule == "lists":  # a TensorList counts whole if it is >= the floor
        sizes = _step_trace.while_loop_sizes

        def whole(*args):
            lists, aliases = sizes(*args)
            lists = {
                k: (n, dtype, shared, n)
                for k, (n, dtype, shared, _) in lists.items()
            }
            return lists, aliases

        _step_trace.while_loop_sizes = whole
    elif rule == "dedup":  # no merging of identical forward ops
        _step_graph.duplicates = lambda ops, forward: {}
    else:
        raise ValueError(f"--ablate takes one of {ABLATIONS}; got {rule!r}")


def _flag(name):
    if name not in sys.argv:
        return None
    return sys.argv[sys.argv.index(name) + 1]


def _load(path):
    with open(path) as f:
        rows = json.load(f)
    for r in rows:  # rows measured before issue #23 are all design rows
        r.setdefault("set", set_of(r["model"]))
        r.setdefault("optimizer", "Adam")
    return rows


def _merge_runs(old, new):
    """`new` rows with the earlier runs' measurements of the same case:
    `runs` lists each run's median of 3 steps, `measured` is their median
    (the peak of one case moves between processes by whole allocator
    chunks)."""
    before = {(r["model"], r["variant"], r["batch"]): r for r in old}
    out = []
    for r in new:
        prev = before.get((r["model"], r["variant"], r["batch"]))
        runs = (prev.get("runs") or [prev["measured"]]) if prev else []
        runs = [m for m in runs + [r["measured"]] if m]
        out.append(dict(r, runs=runs, measured=statistics.median(runs)))
    return out


def main():
    quick = "--quick" in sys.argv
    # --reestimate: keep the stored measurements, estimate them again (after
    # a change to the estimator); nothing is trained.
    again = "--reestimate" in sys.argv
    # --ablate RULE: re-estimate without RULE, print both sets' summaries,
    # write nothing.
    rule = _flag("--ablate")
    # --partial: write the table even when some models have no rows yet.
    partial = "--partial" in sys.argv
    path = os.path.join(HERE, "estimator_accuracy.json")
    if "--table" in sys.argv:  # the table again from the stored rows
        _write_table(_load(path))
        return
    only = [a for a in sys.argv[1:] if not a.startswith("--") and a != rule]
    # --design / --heldout / --heldout2 / --heldout3 / --heldout4 /
    # --heldout5 / --heldout6 / --heldout7 / --heldout8 / --heldout9 /
    # --heldout10 / --heldout11 / --heldout12 / --heldout13 /
    # --heldout14 / --heldout15 / --heldout16 / --heldout17 /
    # --heldout18 / --heldout19 / --heldout20: one set's models only.
    # --again:
    # another run of the named models, measured = the median over the runs.
    sets = {"design": MODELS}
    sets.update((which, models) for which, (models, _) in HELDOUT_SETS.items())
    for which, models in sets.items():
        if f"--{which}" in sys.argv:
            only = only or list(models)
    names = only or ALL
    rows = []
    for name in names:
        t0 = time.time()
        got = []
        for case in [None] if again or rule else cases(name, quick):
            if again or rule:
                args = ["--reestimate"] + (["--ablate", rule] if rule else [])
            else:
                args = ["--case", *map(str, case)]
            proc = subprocess.run(
                [sys.executable, __file__, "--child", name, *args],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            lines = [
                line
                for line in proc.stdout.splitlines()
                if line.startswith("@@")
            ]
            if not lines:
                print(proc.stderr[-3000:])
                continue
            got += json.loads(lines[-1][2:])
        rows += got
        for r in got:
            m = r["measured"]
            if r["estimate"] is None:  # measured only (sets 3 to 20)
                print(
                    f"{name:19s} {r['variant']:20s} B={r['batch']:5d} "
                    f"measured={(m or 0) / MIB:8.1f} MiB "
                    f"peaks={[round(p / MIB, 1) for p in r['peaks']]} "
                    f"{r['error']}",
                    flush=True,
                )
                continue
            err = (r["estimate"] - m) / m if m else float("nan")
            print(
                f"{name:19s} {r['variant']:20s} B={r['batch']:5d} "
                f"measured={(m or 0) / MIB:8.1f} MiB "
                f"estimate={r['estimate'] / MIB:8.1f} MiB "
                f"error={err:+.1%} {r['error']}",
                flush=True,
            )
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    if rule:
        for which in ("design", *HELDOUT_SETS):
            some = [r for r in rows if set_of(r["model"]) == which]
            print(f"without {rule}, {which}: {summarize(some)}")
        return
    # Rows of models run earlier are kept, so that models can be run one at
    # a time on a loaded machine; the table is written once all are there.
    if only and os.path.exists(path):
        old = _load(path)
        if "--again" in sys.argv:  # one more run: the median over runs
            rows = _merge_runs(old, rows)
        kept = [r for r in old if r["model"] not in names]
        rows = kept + rows
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    if quick or ({r["model"] for r in rows} != set(ALL) and not partial):
        return
    if not again and all(set_of(n) in MEASURE_ONLY for n in names):
        return  # measured without estimates: the table does not change
    _write_table(rows)


def _write_table(rows):
    """The table in BENCHMARKS.md; models without an estimate yet (the
    third held-out set is measured without one) are left out of it."""
    waiting = {r["model"] for r in rows if r.get("estimate") is None}
    if waiting:
        print(
            "left out of BENCHMARKS.md, no estimate yet (--reestimate): "
            + ", ".join(m for m in ALL if m in waiting)
        )
    rows = [r for r in rows if r["model"] not in waiting]
    rows.sort(key=lambda r: ALL.index(r["model"]))
    write_table(rows, [m for m in ALL if m not in waiting])


if __name__ == "__main__":
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        if "--reestimate" in sys.argv:
            if _flag("--ablate"):
                ablate(_flag("--ablate"))
            result = reestimate([sys.argv[i + 1]])
        else:
            j = sys.argv.index("--case")
            case = (sys.argv[j + 1], int(sys.argv[j + 2]))
            result = run_model(sys.argv[i + 1], [case])
        print("@@" + json.dumps(result))
    else:
        main()
