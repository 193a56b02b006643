"""How long gathered weights live in the train step, `shard_parameters=True`.

One child process on 2 logical CPUs (`MirroredStrategy`, R = 2) builds two
models, each sharded without checkpointing, with every block checkpointed,
and with every block checkpointed as before a segment's parts waited for
its inputs (patched back, side by side), and reads the graph Keras runs for
one train step (`tfmemopt/estimate/_gathered_liveness.py`): one replica's
ops, simulated in the graph's order (each tensor freed after its last
reader), with the gathers run ahead of the compute, and in the order
TensorFlow's executor ran them in one step profiled in `fit`. It reports
the gathered bytes alive at the step's peak and at most, against the
whole weights and the largest segment's. Logical CPUs share one
allocator, so a replica's own peak cannot be read from it: these are
simulated from the graph (what the executor can free), not allocator
measurements.

- "Dense x4": 4 Dense(1024, relu) blocks and a Dense(10) head, batch 256
  per replica (each block keeps 1 MiB of activations; its kernel is 4 MiB).
- "transformer x4": Embedding(2000, 128), 4 blocks (MultiHeadAttention with
  4 heads of 32, LayerNormalization, Dense(512) and Dense(128)), a
  Dense(2000) head; 8 sequences of 64 tokens per replica.

Run by hand: `python benchmarks/gathered_liveness.py` (writes the
`gathered_liveness` section of BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

REPLICAS = 2
BLOCKS = [f"block{i}" for i in range(4)]


def child() -> dict:
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * REPLICAS
    )
    import keras
    import numpy as np

    import tfmemopt
    from tfmemopt.estimate._gathered_liveness import gathered_liveness
    from tfmemopt.estimate._gathered_liveness import whole_bytes

    strategy = tf.distribute.MirroredStrategy(
        [f"CPU:{i}" for i in range(REPLICAS)]
    )

    class Block(keras.layers.Layer):
        def __init__(self, width, **kwargs):
            super().__init__(**kwargs)
            self.attention = keras.layers.MultiHeadAttention(4, 32)
            self.norm1 = keras.layers.LayerNormalization()
            self.norm2 = keras.layers.LayerNormalization()
            self.up = keras.layers.Dense(4 * width, activation="gelu")
            self.down = keras.layers.Dense(width)

        def call(self, x):
            h = self.norm1(x)
            x = x + self.attention(h, h, use_causal_mask=True)
            return x + self.down(self.up(self.norm2(x)))

    def dense_model():
        inp = keras.Input((1024,))
        h = inp
        for name in BLOCKS:
            h = keras.layers.Dense(1024, activation="relu", name=name)(h)
        return inp, keras.layers.Dense(10, name="head")(h)

    def transformer():
        inp = keras.Input((64,), dtype="int32")
        h = keras.layers.Embedding(2000, 128, name="embedding")(inp)
        for name in BLOCKS:
            h = Block(128, name=name)(h)
        return inp, keras.layers.Dense(2000, name="head")(h)

    rng = np.random.default_rng(0)
    data = {
        "Dense x4": (
            dense_model,
            rng.normal(size=(256 * REPLICAS, 1024)).astype("float32"),
            rng.integers(0, 10, size=(256 * REPLICAS,)),
        ),
        "transformer x4": (
            transformer,
            rng.integers(0, 2000, size=(8 * REPLICAS, 64)).astype("int32"),
            rng.integers(0, 2000, size=(8 * REPLICAS, 64)),
        ),
    }
    from tfmemopt.checkpointing import _recompute

    held = _recompute._parts_after
    variants = {
        "none": None,
        "every block": BLOCKS,
        # As before the segments' parts waited for their inputs.
        "every block, gathers not held back": BLOCKS,
    }
    rows = []
    for name, (make, x, y) in data.items():
        for variant, checkpointing in variants.items():
            if variant.endswith("not held back"):
                _recompute._parts_after = lambda values, parts, ready: values
            else:
                _recompute._parts_after = held
            with strategy.scope():
                inp, out = make()
                model = tfmemopt.Model(
                    inp,
                    out,
                    shard_parameters=True,
                    checkpointing=checkpointing,
                )
                model.compile(
                    keras.optimizers.Adam(1e-3),
                    keras.losses.SparseCategoricalCrossentropy(
                        from_logits=True
                    ),
                )
            report = gathered_liveness(
                model, x, y, started=_profiled_step(model, x, y)
            )
            blocks = [
                whole_bytes(model.get_layer(b).trainable_weights)
                for b in BLOCKS
            ]
            inside = {
                id(w)
                for b in BLOCKS
                for w in model.get_layer(b).trainable_weights
            }
            outside = [
                w for w in model.trainable_weights if id(w) not in inside
            ]
            rows.append(
                {
                    "model": name,
                    "checkpointing": variant,
                    "whole": whole_bytes(model.trainable_weights),
                    "largest_segment": max(blocks),
                    "outside": whole_bytes(outside),
                    "largest_weight": max(
                        whole_bytes([w]) for w in model.trainable_weights
                    ),
                    "gathers": report.gathers,
                    "orders": {
                        k: v._asdict() for k, v in report.orders.items()
                    },
                }
            )
    _recompute._parts_after = held
    return {"rows": rows}


def _profiled_step(model, x, y) -> dict:
    """Op name -> start time (ps) in one train step run by `fit`, read from
    a TensorFlow profile (the host tracer records each kernel it runs).

    The step is run once first (tracing, grappler), on the batch shape
    `gathered_liveness` traces, so the profiled function is the same
    concrete function (same op names).
    """
    import glob
    import tempfile

    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(
        len(x), drop_remainder=True
    )
    model.fit(data, epochs=2, verbose=0, shuffle=False)
    logdir = tempfile.mkdtemp()
    tf.profiler.experimental.start(logdir)
    model.fit(data, epochs=1, verbose=0, shuffle=False)
    tf.profiler.experimental.stop()
    (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    prefix = "StatefulPartitionedCall/"
    started = {}
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if not name.startswith(prefix) or ":" not in name:
                    continue
                op = name[len(prefix) :].rsplit(":", 1)[0]
                at = line.timestamp_ns * 1000 + event.offset_ps
                started[op] = min(at, started.get(op, at))
    return started


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def main():
    from _report import table
    from _report import write_section

    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print("@@" + json.dumps(child()))
        return
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child"],
        capture_output=True,
        text=True,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("@@")]
    if proc.returncode or not lines:
        sys.exit(proc.stderr[-4000:])
    rows = json.loads(lines[-1][2:])["rows"]
    body = []
    for r in rows:
        for order in ("graph", "gathers_first", "executed"):
            o = r["orders"][order]
            body.append(
                [
                    r["model"],
                    r["checkpointing"],
                    order,
                    _mib(r["whole"]),
                    _mib(r["largest_segment"]),
                    _mib(r["outside"]),
                    r["gathers"],
                    _mib(o["peak"]),
                    _mib(o["gathered_at_peak"]),
                    _mib(o["max_whole"]),
                    _mib(o["max_gathered"]),
                ]
            )
    text = (
        "`shard_parameters=True`, R = 2 logical CPUs: gathered weights "
        "alive in one replica's train step, read from the graph Keras "
        "runs (`one_step_on_data`), simulated with each tensor freed after "
        "its last reader (`tfmemopt/estimate/_gathered_liveness.py`). "
        "MiB. *Whole alive* counts the whole weights the layers read; "
        "*gathered alive* adds the all-gather's own copies (its "
        "unpadding copy and the join of the parts). Orders: *graph*, the "
        "order the ops were traced in; *gathers_first*, every op an "
        "all-gather needs or makes run before any other ready op (gathers "
        "ahead of the compute); *executed*, the order TensorFlow's "
        "executor started the ops in one profiled step of `fit` (ops "
        "fused by grappler placed with their first timed reader; one "
        "run, it varies from run to run). Simulated liveness, not "
        "allocator measurements (logical CPUs share one allocator).\n\n"
        + table(
            [
                "model",
                "checkpointing",
                "order",
                "whole weights",
                "largest segment",
                "outside segments",
                "gathers / step",
                "step peak",
                "gathered alive at peak",
                "whole alive, max",
                "gathered alive, max",
            ],
            body,
        )
    )
    print(text)
    print(json.dumps(rows, indent=1))
    write_section("gathered_liveness", text)


if __name__ == "__main__":
    main()
