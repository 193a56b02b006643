"""Long-sequence options on keras-hub's open-LLM families (#48): Llama,
Mistral, Qwen2, Phi-3 and Gemma from tiny random configs (2 layers, width 128,
4 query / 2 key-value heads, vocabulary 32000, no download), batch 1,
AdamW, float32. Each cell in a fresh process; the step's peak above what
was allocated before the model was built (weights and optimizer state
in), median of 3 steps after the first:

- plain: keras-hub's task as made (compiled with its default
  `SparseCategoricalAccuracy`), and compiled with `weighted_metrics=[]`;
- fallback: `Model.wrap(lm, chunked_loss=True, checkpointing="auto")`;
- both: `Model.wrap(lm, chunked_loss=True, attention="chunked")`.

    python benchmarks/llm_families.py                 # 2048 tokens
    TFMEMOPT_BENCH_TOKENS=4096 TFMEMOPT_BENCH_FAMILIES=llama \\
        python benchmarks/llm_families.py
    JIT_COMPILE=1 python benchmarks/llm_families.py   # under XLA
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import fresh_process  # noqa: E402
from _report import table  # noqa: E402
from _report import write_section  # noqa: E402

TOKENS = int(os.environ.get("TFMEMOPT_BENCH_TOKENS", "2048"))
JIT = os.environ.get("JIT_COMPILE") == "1"
FAMILIES = {
    "llama": ("LlamaBackbone", "LlamaCausalLM"),
    "mistral": ("MistralBackbone", "MistralCausalLM"),
    "qwen": ("QwenBackbone", "QwenCausalLM"),
    "phi3": ("Phi3Backbone", "Phi3CausalLM"),
    "gemma": ("GemmaBackbone", "GemmaCausalLM"),
}
MODES = ("default", "plain", "fallback", "both")
WANTED = os.environ.get("TFMEMOPT_BENCH_FAMILIES", ",".join(FAMILIES))

_CELL = """
import json, statistics, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np, keras, keras_hub, tensorflow as tf
import tfmemopt
from tfmemopt.memory import device_memory, reset_peak
backbone_name, task_name, mode, tokens, jit = json.loads(sys.argv[1])
vocab = 32000
tf.constant(0.0) + 1.0
base = device_memory()["current"]
keras.utils.set_random_seed(0)
extra = {"head_dim": 32} if backbone_name == "GemmaBackbone" else {}
backbone = getattr(keras_hub.models, backbone_name)(
    vocabulary_size=vocab, num_layers=2, num_query_heads=4,
    num_key_value_heads=2, hidden_dim=128, intermediate_dim=256, **extra)
lm = getattr(keras_hub.models, task_name)(backbone=backbone,
                                          preprocessor=None)
if mode == "fallback":
    lm = tfmemopt.Model.wrap(lm, chunked_loss=True, checkpointing="auto")
elif mode == "both":
    lm = tfmemopt.Model.wrap(lm, chunked_loss=True, attention="chunked")
kwargs = {} if mode == "default" else {"weighted_metrics": []}
lm.compile(optimizer=keras.optimizers.AdamW(1e-4),
           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
           jit_compile=jit, **kwargs)
rng = np.random.default_rng(0)
x = {"token_ids": rng.integers(0, vocab, (1, tokens)).astype("int32"),
     "padding_mask": np.ones((1, tokens), "int32")}
y = rng.integers(0, vocab, (1, tokens)).astype("int32")
lm.train_on_batch(x, y)
peaks = []
for _ in range(3):
    reset_peak()
    lm.train_on_batch(x, y)
    peaks.append(device_memory()["peak"] - base)
print("@@" + json.dumps(statistics.median(peaks)))
"""


def cell(family, mode):
    backbone, task = FAMILIES[family]
    arg = json.dumps([backbone, task, mode, TOKENS, JIT])
    value, stderr = fresh_process(_CELL, arg)
    if value is None:
        print(stderr[-2000:], file=sys.stderr)
    return value


def main():
    rows = []
    mib = 2**20
    for family in WANTED.split(","):
        peaks = {mode: cell(family, mode) for mode in MODES}
        default = peaks["default"]

        def show(mode):
            p = peaks[mode]
            if p is None:
                return "failed"
            if mode == "default" or not default:
                return f"{p / mib:.1f}"
            return f"{p / mib:.1f} ({p / default:.2f}x)"

        rows.append([family, *(show(m) for m in MODES)])
        print(rows[-1], flush=True)
    regime = "XLA" if JIT else "graph"
    body = (
        f"## llm_families_{TOKENS}_{regime.lower()}\n\n"
        f"keras-hub open-LLM families at 1 x {TOKENS} tokens ({regime}; "
        "2 layers of 128, 4 query / 2 key-value heads, vocabulary 32000, "
        "AdamW, float32): `python benchmarks/llm_families.py`. MiB, and "
        "the ratio to keras-hub's task as made (compiled with its default "
        "`SparseCategoricalAccuracy`).\n\n"
        + table(
            [
                "family",
                "as made (with accuracy)",
                "weighted_metrics=[]",
                "chunked_loss + checkpointing auto",
                "chunked_loss + attention chunked",
            ],
            rows,
        )
    )
    write_section(f"llm_families_{TOKENS}_{regime.lower()}", body)


if __name__ == "__main__":
    main()
