"""Long sequences: the chunked loss and chunked attention, step peak and time.

A keras-hub `GPT2CausalLM` from random init with GPT-2's real vocabulary
(50257), 2 layers, 12 heads, width 192 (intermediate 768), attention and
residual dropout 0 (chunked attention refuses dropout; every variant gets the
same model), batch 4, Adam, loss
`SparseCategoricalCrossentropy(from_logits=True)`, at 4 x 512, 4 x 1024 and
4 x 2048 tokens:

- plain `keras.Model.fit` (the model compiled as it is);
- `tfmemopt.Model.wrap(model)`;
- the wrap with `chunked_loss=True`, with `attention="chunked"`, with both.

Then a user's own functional stack (Embedding 1000 x 128, 2 blocks of
causal `MultiHeadAttention(4, 32)` + MLP 512, Dense head) at 2 x 2048: plain
Keras, the wrap, the wrap with both options.

Peak: each cell runs in a fresh process: one warm-up step, then REPEATS
steps, each measured as the `CPU:0` allocator's peak during the step (reset
before it; weights and optimizer state included); the median. Time: the
GPT-2 variants of one length built side by side in one process, ROUNDS
interleaved rounds of one step each, the median per variant. Ratios are to
plain Keras and to the plain wrap of the same size.

Run: `python benchmarks/long_sequences.py` (writes its section of
BENCHMARKS.md); `--cell KIND VARIANT T` runs one cell and prints JSON
(`JIT_COMPILE=1` under XLA, `TFMEMOPT_BENCH_GROWN=1` with TensorFlow's CPU
allocator grown first, as a GPU's allocator counts).

keras-hub's open-LLM families (Llama, Mistral, Qwen2, Phi-3, Gemma; #48):
`python benchmarks/long_sequences.py --families` runs
benchmarks/llm_families.py (its environment variables choose the tokens,
the families, XLA and the timing mode; its docstring says how).
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

REPEATS = 3
ROUNDS = 5
VARIANTS = {
    "keras": None,
    "wrap": {},
    "wrap + chunked_loss": {"chunked_loss": True},
    'wrap + attention="chunked"': {"attention": "chunked"},
    "wrap + both": {"chunked_loss": True, "attention": "chunked"},
    "wrap + both + accumulation_steps=2": {
        "chunked_loss": True,
        "attention": "chunked",
        "accumulation_steps": 2,
    },
}
GPT2 = [("gpt2", v, t) for t in (512, 1024, 2048) for v in list(VARIANTS)[:5]]
STACK = [("stack", v, 2048) for v in VARIANTS if "chunked" not in v]


def gpt2(seq_len):
    import keras
    import keras_hub
    import numpy as np

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=50257,
        num_layers=2,
        num_heads=12,
        hidden_dim=192,
        intermediate_dim=768,
        max_sequence_length=seq_len,
        dropout=0.0,
    )
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    tokens = np.random.default_rng(0).integers(0, 50257, size=(4, seq_len))
    x = {"token_ids": tokens, "padding_mask": np.ones((4, seq_len), bool)}
    return model, x, np.roll(tokens, -1, axis=1)


def stack(seq_len):
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    inputs = keras.Input((seq_len,), dtype="int32")
    h = keras.layers.Embedding(1000, 128)(inputs)
    for _ in range(2):
        a = keras.layers.LayerNormalization()(h)
        a = keras.layers.MultiHeadAttention(4, 32)(a, a, use_causal_mask=True)
        h = h + a
        f = keras.layers.LayerNormalization()(h)
        f = keras.layers.Dense(512, activation="gelu")(f)
        h = h + keras.layers.Dense(128)(f)
    model = keras.Model(inputs, keras.layers.Dense(1000)(h))
    tokens = np.random.default_rng(0).integers(0, 1000, size=(2, seq_len))
    return model, tokens, np.roll(tokens, -1, axis=1)


def build(kind, variant, seq_len):
    import keras

    import tfmemopt

    if os.environ.get("TFMEMOPT_BENCH_GROWN") == "1":
        # XLA's few large buffers counted at their own sizes, as a GPU's
        # allocator counts them (docs/xla.md, _report.grow_allocator).
        import _report

        _report.grow_allocator()
    model, x, y = (gpt2 if kind == "gpt2" else stack)(seq_len)
    options = VARIANTS[variant]
    if options is not None:
        model = tfmemopt.Model.wrap(model, **options)
        report = model.long_sequences
        if report is not None and os.environ.get("CHUNK_ELEMENTS"):
            report.chunk_elements = int(os.environ["CHUNK_ELEMENTS"])
        if report is not None and os.environ.get("BLOCK_ELEMENTS"):
            report.block_elements = int(os.environ["BLOCK_ELEMENTS"])
    model.compile(
        keras.optimizers.Adam(1e-4),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # XLA (Keras's choice on one GPU) with JIT_COMPILE=1; main runs
        # each cell with and without it.
        jit_compile=os.environ.get("JIT_COMPILE") == "1",
    )
    model.train_on_batch(x, y)  # traced and warmed up
    return model, x, y


def cell(kind, variant, seq_len):
    """Step peak (allocator peak during the step), median of REPEATS."""
    from tfmemopt.memory import device_memory
    from tfmemopt.memory import reset_peak

    model, x, y = build(kind, variant, seq_len)
    peaks = []
    for _ in range(REPEATS):
        reset_peak("CPU:0")
        model.train_on_batch(x, y)
        peaks.append(device_memory("CPU:0")["peak"])
    return {"peak": sorted(peaks)[len(peaks) // 2]}


def timing(kind, seq_len):
    """Step time of every variant, side by side in this process: ROUNDS
    rounds of one step each, so load from other processes falls on every
    variant alike; the median per variant."""
    variants = list(VARIANTS)[:5]
    built = {v: build(kind, v, seq_len) for v in variants}
    times = {v: [] for v in variants}
    for _ in range(ROUNDS):
        for v, (model, x, y) in built.items():
            start = time.perf_counter()
            model.train_on_batch(x, y)
            times[v].append(time.perf_counter() - start)
    return {v: sorted(t)[len(t) // 2] for v, t in times.items()}


def run(*args):
    proc = subprocess.run(
        [sys.executable, __file__, "--cell", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        print(proc.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(lines[-1])


def main():
    import _report

    results = {}
    for key in GPT2 + STACK:
        results[key] = run(*key)
        print(key, results[key], flush=True)
    times = {}
    for seq_len in (512, 1024, 2048):
        times[seq_len] = run("gpt2", "timing", seq_len) or {}
        print("time", seq_len, times[seq_len], flush=True)
    rows = []
    for kind, variant, seq_len in GPT2 + STACK:
        r = results[(kind, variant, seq_len)]
        plain = results[(kind, "keras", seq_len)]
        wrap = results[(kind, "wrap", seq_len)]
        batch = 4 if kind == "gpt2" else 2
        label = "GPT-2" if kind == "gpt2" else "own MHA stack"
        if r is None:
            rows.append((label, f"{batch} x {seq_len}", variant, "failed"))
            continue
        t = times.get(seq_len, {}) if kind == "gpt2" else {}
        rows.append(
            (
                label,
                f"{batch} x {seq_len}",
                variant,
                f"{r['peak'] / 2**20:.0f}",
                f"{r['peak'] / plain['peak']:.2f}" if plain else "-",
                f"{r['peak'] / wrap['peak']:.2f}" if wrap else "-",
                f"{t[variant]:.2f}" if variant in t else "-",
                f"{t[variant] / t['wrap']:.2f}" if variant in t else "-",
            )
        )
    body = (
        "Long sequences (`benchmarks/long_sequences.py`): keras-hub "
        "GPT2CausalLM, vocabulary 50257, 2 layers, 12 heads, width 192, "
        "dropout 0, Adam; a user's own causal MultiHeadAttention stack. Step "
        "peak of `CPU:0` (weights and optimizer state included), fresh "
        f"process per row, median of {REPEATS} steps. Step time: all GPT-2 "
        f"variants of one length side by side in one process, median of "
        f"{ROUNDS} interleaved rounds (a shared 2-core machine).\n\n"
        + _report.table(
            [
                "model",
                "tokens",
                "variant",
                "peak MiB",
                "/ Keras",
                "/ wrap",
                "step s",
                "time / wrap",
            ],
            rows,
        )
    )
    _report.write_section("long_sequences", body)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--cell":
        if sys.argv[3] == "timing":
            out = timing(sys.argv[2], int(sys.argv[4]))
        else:
            out = cell(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        print(json.dumps(out), flush=True)
    elif sys.argv[1:] == ["--families"]:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import llm_families

        llm_families.main()
    else:
        main()
