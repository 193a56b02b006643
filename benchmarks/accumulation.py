"""Gradient accumulation: peak memory and samples/s, side by side.

For an activation-dominated MLP and a small transformer, in one process:

- plain `keras.Model.fit` at batch B;
- plain fit at B/N (the memory one would have to settle for);
- `tfmemopt.Model(accumulation_steps=N)` at B (the full-batch update);
- Keras's built-in `gradient_accumulation_steps=N` at B/N;
- the gradient-accumulator package's `GradientAccumulateModel` at B/N, where
  it imports (0.5.2 does, for the model wrapper; `pip install --no-deps
  gradient-accumulator` since it pins numpy<=1.23).

Peak: extra bytes of `CPU:0` (oneDNN allocator) during one training step,
median of repeats. Throughput: samples/s of `fit` over the same data, median
of repeats, reported as a ratio to plain fit at B/N.

Run: `python benchmarks/accumulation.py` (writes its section of BENCHMARKS.md);
`JIT_COMPILE=1` compiles every variant with XLA (section `accumulation_xla`,
TensorFlow's CPU allocator grown first, `_report.grow_allocator`).
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _report  # noqa: E402

import tfmemopt  # noqa: E402

N = 8
REPEATS = int(os.environ.get("REPEATS", "3"))
ROUNDS = int(os.environ.get("ROUNDS", "8"))


def mlp(cls, **kwargs):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,))
    h = inputs
    for _ in range(6):
        h = keras.layers.Dense(512, activation="relu")(h)
    return cls(inputs, keras.layers.Dense(10)(h), **kwargs)


def transformer(cls, **kwargs):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64,), dtype="int32")
    h = keras.layers.Embedding(1000, 128)(inputs)
    for _ in range(2):
        a = keras.layers.LayerNormalization()(h)
        a = keras.layers.MultiHeadAttention(4, 32)(a, a)
        h = h + a
        f = keras.layers.LayerNormalization()(h)
        f = keras.layers.Dense(512, activation="gelu")(f)
        h = h + keras.layers.Dense(128)(f)
    outputs = keras.layers.Dense(1000)(h)
    return cls(inputs, outputs, **kwargs)


def data(kind, n):
    rng = np.random.default_rng(0)
    if kind == "mlp":
        return (
            rng.normal(size=(n, 64)).astype("float32"),
            rng.integers(0, 10, size=(n,)),
        )
    x = rng.integers(0, 1000, size=(n, 64)).astype("int32")
    return x, np.roll(x, -1, axis=1)


def gradient_accumulator_model():
    try:
        from gradient_accumulator import GradientAccumulateModel
    except Exception as e:  # noqa: BLE001 - report why it does not run
        return None, f"{type(e).__name__}: {e}"[:80]

    return GradientAccumulateModel, None


def variants(build, batch):
    micro = batch // N
    ga_cls, ga_error = gradient_accumulator_model()

    def plain(bs):
        return lambda: (build(keras.Model), {}, bs)

    def ours():
        return build(tfmemopt.Model, accumulation_steps=N), {}, batch

    def keras_builtin():
        return (
            build(keras.Model),
            {"gradient_accumulation_steps": N},
            micro,
        )

    def ga():
        base = build(keras.Model)
        model = ga_cls(accum_steps=N, inputs=base.input, outputs=base.output)
        return model, {}, micro

    out = [
        (f"plain fit, batch {batch}", plain(batch)),
        (f"plain fit, batch {micro}", plain(micro)),
        (f"tfmemopt.Model N={N}, batch {batch}", ours),
        (
            f"Keras gradient_accumulation_steps={N}, batch {micro}",
            keras_builtin,
        ),
    ]
    if ga_cls is not None:
        out.append((f"GradientAccumulateModel N={N}, batch {micro}", ga))
    else:
        out.append((f"GradientAccumulateModel ({ga_error})", None))
    return out


def prepare(make, kind, n_samples):
    model, opt_kwargs, batch = make()
    model.compile(
        keras.optimizers.Adam(1e-4, **opt_kwargs),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=_report.JIT,
    )
    x, y = data(kind, n_samples)
    model.fit(x[: 2 * batch], y[: 2 * batch], batch_size=batch, verbose=0)
    peaks = []
    for _ in range(REPEATS):
        peak, _ = tfmemopt.memory.measure_peak(
            lambda: model.train_on_batch(x[:batch], y[:batch])
        )
        peaks.append(peak)
    return model, x, y, batch, _report.median(peaks)


def timed_fit(model, x, y, batch):
    """(samples per wall second, samples per CPU second) of one epoch."""
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
    return (
        len(x) / (time.perf_counter() - wall),
        len(x) / (time.process_time() - cpu),
    )


def run_kind(kind, build, batch):
    """Peaks one variant at a time; throughput in interleaved rounds, so
    that load from other processes falls on every variant alike."""
    prepared = []
    for label, make in variants(build, batch):
        if make is None:
            prepared.append((label, None))
            continue
        try:
            prepared.append((label, prepare(make, kind, 4 * batch)))
        except Exception as e:  # noqa: BLE001 - a row says it broke
            prepared.append((f"{label} (failed: {type(e).__name__})", None))
    rates = {label: [] for label, _ in prepared}
    for _ in range(ROUNDS):
        for label, p in prepared:
            if p is not None:
                model, x, y, b, _ = p
                rates[label].append(timed_fit(model, x, y, b))
    results = []
    for label, p in prepared:
        if p is None:
            results.append((label, None, None, None))
            continue
        wall = _report.median([r[0] for r in rates[label]])
        cpu = _report.median([r[1] for r in rates[label]])
        results.append((label, p[4], wall, cpu))
        print(kind, label, p[4], wall, cpu, flush=True)
    return results


def main():
    if _report.JIT:
        _report.grow_allocator()
    sections = []
    for kind, build, batch in (
        ("mlp", mlp, 4096),
        ("transformer", transformer, 64),
    ):
        keras.backend.clear_session()
        results = run_kind(kind, build, batch)
        plain_peak = results[0][1]
        micro_wall, micro_cpu = results[1][2], results[1][3]
        rows = []
        for label, peak, wall, cpu in results:
            if peak is None:
                rows.append((label, "-", "-", "-", "-"))
                continue
            rows.append(
                (
                    label,
                    f"{peak / 2**20:.1f}",
                    f"{peak / plain_peak:.2f}",
                    f"{wall / micro_wall:.2f}",
                    f"{cpu / micro_cpu:.2f}",
                )
            )
        sections.append(
            f"### {kind} (B={batch}, N={N})\n\n"
            + _report.table(
                [
                    "variant",
                    "step peak MiB",
                    "peak / plain at B",
                    "samples/s vs plain at B/N (wall)",
                    "samples/s vs plain at B/N (CPU time)",
                ],
                rows,
            )
        )
    body = (
        "## Gradient accumulation (`benchmarks/accumulation.py`, "
        f"{_report.regime()})\n\n"
        "Peak: extra CPU:0 bytes during one training step, median of "
        f"{REPEATS}. Throughput: `fit` over 4 batches, median of {ROUNDS} "
        "interleaved rounds, as a ratio to plain fit at the micro-batch "
        "size B/N, by wall clock and by this process's CPU time (the "
        "latter is less sensitive to other processes on a shared "
        "machine).\n\n" + "\n\n".join(sections)
    )
    _report.write_section(_report.section("accumulation"), body)


if __name__ == "__main__":
    main()
