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
    JIT_COMPILE=1 TFMEMOPT_BENCH_GROWN=1 python benchmarks/llm_families.py
    TFMEMOPT_BENCH_TIMING=1 TFMEMOPT_BENCH_TOKENS=2048,4096 \
        python benchmarks/llm_families.py   # step time, Llama

The timing mode builds `Model.wrap(lm)` and `Model.wrap(lm,
chunked_loss=True, attention="chunked")` of the same Llama in one process
and times one step of each in turn (7 rounds after 2 warm-up steps), so
that load from other processes falls on both alike; the median ratio.
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

_TOKENS = os.environ.get("TFMEMOPT_BENCH_TOKENS", "2048").split(",")
TOKENS = int(_TOKENS[0])
TIMING_TOKENS = [int(t) for t in _TOKENS]
JIT = os.environ.get("JIT_COMPILE") == "1"
# TensorFlow's CPU allocator grown first (one 4 GiB region, never touched):
# XLA's few large buffers are then counted at their own sizes, not in the
# power-of-two regions a fresh process grows (docs/xla.md).
GROWN = os.environ.get("TFMEMOPT_BENCH_GROWN") == "1"
FAMILIES = {
    "llama": ("LlamaBackbone", "LlamaCausalLM"),
    "mistral": ("MistralBackbone", "MistralCausalLM"),
    "qwen": ("QwenBackbone", "QwenCausalLM"),
    "phi3": ("Phi3Backbone", "Phi3CausalLM"),
    "gemma": ("GemmaBackbone", "GemmaCausalLM"),
}
MODES = ("default", "plain", "fallback", "both")
# a subset of the columns (the others shown as "-"): TFMEMOPT_BENCH_MODES
RUN_MODES = os.environ.get("TFMEMOPT_BENCH_MODES", ",".join(MODES)).split(",")
WANTED = os.environ.get("TFMEMOPT_BENCH_FAMILIES", ",".join(FAMILIES))

_CELL = """
import json, statistics, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np, keras, keras_hub, tensorflow as tf
import tfmemopt
from tfmemopt.memory import device_memory, reset_peak
backbone_name, task_name, mode, tokens, jit, grown = json.loads(sys.argv[1])
vocab = 32000
if grown:  # every allocation split at its own size (docs/xla.md)
    t = tf.raw_ops.Empty(shape=[1 << 30], dtype=tf.float32, init=False)
    del t
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
    arg = json.dumps([backbone, task, mode, TOKENS, JIT, GROWN])
    value, stderr = fresh_process(_CELL, arg)
    if value is None:
        print(stderr[-2000:], file=sys.stderr)
    return value


_TIMING = """
import json, statistics, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np, keras, keras_hub
import tfmemopt
tokens, jit = json.loads(sys.argv[1])
vocab = 32000
rng = np.random.default_rng(0)
x = {"token_ids": rng.integers(0, vocab, (1, tokens)).astype("int32"),
     "padding_mask": np.ones((1, tokens), "int32")}
y = rng.integers(0, vocab, (1, tokens)).astype("int32")
models = {}
for name, options in (("wrap", {}),
                      ("both", {"chunked_loss": True, "attention": "chunked"})):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=vocab, num_layers=2, num_query_heads=4,
        num_key_value_heads=2, hidden_dim=128, intermediate_dim=256)
    lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    model = tfmemopt.Model.wrap(lm, **options)
    model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True),
                  weighted_metrics=[], jit_compile=jit)
    for _ in range(2):
        model.train_on_batch(x, y)
    models[name] = model
times = {name: [] for name in models}
for _ in range(7):
    for name, model in models.items():
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times[name].append(time.perf_counter() - start)
ratios = [b / w for b, w in zip(times["both"], times["wrap"])]
print("@@" + json.dumps(statistics.median(ratios)))
"""


def timing():
    rows = []
    for tokens in TIMING_TOKENS:
        for jit in (False, True):
            arg = json.dumps([tokens, jit])
            value, stderr = fresh_process(_TIMING, arg)
            if value is None:
                print(stderr[-2000:], file=sys.stderr)
            regime = "XLA" if jit else "graph"
            shown = "failed" if value is None else f"{value:.2f}x"
            rows.append([str(tokens), regime, shown])
            print(rows[-1], flush=True)
    body = (
        "## llm_families_time\n\n"
        "Step time of `Model.wrap(lm, chunked_loss=True, "
        'attention="chunked")` against `Model.wrap(lm)` (keras-hub Llama, 2 '
        "layers of 128, 4 query / 2 key-value heads, vocabulary 32000, "
        "batch 1, AdamW, `weighted_metrics=[]`): both in one process, one "
        "step of each in turn, 7 rounds after 2 warm-up steps, the median "
        "ratio. `TFMEMOPT_BENCH_TIMING=1 python "
        "benchmarks/llm_families.py`.\n\n"
        + table(["tokens", "regime", "time, both / wrap"], rows)
    )
    write_section("llm_families_time", body)


def main():
    if os.environ.get("TFMEMOPT_BENCH_TIMING") == "1":
        timing()
        return
    rows = []
    mib = 2**20
    for family in WANTED.split(","):
        peaks = {
            mode: cell(family, mode) if mode in RUN_MODES else "-"
            for mode in MODES
        }
        default = peaks["default"]

        def show(mode):
            p = peaks[mode]
            if p is None or p == "-":
                return "failed" if p is None else p
            if mode == "default" or not isinstance(default, (int, float)):
                return f"{p / mib:.1f}"
            return f"{p / mib:.1f} ({p / default:.2f}x)"

        rows.append([family, *(show(m) for m in MODES)])
        print(rows[-1], flush=True)
    regime = "XLA" if JIT else "graph"
    name = f"llm_families_{TOKENS}_{regime.lower()}" + (
        "_grown" if GROWN else ""
    )
    allocator = (
        ", TensorFlow's CPU allocator grown first (TFMEMOPT_BENCH_GROWN=1)"
        if GROWN
        else ""
    )
    body = (
        f"## {name}\n\n"
        f"keras-hub open-LLM families at 1 x {TOKENS} tokens ({regime}"
        f"{allocator}; "
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
    write_section(name, body)


if __name__ == "__main__":
    main()
