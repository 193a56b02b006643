"""Memory and step time: float32 / mixed_bfloat16 / mixed_float16.

An activation-dominated MLP (tall batch, narrow layers) trained one step at
a time with `train_on_batch`: plain Keras, `tfmemopt.Model` with
`accumulation_steps=4`, and with `checkpointing="auto"` too, each policy set
with `tfmemopt.mixed_precision.configure`. Two figures per step, at batch
`BATCH`:

- step peak: the CPU:0 allocator's peak above what was held before the step
  (weights, optimizer slots, the batch): kept activations, gradients,
  float32 accumulators and per-op temporaries;
- kept for backward: the allocator's current bytes at the end of a
  (micro-)batch's forward pass, read by a `tf.py_function` inside the loss
  that the backward pass waits for, minus the bytes held before the step;
  the largest over the micro-batches. This is the activation memory that
  16 bits halve.

The same groups run a second time in a subprocess with grappler's
`remapping` off, which keeps oneDNN from fusing MatMul+BiasAdd: its bf16
fused kernel allocates a float32-sized scratch buffer per call.

All variants run side by side in one process, interleaved, `REPEATS` times;
medians are quoted, with ratios against float32.

    TF_ENABLE_ONEDNN_OPTS=1 .venv/bin/python benchmarks/precision.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from _report import median  # noqa: E402
from _report import table  # noqa: E402
from _report import write_section  # noqa: E402

import tfmemopt  # noqa: E402
from tfmemopt.memory import measure_peak  # noqa: E402

# mixed_float16 only with remapping off: with it on, one step took 84-104 s
# on this CPU (oneDNN's fused float16 MatMul+BiasAdd+ReLU: 457 ms per call
# against 0.7 ms unfused, for 2048 x 128 x 128).
POLICIES = ("float32", "mixed_bfloat16")
POLICIES_NO_REMAP = ("float32", "mixed_bfloat16", "mixed_float16")
BATCH, FEATURES, WIDTH, DEPTH = 8192, 32, 128, 16
REPEATS, STEPS = 3, 2
MIB = 1024 * 1024
NO_REMAP = "--no-remapping-json"


class ForwardProbe:
    """MSE that reads the allocator once the forward pass has ended."""

    def __init__(self):
        self.bytes = []

    def _read(self, _):
        self.bytes.append(
            tf.config.experimental.get_memory_info("CPU:0")["current"]
        )
        return np.float32(0.0)

    def loss(self, y_true, y_pred):
        probe = tf.py_function(
            self._read, [tf.stop_gradient(y_pred)], tf.float32
        )
        probe = tf.stop_gradient(tf.reshape(probe, ()))
        y_pred = y_pred + tf.cast(probe, y_pred.dtype)
        return keras.losses.mean_squared_error(y_true, y_pred)


def build(policy, probe, accumulation=None, checkpointing=None):
    with tfmemopt.mixed_precision.configure(policy, hardware="cpu"):
        keras.utils.set_random_seed(1)
        inputs = keras.Input((FEATURES,))
        x = inputs
        for _ in range(DEPTH):
            x = keras.layers.Dense(WIDTH, activation="relu")(x)
        outputs = keras.layers.Dense(1, dtype="float32")(x)
        if accumulation is None:
            model = keras.Model(inputs, outputs)
        else:
            model = tfmemopt.Model(
                inputs,
                outputs,
                accumulation_steps=accumulation,
                checkpointing=checkpointing,
            )
        model.compile(optimizer=keras.optimizers.SGD(1e-3), loss=probe.loss)
    return model


def variants(policies):
    out = []
    for group, acc, ckpt in (
        ("keras.Model", None, None),
        ("tfmemopt.Model(acc=4)", 4, None),
        ("tfmemopt.Model(acc=4, ckpt=auto)", 4, "auto"),
    ):
        for policy in policies:
            out.append((group, policy, acc, ckpt))
    return out


def measure(policies):
    """{"group|policy": figures} for every variant, interleaved."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(BATCH, FEATURES)).astype("float32"))
    y = tf.identity(x[:, :1] * 0.5)
    models = {}
    for group, policy, acc, ckpt in variants(policies):
        probe = ForwardProbe()
        model = build(policy, probe, acc, ckpt)
        model.train_on_batch(x, y)  # trace, build the optimizer
        models[(group, policy)] = (model, probe)
    peaks = {key: [] for key in models}
    kept = {key: [] for key in models}
    times = {key: [] for key in models}
    cpu = {key: [] for key in models}
    losses = {}
    for r in range(REPEATS):
        for key, (model, probe) in models.items():
            tf.constant(0.0) + 1.0
            start = tf.config.experimental.get_memory_info("CPU:0")["current"]
            probe.bytes.clear()
            peak, loss = measure_peak(lambda: model.train_on_batch(x, y))
            peaks[key].append(peak / MIB)
            kept[key].append((max(probe.bytes) - start) / MIB)
            wall, proc = time.perf_counter(), time.process_time()
            for _ in range(STEPS):
                loss = model.train_on_batch(x, y)
            times[key].append((time.perf_counter() - wall) / STEPS)
            cpu[key].append((time.process_time() - proc) / STEPS)
            losses[key] = float(np.asarray(loss))
        print(f"repeat {r + 1}/{REPEATS} done", file=sys.stderr, flush=True)
    return {
        f"{group}|{policy}": {
            "peak": median(peaks[(group, policy)]),
            "peak_lo": min(peaks[(group, policy)]),
            "peak_hi": max(peaks[(group, policy)]),
            "kept": median(kept[(group, policy)]),
            "ms": median(times[(group, policy)]) * 1e3,
            "cpu_ms": median(cpu[(group, policy)]) * 1e3,
            "loss": losses[(group, policy)],
        }
        for group, policy in models
    }


def rows_for(results, suffix=""):
    rows, base = [], {}
    for key, r in results.items():
        group, policy = key.split("|")
        if policy == "float32":
            base[group] = r
        b = base[group]
        rows.append(
            [
                group + suffix,
                policy,
                f"{r['peak']:.1f} ({r['peak_lo']:.1f}-{r['peak_hi']:.1f})",
                f"{r['peak'] / b['peak']:.2f}",
                f"{r['kept']:.1f}",
                f"{r['kept'] / b['kept']:.2f}",
                f"{r['ms']:.0f}",
                f"{r['ms'] / b['ms']:.2f}",
                f"{r['cpu_ms'] / b['cpu_ms']:.2f}",
                f"{r['loss']:.4f}",
            ]
        )
    return rows


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return "unknown CPU"
    name = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in info.splitlines()
            if ln.startswith("model name")
        ),
        "unknown CPU",
    )
    flags = [f for f in ("avx512_bf16", "amx_bf16") if f in info]
    return f"{name}, bf16 flags: {', '.join(flags) or 'none'}"


def main():
    load_before = os.getloadavg()
    results = measure(POLICIES)
    env = dict(os.environ)
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), NO_REMAP],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    no_remap = json.loads(done.stdout.strip().splitlines()[-1])
    load_after = os.getloadavg()
    headers = [
        "model",
        "policy",
        f"step peak MiB at {BATCH} (range)",
        "/ float32",
        "kept for backward MiB",
        "/ float32",
        "step ms",
        "/ float32",
        "CPU time / float32",
        "last loss",
    ]
    rows = rows_for(results) + rows_for(no_remap, ", remapping off")
    ck = "tfmemopt.Model(acc=4, ckpt=auto)"

    def ratio(res, field):
        return res[ck + "|mixed_bfloat16"][field] / res[ck + "|float32"][field]

    body = (
        "## Mixed precision (benchmarks/precision.py)\n\n"
        f"MLP {FEATURES} -> {DEPTH} x Dense({WIDTH}, relu) -> Dense(1, "
        "float32), SGD, one `train_on_batch` per step at batch "
        f"{BATCH}, policy set with `tfmemopt.mixed_precision.configure`. "
        "Step peak: CPU:0 allocator peak above the memory held before the "
        "step. Kept for backward: allocator bytes at the end of a "
        "(micro-)batch's forward pass (read by a `tf.py_function` in the "
        "loss that the backward pass waits for) minus the bytes held "
        "before the step, largest over the micro-batches: the activation "
        f"memory. Medians of {REPEATS} interleaved runs; step time: median "
        f"over runs of the mean of {STEPS} steps, wall and process CPU "
        "time. Rows marked 'remapping off' ran in a second process with "
        "`tf.config.optimizer.set_experimental_options({'remapping': "
        f"False}})`. Load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after (shared 2-core machine: timings are "
        f"noisy, read the ratios). CPU: {cpu_model()}.\n\n"
        + table(headers, rows)
        + "\n\nWhat 16 bits save here (mechanism measured with the "
        "profiler's allocation events, see "
        "tests/precision/test_mixed_precision.py): "
        "the activations kept for the backward pass halve "
        f"({ratio(results, 'kept'):.2f}x"
        " with accumulation and checkpointing; the float32 output layer's "
        "input cast keeps plain Keras and accumulation a little above "
        "0.5x). The step peak shrinks less because it also holds per-op "
        "temporaries: with grappler's remapping on (the default), Dense's "
        "MatMul+BiasAdd(+ReLU) runs as oneDNN's fused kernel, and its "
        "bfloat16 version allocates a scratch buffer about three times "
        "its 16-bit output (1.5 MiB for a 0.5 MiB output of 2048 x 128; "
        "float32 allocates none), and the weight-gradient MatMul takes "
        "one about as large as its 16-bit input gradient. With "
        "checkpointing, where only a few activations are alive at "
        "once, that scratch is most of the peak: bf16 step peak "
        f"{ratio(results, 'peak'):.2f}"
        "x of float32 with remapping on, "
        f"{ratio(no_remap, 'peak'):.2f}"
        "x with it off (what remains above 0.5x is the float32 output "
        "layer's cast of its 128-wide input, recomputed in the backward "
        "pass). Nothing tfmemopt stores (micro-batch slices, checkpoint "
        "boundaries, recomputed activations) is float32 under "
        "mixed_bfloat16; its gradient accumulators are float32 by design. "
        "mixed_float16 runs with remapping off only: with it on, one step "
        "took 84-104 s here, since oneDNN's fused float16 "
        "MatMul+BiasAdd+ReLU took 457 ms per 2048 x 128 x 128 call against "
        "0.7 ms unfused (measured once, by hand). "
        "On this CPU (bf16 instructions: AVX512_BF16, AMX) bf16 steps "
        "took about half of float32's time with remapping on; "
        "`configure('auto')` still picks float32 on every CPU (CPUs "
        "without bf16 instructions, as measured here before, ran them slower)."
        " On GPU: not measured (no GPU on this machine)."
    )
    print(body)
    write_section("precision", body)


if __name__ == "__main__":
    tf.get_logger().setLevel("ERROR")
    if NO_REMAP in sys.argv:
        tf.config.optimizer.set_experimental_options({"remapping": False})
        print(json.dumps(measure(POLICIES_NO_REMAP)))
    else:
        main()
