"""`shard_parameters=True` (FSDP) against whole weights on 2 and 4 CPUs.

For each replica count R (one child process each: the CPU must be split
before TensorFlow starts), one process builds the same MLP under
`MirroredStrategy` as a `tfmemopt.Model` six ways: Adam with whole weights,
`ShardedOptimizer(Adam)` at stage 1 and 2, Adam with
`shard_parameters=True`, and tfmemopt's `AdamW8bit` with whole weights and
with `shard_parameters=True`. It measures

- the bytes on each device of every variable created for the model that is
  still alive after training (weights, optimizer state, anything the
  implementation keeps): a `tf.variable_creator_scope` records them;
- the step time, as the median over interleaved rounds (the variants take
  turns, so load on this shared machine hits them alike), as a ratio to
  Adam with whole weights (AdamW8bit: to AdamW8bit with whole weights).

Run by hand: `python benchmarks/fsdp.py` (writes the
`param_sharding` section of BENCHMARKS.md).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
import weakref

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

ROUNDS = int(os.environ.get("TFMEMOPT_BENCH_ROUNDS", "5"))
STEPS = 4
BATCH = 256
WIDTHS = (784, 1023, 1021, 10)
VARIANTS = (
    "Adam, whole weights",
    "Adam, ShardedOptimizer stage 1",
    "Adam, ShardedOptimizer stage 2",
    "Adam, shard_parameters",
    "AdamW8bit, whole weights",
    "AdamW8bit, shard_parameters",
    # bfloat16 weights with 8-bit state and stochastic rounding (#47): the
    # smallest model state per device; failed at the first step before.
    "bf16 AdamW8bit(stochastic), whole weights",
    "bf16 AdamW8bit(stochastic), shard_parameters",
)
SEEDS = (0, 1, 2, 3)


def _base(variant: str) -> str:
    if variant.startswith("bf16"):
        return "bf16 AdamW8bit(stochastic), whole weights"
    return (
        "AdamW8bit, whole weights"
        if "8bit" in variant
        else "Adam, whole weights"
    )


def child(replicas: int) -> dict:
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * replicas
    )
    import keras
    import numpy as np

    import tfmemopt
    from tfmemopt.distribute import ShardedOptimizer
    from tfmemopt.optimizers import AdamW8bit

    strategy = tf.distribute.MirroredStrategy(
        [f"CPU:{i}" for i in range(replicas)]
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * STEPS, WIDTHS[0])).astype("float32")
    y = rng.integers(0, WIDTHS[-1], size=(BATCH * STEPS,))
    refs = {v: [] for v in VARIANTS}

    def recorder(variant):
        def creator(next_creator, **kwargs):
            made = next_creator(**kwargs)
            refs[variant].append(weakref.ref(made))
            return made

        return tf.variable_creator_scope(creator)

    def build(variant, seed=0):
        keras.utils.set_random_seed(seed)
        keras.config.set_dtype_policy(
            "bfloat16" if variant.startswith("bf16") else "float32"
        )
        try:
            return _build(variant)
        finally:
            keras.config.set_dtype_policy("float32")

    def _build(variant):
        with strategy.scope(), recorder(variant):
            inputs = keras.Input((WIDTHS[0],))
            h = inputs
            for width in WIDTHS[1:-1]:
                h = keras.layers.Dense(width, activation="relu")(h)
            outputs = keras.layers.Dense(WIDTHS[-1])(h)
            model = tfmemopt.Model(
                inputs, outputs, shard_parameters="shard_param" in variant
            )
            if variant.startswith("bf16"):
                opt = AdamW8bit(1e-3, block_size=256, bf16_update="stochastic")
            elif "8bit" in variant:
                opt = AdamW8bit(1e-3, block_size=256)
            else:
                opt = keras.optimizers.Adam(1e-3)
            if "stage" in variant:
                opt = ShardedOptimizer(opt, stage=int(variant[-1]))
            model.compile(
                optimizer=opt,
                loss=keras.losses.SparseCategoricalCrossentropy(True),
            )
        return model

    def live_bytes(variant):
        gc.collect()
        out = {}
        for ref in refs[variant]:
            v = ref()
            for c in getattr(v, "values", [v]) if v is not None else []:
                device = c.device[c.device.find("device:") :]
                out[device] = out.get(device, 0) + (
                    int(np.prod(c.shape)) * c.dtype.size
                )
        return max(out.values())

    models = {v: build(v) for v in VARIANTS}

    def run(variant):
        with recorder(variant):
            start = time.perf_counter()
            models[variant].fit(
                x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0
            )
            return (time.perf_counter() - start) / STEPS

    for v in VARIANTS:  # warm-up: traces the step
        run(v)
    times = {v: [] for v in VARIANTS}
    for _ in range(ROUNDS):
        for v in VARIANTS:
            times[v].append(run(v))
    params = int(sum(np.prod(w.shape) for w in models[VARIANTS[0]].weights))
    out = {"params": params, "rows": {}}
    for v in VARIANTS:
        out["rows"][v] = {
            "bytes": live_bytes(v),
            "step": float(np.median(times[v])),
        }
    # The bfloat16 recipe's loss after one epoch, whole against sharded
    # weights, over several seeds: the seeds' spread is the yardstick.
    seed_losses = out["seed_losses"] = {}
    for v in VARIANTS[-2:]:
        seed_losses[v] = []
        for seed in SEEDS:
            model = build(v, seed)
            history = model.fit(
                x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0
            )
            seed_losses[v].append(float(history.history["loss"][-1]))
    return out


def main():
    from _report import table
    from _report import write_section

    from tfmemopt._utils import format_mib

    results = {}
    for replicas in (2, 4):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", str(replicas)],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [
            line for line in proc.stdout.splitlines() if line.startswith("{")
        ]
        if proc.returncode != 0 or not lines:
            raise SystemExit(proc.stderr[-4000:])
        results[replicas] = json.loads(lines[-1])
    rows = []
    for replicas, res in results.items():
        for v in VARIANTS:
            row = res["rows"][v]
            base = res["rows"][_base(v)]
            rows.append(
                [
                    replicas,
                    v,
                    format_mib(row["bytes"]),
                    f"{row['bytes'] / base['bytes']:.3f}",
                    f"{row['bytes'] / res['params']:.2f}",
                    f"{row['step'] * 1000:.1f} ms",
                    f"{row['step'] / base['step']:.2f}",
                ]
            )
    params = results[2]["params"]
    body = (
        "## Parameter sharding, FSDP (`benchmarks/fsdp.py`)\n\n"
        f"An MLP {' -> '.join(str(w) for w in WIDTHS)} ({params} "
        "parameters, no size a multiple of 4) as a `tfmemopt.Model` under "
        "`MirroredStrategy` over R logical CPUs, global batch "
        f"{BATCH}. Bytes: the largest device's bytes of every variable "
        "created for the model that is still alive after training "
        "(weights, optimizer state, what the implementation keeps; "
        "gradients and gathered weights are step temporaries, not "
        "variables). Step time: median of "
        f"{ROUNDS} interleaved rounds of {STEPS} steps, as a ratio to the "
        "same optimizer with whole weights; a shared 2-core machine "
        "running R logical devices: rough.\n\n"
        + table(
            [
                "R",
                "variant",
                "variables per device",
                "vs whole weights",
                "bytes / parameter",
                "step",
                "step ratio",
            ],
            rows,
        )
    )
    body += (
        "\n\nThe bfloat16 recipe (bfloat16 weights, `AdamW8bit("
        'bf16_update="stochastic")`): the loss after one epoch for seeds '
        f"{', '.join(map(str, SEEDS))}, whole weights against "
        "`shard_parameters=True` (the gradients of bfloat16 weights are "
        "exchanged and summed in float32: TensorFlow's collectives take no "
        "bfloat16).\n\n"
        + table(
            ["R", "whole weights", "shard_parameters", "largest |diff|"],
            [
                [
                    replicas,
                    ", ".join(f"{v:.4f}" for v in whole),
                    ", ".join(f"{v:.4f}" for v in sharded),
                    f"{max(abs(a - b) for a, b in zip(whole, sharded)):.4f}",
                ]
                for replicas, res in results.items()
                for whole, sharded in [list(res["seed_losses"].values())[-2:]]
            ],
        )
    )
    write_section("param_sharding", body)
    print(body)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]))))
    else:
        main()
