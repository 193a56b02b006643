"""ShardedOptimizer against the unwrapped optimizer on 2 and 4 logical CPUs.

For each replica count R (one child process each: the CPU must be split
before TensorFlow starts), one process builds the same MLP three times
under `MirroredStrategy`: Adam unwrapped, `ShardedOptimizer(Adam, stage=1)`
and `stage=2`, and tfmemopt's `AdamW8bit` unwrapped and in
`ShardedOptimizer(..., stage=1)` (its ratios against `AdamW8bit` unwrapped),
and measures

- the optimizer-state bytes on each device (summed over the per-device
  components of every state variable);
- the step time, as the median over interleaved rounds (the three variants
  take turns, so load on this shared machine hits them alike), as a ratio to
  the unwrapped optimizer;
- the collectives in one traced train step (`CollectiveReduceV2`,
  `CollectiveGatherV2` ...), per replica, with the bytes each replica puts
  in;
- the summed gradient a replica holds after the reduction (the whole sum at
  stage 1, its row at stage 2), from the partition layout;
- the process's CPU allocator peak during one step (all replicas share it).

Run by hand: `python benchmarks/sharding.py` (writes the `sharding` section
of BENCHMARKS.md).
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
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

ROUNDS = int(os.environ.get("TFMEMOPT_BENCH_ROUNDS", "11"))
STEPS = 8
BATCH = 512
WIDTHS = (784, 1023, 1021, 10)
VARIANTS = (
    "unwrapped",
    "stage 1",
    "stage 2",
    "AdamW8bit unwrapped",
    "AdamW8bit stage 1",
)


def _base(variant: str) -> str:
    """The unwrapped variant a variant's ratios are taken against."""
    return "AdamW8bit unwrapped" if "8bit" in variant else "unwrapped"


def child(replicas: int) -> dict:
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * replicas
    )
    import keras
    import numpy as np

    from tfmemopt.distribute import ShardedOptimizer
    from tfmemopt.optimizers import AdamW8bit

    strategy = tf.distribute.MirroredStrategy(
        [f"CPU:{i}" for i in range(replicas)]
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * STEPS, WIDTHS[0])).astype("float32")
    y = rng.integers(0, WIDTHS[-1], size=(BATCH * STEPS,))

    def build(variant):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            layers = [keras.Input((WIDTHS[0],))]
            for w in WIDTHS[1:-1]:
                layers.append(keras.layers.Dense(w, activation="relu"))
            layers.append(keras.layers.Dense(WIDTHS[-1]))
            model = keras.Sequential(layers)
            if "8bit" in variant:
                opt = AdamW8bit(1e-3)
            else:
                opt = keras.optimizers.Adam(1e-3)
            if "stage" in variant:
                opt = ShardedOptimizer(opt, stage=int(variant[-1]))
            model.compile(
                optimizer=opt,
                loss=keras.losses.SparseCategoricalCrossentropy(True),
            )
        model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, verbose=0)
        return model

    models = {v: build(v) for v in VARIANTS}
    params = sum(int(np.prod(w.shape)) for w in models["unwrapped"].weights)
    out = {"replicas": replicas, "params": params, "variants": {}}
    for variant, model in models.items():
        opt = model.optimizer
        state = opt.state_variables if "stage" in variant else opt.variables
        per_device = {}
        for v in state:
            for c in strategy.experimental_local_results(v.value):
                per_device[c.device] = per_device.get(c.device, 0) + (
                    int(np.prod(c.shape)) * c.dtype.size
                )
        out["variants"][variant] = {
            "state_bytes": max(per_device.values()),
            "collectives": _collectives(
                strategy, model, x, y, replicas, _gather_bytes(opt)
            ),
            "summed_grad_bytes": _held_gradient(opt, params, replicas),
            "times": [],
            "cpu_times": [],
            "peaks": [],
        }
    for _ in range(ROUNDS):
        for variant, model in models.items():
            tf.config.experimental.reset_memory_stats("CPU:0")
            base = tf.config.experimental.get_memory_info("CPU:0")["current"]
            start, cpu = time.perf_counter(), time.process_time()
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
            seconds = (time.perf_counter() - start) / STEPS
            cpu_seconds = (time.process_time() - cpu) / STEPS
            peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
            rec = out["variants"][variant]
            rec["times"].append(seconds)
            rec["cpu_times"].append(cpu_seconds)
            rec["peaks"].append(peak - base)
    return out


def _held_gradient(opt, params, replicas):
    if not hasattr(opt, "stage"):
        return params * 4
    rows = sum(p.layout.part_size for p in opt._plan.refs)
    return rows * 4 if opt.stage == 2 else params * 4


def _gather_bytes(opt):
    # The data all-gather's input is padded at run time (no static shape):
    # its size is the sum of the partitions.
    if not hasattr(opt, "stage"):
        return 0
    return sum(p.layout.part_size for p in opt._plan.refs) * 4


def _collectives(strategy, model, x, y, replicas, gather_bytes):
    import tensorflow as tf

    @tf.function
    def step(xb, yb):
        return strategy.run(model.train_step, args=((xb, yb),))

    xb = tf.constant(x[: BATCH // replicas])
    yb = tf.constant(y[: BATCH // replicas])
    graph = step.get_concrete_function(xb, yb).graph
    counts, nbytes = {}, {}
    for op in graph.get_operations():
        if not op.type.startswith("Collective"):
            continue
        t = op.inputs[0]
        n = t.shape.num_elements()
        size = gather_bytes if n is None else n * t.dtype.size
        # Shapes and scalar statistics apart from the data.
        kind = op.type if size >= 1024 else op.type + " (<1 KiB)"
        counts[kind] = counts.get(kind, 0) + 1
        nbytes[kind] = nbytes.get(kind, 0) + size
    # The graph holds every replica's copy of each collective.
    return {
        k: [counts[k] // replicas, nbytes[k] // replicas]
        for k in sorted(counts)
    }


def _fmt_collectives(c):
    def name(k):
        k = k.replace("CollectiveReduceV2", "all-reduce")
        return k.replace("CollectiveGatherV2", "all-gather")

    return ", ".join(
        f"{n} {name(k)}" + ("" if "<1 KiB" in k else f" ({b / 2**20:.2f} MiB)")
        for k, (n, b) in c.items()
    )


def main():
    import _report

    results = []
    for replicas in (2, 4):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", str(replicas)],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        lines = [
            line for line in proc.stdout.splitlines() if line.startswith("{")
        ]
        if proc.returncode != 0 or not lines:
            raise SystemExit(proc.stderr[-4000:])
        results.append(json.loads(lines[-1]))
    rows = []
    for res in results:
        r = res["replicas"]
        for variant, rec in res["variants"].items():
            base = res["variants"][_base(variant)]
            t0 = _report.median(base["times"])
            t = _report.median(rec["times"])
            cpu = _report.median(rec["cpu_times"])
            cpu0 = _report.median(base["cpu_times"])
            rows.append(
                [
                    r,
                    variant,
                    f"{rec['state_bytes'] / 2**20:.2f} MiB",
                    f"{rec['state_bytes'] / base['state_bytes']:.3f}",
                    f"{rec['summed_grad_bytes'] / 2**20:.2f} MiB",
                    f"{t * 1e3:.1f} ms",
                    f"{t / t0:.2f}",
                    f"{cpu / cpu0:.2f}",
                    f"{_report.median(rec['peaks']) / 2**20:.1f} MiB",
                    _fmt_collectives(rec["collectives"]),
                ]
            )
    params = results[0]["params"]
    body = (
        "## ShardedOptimizer (`benchmarks/sharding.py`)\n\n"
        "Adam (and tfmemopt's AdamW8bit, block size 256, its ratios against "
        "AdamW8bit unwrapped)"
        f" on an MLP {' -> '.join(map(str, WIDTHS))} ({params} "
        "parameters, no size a multiple of 4), `MirroredStrategy` over R "
        f"logical CPUs, global batch {BATCH}. Step time: median of {ROUNDS} "
        f"interleaved rounds of {STEPS} steps. State: bytes on each device "
        "of the optimizer's variables (all components). Summed gradient: "
        "what a replica holds after the reduction. Collectives: per replica "
        "per step, counted in the traced step, with the bytes each replica "
        "puts in (the all-gather's: each replica's part). Peak: the "
        "process's CPU allocator (all replicas share it) above the start of "
        "the 8 steps, i.e. a step's transient memory; the persistent state "
        "is the state column, times R devices. Step ratios come from a "
        "shared 2-core machine running R logical devices: rough.\n\n"
        + _report.table(
            [
                "R",
                "optimizer",
                "state per device",
                "vs unwrapped",
                "summed gradient held",
                "step",
                "step ratio (wall)",
                "step ratio (CPU)",
                "step peak (all replicas)",
                "collectives per step",
            ],
            rows,
        )
        + "\n\nOn paper, bytes per parameter with Adam in float32 "
        "(weights 4, gradient 4, moments 8):\n\n"
        + _report.table(
            ["R", "unwrapped", "stage 1: 4 + 4 + 8/R", "stage 2: 4 + 12/R"],
            [[r, 16, f"{8 + 8 / r:g}", f"{4 + 12 / r:g}"] for r in (2, 4, 8)],
        )
    )
    _report.write_section("sharding", body)
    print(body)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]))))
    else:
        main()
