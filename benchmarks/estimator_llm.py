"""The estimate of a plain keras-hub causal LM's `fit` step, per family
(#47, item 4): Llama, Mistral, Gemma, Qwen and Phi-3 from tiny random
configs (2 layers, width 128, vocabulary 32000, no download), 1 x 1024
tokens, AdamW, float32. Each cell in a fresh process: the task model as
keras-hub makes it (compiled with its default `SparseCategoricalAccuracy`)
and compiled with `weighted_metrics=[]`; the step's peak above what was
allocated before the model was built (weights and optimizer state in it,
as `estimate_memory`'s total counts them), median of 3 steps after the
first, against `estimate_memory(lm, 1, sequence_length=1024)`.

    python benchmarks/estimator_llm.py     # writes BENCHMARKS.md
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

TOKENS = int(os.environ.get("TFMEMOPT_BENCH_TOKENS", "1024"))
VOCAB = 32000
FAMILIES = {
    "Llama": ("LlamaBackbone", "LlamaCausalLM", {}),
    "Mistral": ("MistralBackbone", "MistralCausalLM", {}),
    "Gemma": ("GemmaBackbone", "GemmaCausalLM", {"head_dim": 32}),
    "Qwen": ("QwenBackbone", "QwenCausalLM", {}),
    "Phi-3": ("Phi3Backbone", "Phi3CausalLM", {}),
}

_CELL = """
import json, os, statistics, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np, keras, keras_hub, tensorflow as tf
import tfmemopt
from tfmemopt.memory import device_memory, reset_peak
name, task_name, extra, metrics, tokens, vocab = json.loads(sys.argv[1])
tf.constant(0.0) + 1.0
base = device_memory()["current"]
keras.utils.set_random_seed(0)
backbone = getattr(keras_hub.models, name)(
    vocabulary_size=vocab, num_layers=2, num_query_heads=4,
    num_key_value_heads=2, hidden_dim=128, intermediate_dim=256, **extra)
lm = getattr(keras_hub.models, task_name)(backbone=backbone, preprocessor=None)
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
if metrics == "default":
    lm.compile(optimizer=keras.optimizers.AdamW(1e-4), loss=loss)
else:
    lm.compile(optimizer=keras.optimizers.AdamW(1e-4), loss=loss,
               weighted_metrics=[])
rng = np.random.default_rng(0)
x = {"token_ids": rng.integers(0, vocab, (1, tokens)).astype("int32"),
     "padding_mask": np.ones((1, tokens), "int32")}
y = rng.integers(0, vocab, (1, tokens)).astype("int32")
estimate = tfmemopt.estimate_memory(lm, 1, sequence_length=tokens).total
lm.train_on_batch(x, y)
peaks = []
for _ in range(3):
    reset_peak()
    lm.train_on_batch(x, y)
    peaks.append(device_memory()["peak"] - base)
print("@@" + json.dumps({"measured": statistics.median(peaks),
                         "estimate": estimate}))
"""


def cell(family, metrics):
    backbone, task, extra = FAMILIES[family]
    arg = json.dumps([backbone, task, extra, metrics, TOKENS, VOCAB])
    value, stderr = fresh_process(_CELL, arg, timeout=900)
    if value is None:
        return {"error": stderr.strip().splitlines()[-1:]}
    return value


def main():
    rows, errors = [], []
    mib = 2**20
    for family in FAMILIES:
        for metrics in ("default", "none"):
            r = cell(family, metrics)
            if "error" in r:
                rows.append([family, metrics, "-", "-", str(r["error"])])
                continue
            error = (r["estimate"] - r["measured"]) / r["measured"]
            errors.append(abs(error))
            rows.append(
                [
                    family,
                    "keras-hub's default (accuracy)"
                    if metrics == "default"
                    else "weighted_metrics=[]",
                    f"{r['measured'] / mib:.1f}",
                    f"{r['estimate'] / mib:.1f}",
                    f"{100 * error:+.1f}%",
                ]
            )
            print(rows[-1], flush=True)
    body = (
        "## estimator_llm\n\n"
        f"`estimate_memory` of plain keras-hub causal LMs (1 x {TOKENS} "
        "tokens, 2 layers of 128, vocabulary 32000, AdamW, float32): "
        "`python benchmarks/estimator_llm.py`. Measured: the step's peak "
        "above what was allocated before the model was built, median of "
        "3 steps, each family and compile in a fresh process.\n\n"
        + table(
            ["family", "metrics", "measured MiB", "estimated MiB", "error"],
            rows,
        )
        + f"\n\nMedian |error| {100 * median(errors):.1f}%, worst "
        f"{100 * max(errors):.1f}%."
    )
    write_section("estimator_llm", body)


if __name__ == "__main__":
    main()
