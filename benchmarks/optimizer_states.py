"""8-bit Adam/AdamW and factored Adafactor against Keras's optimizers.

Run by hand (not in CI): `python benchmarks/optimizer_states.py [--quick]`.
Writes the section `optimizer_states` of BENCHMARKS.md (`JIT_COMPILE=1`:
the step-peak table under XLA, section `optimizer_states_xla`):

1. State bytes (every variable the optimizer tracks except the step counter
   and the learning rate) on a model of matrices whose sizes are not
   multiples of the block size, and the ratio to Keras's optimizer.
2. Step peak: one training step's peak CPU:0 bytes (weights, state,
   gradients, temporaries) in a fresh process per optimizer; also with the
   per-variable ordering of the 8-bit updates switched off, which shows what
   the quantise/dequantise temporaries cost when all variables' are alive at
   once.
3. Step time: the ratio to Keras's AdamW, median of interleaved rounds.
4. Convergence over seeds: an MLP on sklearn's digits and an LSTM language
   model on a learnable synthetic sequence task (a random second-order
   Markov chain), final train and held-out losses, mean and min-max spread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _report  # noqa: E402
from _report import median  # noqa: E402
from _report import table  # noqa: E402
from _report import write_section  # noqa: E402

OPTIMIZERS = {
    "keras.AdamW": "keras.optimizers.AdamW(lr)",
    "AdamW8bit": "tfmemopt.optimizers.AdamW8bit(lr)",
    "keras.Adafactor": "keras.optimizers.Adafactor(lr)",
    "Adafactor": "tfmemopt.optimizers.Adafactor(lr)",
}


def make_optimizer(name, lr):
    import keras  # noqa: F401

    import tfmemopt  # noqa: F401

    return eval(OPTIMIZERS[name], {"keras": keras, "tfmemopt": tfmemopt,
                                   "lr": lr})  # fmt: skip


def memory_model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((1000,)),
            keras.layers.Dense(1500, activation="relu"),
            keras.layers.Dense(1500, activation="relu"),
            keras.layers.Dense(1000, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def state_bytes(opt) -> int:
    import keras
    import numpy as np

    skip = {id(opt.iterations)}
    lr = getattr(opt, "_learning_rate", None)
    if isinstance(lr, keras.Variable):
        skip.add(id(lr))
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        for v in opt.variables
        if id(v) not in skip
    )


class _NoChain:
    def deps(self, device):
        return []

    def record(self, device, ops):
        pass


def child_memory(name: str, chain: bool) -> dict:
    """One optimizer in this (fresh) process: state bytes and step peak."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tfmemopt.memory import measure_peak

    if _report.JIT:  # XLA's buffers counted at their own sizes (docs/xla.md)
        _report.grow_allocator()
    model = memory_model()
    opt = make_optimizer(name, 1e-3)
    if not chain:
        opt._chain = _NoChain()
    model.compile(
        opt,
        keras.losses.SparseCategoricalCrossentropy(True),
        jit_compile=_report.JIT,
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 1000)).astype("float32")
    y = rng.integers(0, 10, 32)
    model.train_on_batch(x, y)  # builds the state, traces the step
    weights = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    peaks, extras = [], []
    for _ in range(5):
        extra, _ = measure_peak(lambda: model.train_on_batch(x, y))
        extras.append(extra)
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    return {
        "state": state_bytes(opt),
        "params": sum(int(np.prod(w.shape)) for w in model.weights),
        "weights": weights,
        "peaks": peaks,
        "extras": extras,
    }


def run_child(*args) -> dict:
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("@@")]
    if proc.returncode or not lines:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(lines[-1][2:])


def memory_section(processes: int = 3):
    rows, results = [], {}
    cases = [(name, name, "1") for name in OPTIMIZERS]
    cases.append(("AdamW8bit (no per-variable order)", "AdamW8bit", "0"))
    for _ in range(processes):  # interleaved fresh processes
        for label, name, chain in cases:
            r = run_child("memory", name, chain)
            if label in results:
                results[label]["peaks"] += r["peaks"]
                results[label]["extras"] += r["extras"]
            else:
                results[label] = r
    for r in results.values():
        r["peak"] = median(r["peaks"])
        r["extra"] = median(r["extras"])
    mib = 2**20
    for name, r in results.items():
        ref = results["keras.Adafactor" if "Adafactor" in name else
                      "keras.AdamW"]  # fmt: skip
        rows.append(
            [
                name,
                f"{r['state'] / mib:.2f}",
                f"{r['state'] / r['params']:.3f}",
                f"{r['state'] / ref['state']:.3f}x",
                f"{r['peak'] / mib:.1f}",
                f"{r['extra'] / mib:.1f}",
                f"{(r['extra'] - results['keras.AdamW']['extra']) / mib:+.1f}",
            ]
        )
    params = results["keras.AdamW"]["params"]
    head = (
        f"Model: Dense 1000-1500-1500-1000-10 ({params:,} parameters, "
        "matrices 1000x1500, 1500x1500, 1500x1000, 1000x10: no size a "
        f"multiple of 256), batch 32, {processes} fresh processes per row "
        "(interleaved), 5 steps each, medians. `state`: every "
        "optimizer variable except the step counter and learning rate. "
        "`step peak`: CPU:0 bytes at the worst moment of one training step "
        "(weights, state, gradients, activations, temporaries); `above "
        "resident`: the step's own extra above what was allocated before it; "
        "`vs AdamW`: that "
        "extra minus Keras AdamW's, i.e. what the update's temporaries cost."
    )
    body = table(
        ["optimizer", "state MiB", "state B/param", "state ratio",
         "step peak MiB", "above resident MiB", "extra vs AdamW MiB"],
        rows,
    )  # fmt: skip
    return head + "\n\n" + body, results


def time_section(rounds: int):
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 1000)).astype("float32")
    y = rng.integers(0, 10, 64)
    models = {}
    cases = [(name, name, False) for name in OPTIMIZERS]
    # the whole step XLA-compiled (model.compile(jit_compile=True))
    cases += [
        (f"{n} (jit_compile)", n, True) for n in ("keras.AdamW", "AdamW8bit")
    ]
    for label, name, jit in cases:
        model = memory_model()
        model.compile(
            make_optimizer(name, 1e-3),
            keras.losses.SparseCategoricalCrossentropy(True),
            jit_compile=jit,
        )
        model.train_on_batch(x, y)
        models[label] = model
    times = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(3):
                model.train_on_batch(x, y)
            times[name].append((time.perf_counter() - start) / 3)
    ref = median(times["keras.AdamW"])
    rows = [
        [name, f"{median(t) * 1e3:.1f}", f"{median(t) / ref:.2f}x"]
        for name, t in times.items()
    ]
    head = (
        f"Same model, batch 64, {rounds} interleaved rounds of 3 steps; "
        "median per step."
    )
    return head + "\n\n" + table(["optimizer", "ms/step", "vs AdamW"], rows)


def digits_data():
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype("float32")
    rng = np.random.default_rng(123)
    order = rng.permutation(len(x))
    x, y = x[order], y[order]
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


def markov_data(n_train=2000, n_test=500, length=33, vocab=24):
    """A random second-order Markov chain: each (a, b) pair has 3 likely
    next tokens (probabilities 0.6/0.25/0.15): learnable, not trivial."""
    import numpy as np

    rng = np.random.default_rng(7)
    nxt = rng.integers(0, vocab, size=(vocab, vocab, 3))
    p = np.array([0.6, 0.25, 0.15])

    def sample(n, seed):
        r = np.random.default_rng(seed)
        seq = np.zeros((n, length), "int64")
        seq[:, :2] = r.integers(0, vocab, size=(n, 2))
        for t in range(2, length):
            choice = r.choice(3, size=n, p=p)
            seq[:, t] = nxt[seq[:, t - 2], seq[:, t - 1], choice]
        return seq[:, :-1], seq[:, 1:]

    return sample(n_train, 1), sample(n_test, 2), vocab


def markov_bound(length=33, vocab=24):
    """About the lowest mean loss: the first target is uniform, each
    later one has the entropy of its (a, b) row (rows weighted equally,
    not by how often the chain visits them; successors may repeat)."""
    import numpy as np

    rng = np.random.default_rng(7)
    nxt = rng.integers(0, vocab, size=(vocab, vocab, 3))
    p = np.array([0.6, 0.25, 0.15])
    rows = []
    for a in range(vocab):
        for b in range(vocab):
            probs = np.zeros(vocab)
            np.add.at(probs, nxt[a, b], p)
            probs = probs[probs > 0]
            rows.append(-(probs * np.log(probs)).sum())
    steps = length - 1
    return (np.log(vocab) + (steps - 1) * float(np.mean(rows))) / steps


def train_task(task, name, seed, epochs):
    import keras

    keras.utils.set_random_seed(seed)
    if task == "digits":
        (x, y), (xt, yt) = digits_data()
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        lr, batch = 1e-3, 32
    else:
        (x, y), (xt, yt), vocab = markov_data()
        model = keras.Sequential(
            [
                keras.Input((None,), dtype="int64"),
                # one-hot + Dense: a dense gradient (an Embedding's sparse
                # one meets Keras's per-occurrence squaring, see the docs)
                keras.layers.Lambda(
                    lambda t: keras.ops.one_hot(t, vocab),
                    output_shape=(None, vocab),
                ),
                keras.layers.Dense(32, use_bias=False),
                keras.layers.LSTM(128, return_sequences=True),
                keras.layers.Dense(vocab),
            ]
        )
        lr, batch = 3e-3, 64
    if "Adafactor" in name:
        lr = 1e-2  # Adafactor's relative step caps at lr (paper: 1e-2)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(make_optimizer(name, lr), loss)
    model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0)
    return (
        float(model.evaluate(x, y, batch_size=256, verbose=0)),
        float(model.evaluate(xt, yt, batch_size=256, verbose=0)),
    )


def convergence_section(seeds, epochs):
    import numpy as np

    rows = []
    raw = {}
    for task in ("digits", "markov_lstm"):
        for name in OPTIMIZERS:
            runs = [train_task(task, name, s, epochs[task]) for s in seeds]
            raw[(task, name)] = runs
            tr = np.array([r[0] for r in runs])
            te = np.array([r[1] for r in runs])
            rows.append(
                [
                    task,
                    name,
                    f"{tr.mean():.4f} [{tr.min():.4f}, {tr.max():.4f}]",
                    f"{te.mean():.4f} [{te.min():.4f}, {te.max():.4f}]",
                ]
            )
    verdict = []
    for task in ("digits", "markov_lstm"):
        ref = raw[(task, "keras.AdamW")]
        ours = raw[(task, "AdamW8bit")]
        for i, split in enumerate(("train", "held-out")):
            lo = min(r[i] for r in ref)
            hi = max(r[i] for r in ref)
            inside = sum(lo <= r[i] <= hi for r in ours)
            mean_ours = np.mean([r[i] for r in ours])
            verdict.append(
                f"{task} {split}: AdamW8bit mean {mean_ours:.4f}, "
                f"{inside}/{len(ours)} seeds inside AdamW's "
                f"[{lo:.4f}, {hi:.4f}]"
            )
    head = (
        f"Seeds {list(seeds)}; mean [min, max] of the final losses. digits: "
        f"MLP 64-256-256-10 on 1400/397 samples, {epochs['digits']} epochs, "
        "batch 32, lr 1e-3. markov_lstm: one-hot + Dense 32 + LSTM 128 "
        "language model on a random 2nd-order Markov chain (vocab 24, "
        f"2000/500 sequences of 32), {epochs['markov_lstm']} epochs, batch "
        f"64, lr 3e-3 (the chain's entropy puts the best loss near "
        f"{markov_bound():.2f} nats). Both Adafactors: lr 1e-2 (the "
        "relative step's cap)."
    )
    body = table(["task", "optimizer", "train loss", "held-out loss"], rows)
    return head + "\n\n" + body + "\n\n" + "\n".join(f"- {v}" for v in verdict)


def main():
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        kind, name, chain = sys.argv[i + 1 : i + 4]
        out = child_memory(name, chain == "1")
        print("@@" + json.dumps(out))
        return
    quick = "--quick" in sys.argv
    mem, _ = memory_section(1 if quick else 3)
    print(mem)
    if _report.JIT:
        # Under XLA (#46): the memory section only (the time section has
        # its jit_compile rows; convergence does not depend on it).
        write_section(
            "optimizer_states_xla",
            "## Optimizer state under XLA (`JIT_COMPILE=1 python "
            "benchmarks/optimizer_states.py`)\n\nThe step compiled with "
            "`jit_compile=True`, TensorFlow's CPU allocator grown first (a "
            "GPU's way of counting, docs/xla.md); XLA keeps no control "
            "dependencies, so the per-variable order is the scheduler's "
            "in both AdamW8bit rows.\n\n" + mem,
        )
        return
    tim = time_section(5 if quick else 15)
    print(tim)
    seeds = (0, 1) if quick else (0, 1, 2, 3, 4)
    epochs = {"digits": 3, "markov_lstm": 2} if quick else {
        "digits": 15, "markov_lstm": 6}  # fmt: skip
    conv = convergence_section(seeds, epochs)
    print(conv)
    body = (
        "## Optimizer state (`benchmarks/optimizer_states.py`)\n\n"
        "### State bytes and step peak\n\n" + mem + "\n\n"
        "### Step time\n\n" + tim + "\n\n"
        "### Convergence\n\n" + conv
    )
    if not quick:
        write_section("optimizer_states", body)


if __name__ == "__main__":
    main()
