"""The parts of `benchmarks/accelerator.py`: one function per claim.

Each part takes a `Context` (see accelerator.py): `ctx.smoke` picks the
small sizes, `ctx.device` is the device measured (`"GPU:0"`, or `"CPU:0"`
in smoke mode), `ctx.over()` says the part's time budget is spent (a loop
then stops and the part is marked cut), and `ctx.figure(...)` records one
figure at once (written to the JSON before the part goes on), with the
BENCHMARKS.md cell that holds its CPU counterpart, where one exists.
A part raises `Skip(reason)` when it cannot run here.
"""

from __future__ import annotations

import gc
import statistics
import time

import keras
import numpy as np
import tensorflow as tf

import tfmemopt
from tfmemopt import memory

MIB = 2**20


NO_OOM_ON_CPU = (
    "no accelerator: a CPU process does not run out of memory at a batch "
    "this run can afford (the CPU figures in BENCHMARKS.md use a memory "
    "budget instead); --simulate-oom runs this part against a layer that "
    "raises ResourceExhaustedError"
)


class Skip(Exception):
    """The part cannot run on this machine; the message says why."""


# -- shared helpers ---------------------------------------------------------


def mib(n) -> float | None:
    return None if n is None else round(n / MIB, 1)


def ratio(a, b, digits=2):
    """a / b rounded, or None where b is zero or unknown (nothing counted:
    on CPU, oneDNN's statistics skip allocations under 256 KiB)."""
    if a is None or not b:
        return None
    return round(a / b, digits)


def loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def mlp(inputs, widths, classes=10, cls=keras.Model, **kwargs):
    keras.utils.set_random_seed(0)
    inp = keras.Input((inputs,))
    h = inp
    for w in widths:
        h = keras.layers.Dense(w, activation="relu")(h)
    out = keras.layers.Dense(classes, dtype="float32")(h)
    return cls(inp, out, **kwargs)


def data(n, features, classes=10):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, features)).astype("float32")
    return x, rng.integers(0, classes, size=(n,))


def step_peak(ctx, step, repeats=3):
    """Median bytes one `step()` needs above what was held before it."""
    peaks = []
    for _ in range(repeats):
        peak, _ = memory.measure_peak(step, ctx.device)
        peaks.append(peak)
    return statistics.median(peaks)


def interleaved_times(ctx, steps: dict, rounds: int, per_round: int = 3):
    """Median seconds per call of each `steps[name]()`, taken in turns.

    Stops early when the part's budget is spent (at least one round runs).
    Each call returns a value read back on the host (`train_on_batch`
    returns NumPy), so device work is finished when the clock stops.
    """
    times = {name: [] for name in steps}
    for r in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(per_round):
                step()
            times[name].append((time.perf_counter() - start) / per_round)
        if ctx.over() and r + 1 < rounds:
            ctx.cut(f"timing stopped after {r + 1} of {rounds} rounds")
            break
    return {name: statistics.median(t) for name, t in times.items()}


def state_bytes(opt) -> int:
    """Bytes of an optimizer's variables, step counter and rate aside."""
    skip = {id(opt.iterations)}
    lr = getattr(opt, "_learning_rate", None)
    if isinstance(lr, keras.Variable):
        skip.add(id(lr))
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        for v in opt.variables
        if id(v) not in skip
    )


def fresh():
    keras.backend.clear_session()
    gc.collect()


# -- memory as users read it ----------------------------------------------


def part_memory(ctx):
    """MemoryMonitor's logs against the allocator and NVML, after `fit`."""
    dev = ctx.device
    fresh()
    width = ctx.size(4096, 512)
    model = mlp(ctx.size(1024, 64), [width] * 2)
    model.compile(keras.optimizers.Adam(1e-4), loss())
    batch, steps = ctx.size(1024, 256), ctx.size(4, 2)
    x, y = data(batch * steps, model.input_shape[-1])
    monitor = tfmemopt.callbacks.MemoryMonitor(
        devices=[dev], reset_peak="epoch", verbose=0
    )
    hist = model.fit(
        x, y, batch_size=batch, epochs=2, callbacks=[monitor], verbose=0
    ).history
    direct = memory.device_memory(dev)
    nvml = memory.nvml_memory(dev)
    key = f"memory/{dev}"
    ctx.data("history_keys", sorted(k for k in hist if k.startswith("memory")))
    ctx.data("jit_compile", bool(model.jit_compile))
    logged_peak = hist[f"{key}/peak_mib"][-1]
    logged_current = hist[f"{key}/current_mib"][-1]
    ctx.figure(
        "MemoryMonitor peak_mib, epoch 2",
        round(logged_peak, 1),
        "MiB",
        note=f"MLP {width}-wide, batch {batch}, Adam",
    )
    ctx.figure(
        "get_memory_info peak, read after fit",
        mib(direct["peak"]),
        "MiB",
        note="same reset point (start of epoch 2)",
    )
    ctx.figure(
        "MemoryMonitor peak / get_memory_info peak",
        ratio(logged_peak * MIB, direct["peak"], 3),
        "x",
    )
    ctx.figure(
        "MemoryMonitor current_mib / get_memory_info current",
        ratio(logged_current * MIB, direct["current"], 3),
        "x",
    )
    if nvml is None:
        why = (
            "nvidia-ml-py not installed"
            if not _has_pynvml()
            else "no NVML device for " + dev
        )
        ctx.figure("NVML used / total", "n/a", "", note=why)
    else:
        logged_used = hist.get(f"{key}/used_mib", [None])[-1]
        ctx.figure("NVML used", mib(nvml["used"]), "MiB")
        ctx.figure("NVML total", mib(nvml["total"]), "MiB")
        ctx.figure(
            "NVML used - allocator current",
            mib(nvml["used"] - direct["current"]),
            "MiB",
            note="CUDA context, cuDNN/cuBLAS and the memory TF reserved "
            "but has not handed out (TF_FORCE_GPU_ALLOW_GROWTH="
            f"{_env('TF_FORCE_GPU_ALLOW_GROWTH')})",
        )
        ctx.figure(
            "MemoryMonitor used_mib / NVML used",
            None
            if logged_used is None
            else ratio(logged_used * MIB, nvml["used"], 3),
            "x",
        )
    ctx.figure("host RSS", mib(memory.host_rss_bytes()), "MiB")


def _has_pynvml() -> bool:
    import importlib.util

    return importlib.util.find_spec("pynvml") is not None


def _env(name):
    import os

    return os.environ.get(name, "unset")


# -- estimator error against the measured step peak -------------------------


def _cnn(size, filters):
    keras.utils.set_random_seed(0)
    inp = keras.Input((size, size, 3))
    h = inp
    for f in filters:
        h = keras.layers.Conv2D(f, 3, padding="same", activation="relu")(h)
        h = keras.layers.Conv2D(f, 3, padding="same", activation="relu")(h)
        h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inp, keras.layers.Dense(10, dtype="float32")(h))


def _tiny_transformer(seq, width, blocks, vocab=1000):
    keras.utils.set_random_seed(0)
    inp = keras.Input((seq,), dtype="int32")
    h = keras.layers.Embedding(vocab, width)(inp)
    for _ in range(blocks):
        a = keras.layers.LayerNormalization()(h)
        a = keras.layers.MultiHeadAttention(4, width // 4)(a, a)
        h = h + a
        f = keras.layers.LayerNormalization()(h)
        f = keras.layers.Dense(4 * width, activation="gelu")(f)
        h = h + keras.layers.Dense(width)(f)
    return keras.Model(inp, keras.layers.Dense(vocab, dtype="float32")(h))


def _estimator_cases(ctx):
    """(name, build, optimizer factory, batch, x, y) for this mode."""
    adam = lambda: keras.optimizers.Adam(1e-4)  # noqa: E731
    w8 = lambda: tfmemopt.optimizers.AdamW8bit(1e-4)  # noqa: E731
    fac = lambda: tfmemopt.optimizers.Adafactor(1e-3)  # noqa: E731
    d, w = ctx.size(1024, 64), ctx.size(4096, 512)
    depth = ctx.size(4, 2)
    b = ctx.size(2048, 64)
    x, y = data(b, d)

    def m():
        return mlp(d, [w] * depth)

    cases = [
        (f"MLP {d}-{w}x{depth}, Adam", m, adam, b, x, y),
        (f"MLP {d}-{w}x{depth}, AdamW8bit", m, w8, b, x, y),
        (f"MLP {d}-{w}x{depth}, tfmemopt Adafactor", m, fac, b, x, y),
    ]
    if not ctx.smoke:
        cb = 256
        rng = np.random.default_rng(0)
        cx = rng.normal(size=(cb, 64, 64, 3)).astype("float32")
        cases.append(
            (
                "CNN 64x64 (64-128-256 filters), Adam",
                lambda: _cnn(64, (64, 128, 256)),
                adam,
                cb,
                cx,
                rng.integers(0, 10, cb),
            )
        )
        tb, seq = 32, 256
        tx = rng.integers(0, 1000, size=(tb, seq)).astype("int32")
        cases.append(
            (
                f"transformer 2 blocks, width 256, seq {seq}, Adam",
                lambda: _tiny_transformer(seq, 256, 2),
                adam,
                tb,
                tx,
                np.roll(tx, -1, axis=1),
            )
        )
    return cases


def part_estimator(ctx):
    """`estimate_memory` (default, every tensor counted) vs the step peak."""
    dev = ctx.device
    errors = []
    for name, build, make_opt, batch, x, y in _estimator_cases(ctx):
        if ctx.over():
            ctx.cut(f"stopped before {name!r}")
            break
        fresh()
        base = memory.device_memory(dev)["current"]
        model = build()
        model.compile(make_opt(), loss())
        model.train_on_batch(x, y)
        peaks = []
        for _ in range(3):
            memory.reset_peak(dev)
            model.train_on_batch(x, y)
            peaks.append(memory.device_memory(dev)["peak"] - base)
        measured = statistics.median(peaks)
        est = tfmemopt.estimate_memory(model, batch, optimizer=model.optimizer)
        err = None
        if measured:
            err = 100.0 * (est.total - measured) / measured
            errors.append(abs(err))
        ctx.figure(
            f"estimate vs step peak: {name}, batch {batch}",
            None if err is None else round(err, 1),
            "%",
            note=f"estimated {mib(est.total)} MiB, measured {mib(measured)} "
            f"MiB (peak above the usage before the model was built, median "
            f"of 3 steps; spread {mib(max(peaks) - min(peaks))} MiB)",
        )
        ctx.data(
            name,
            {
                "estimate": est.to_dict(),
                "peaks": peaks,
                "jit_compile": bool(model.jit_compile),
            },
        )
        del model
    if errors:
        ctx.figure(
            "estimator: median absolute error over these cases",
            round(statistics.median(errors), 1),
            "%",
            cpu=(
                "estimator_accuracy",
                r"\*\*design set\*\*.*?median \|error\| ([\d.]+%)",
            ),
            note="CPU: the design set, estimated with the CPU allocator's "
            "rules (min_counted_bytes=256 KiB), other models",
        )


# -- find_batch_size against a real out-of-memory error --------------------


class OOMAbove(keras.layers.Layer):
    """Smoke mode only: raises ResourceExhaustedError above a batch size."""

    def __init__(self, threshold, **kwargs):
        super().__init__(**kwargs)
        self.threshold = threshold

    def _raise(self, n):
        raise tf.errors.ResourceExhaustedError(
            None, None, f"OOM when allocating tensor with shape[{n},64]"
        )

    def call(self, x):
        n = x.shape[0]
        if n is not None and n > self.threshold:
            self._raise(n)

        # Keras relaxes a retraced step to an unknown batch: check at run
        # time too (a py_function keeps the error's type).
        def check(rows):
            if int(rows) > self.threshold:
                self._raise(int(rows))
            return np.float32(0.0)

        zero = tf.py_function(check, [tf.shape(x)[0]], tf.float32)
        zero.set_shape(())
        return x + zero

    def compute_output_shape(self, input_shape):
        return input_shape


def _is_oom(e) -> bool:
    if isinstance(e, tf.errors.ResourceExhaustedError):
        return True
    text = str(e).lower()
    return "out of memory" in text or "resource_exhausted" in text


def part_find_batch_size(ctx):
    """The finder's largest batch against the first batch that runs out."""
    if ctx.kind == "CPU" and not ctx.simulate_oom:
        raise Skip(NO_OOM_ON_CPU)
    fresh()
    simulated = ctx.kind == "CPU"
    if simulated:
        threshold, multiple, top = 200, 64, 1024
        keras.utils.set_random_seed(0)
        inp = keras.Input((32,))
        h = OOMAbove(threshold)(inp)
        h = keras.layers.Dense(64, activation="relu")(h)
        model = tfmemopt.Model(inp, keras.layers.Dense(10)(h))
        ctx.data("simulated", f"OOMAbove({threshold}) layer, not a device")
    else:
        multiple, top = 256, 2**17
        model = mlp(256, [4096] * 4, cls=tfmemopt.Model)
        ctx.data("gpu_memory_limit_mib", ctx.gpu_memory_limit_mib)
    model.compile(keras.optimizers.Adam(1e-4), loss())
    x, y = data(1024, model.input_shape[-1])
    start = time.perf_counter()
    found = tfmemopt.find_batch_size(
        model,
        (x, y),
        max_batch_size=top,
        multiple_of=multiple,
        steps_per_trial=1,
        device=ctx.device,
        verbose=0,
    )
    search_s = time.perf_counter() - start
    ctx.data("trials", found.table())
    ctx.figure(
        "find_batch_size: largest batch that fitted",
        found.largest_fitting,
        "samples",
        note=f"{len(found.trials)} trials in {search_s:.1f} s, multiple_of="
        f"{multiple}; batch_size after the 5% margin: {found.batch_size}",
    )

    def try_fit(b):
        reps = -(-b // len(x))
        xb, yb = np.tile(x, (reps, 1))[:b], np.tile(y, reps)[:b]
        # A fixed batch dimension, as the finder's trials have.
        ds = tf.data.Dataset.from_tensor_slices((xb, yb))
        ds = ds.batch(b, drop_remainder=True)
        try:
            model.fit(ds, epochs=1, verbose=0)
        except Exception as e:  # noqa: BLE001 - an OOM is the measurement
            if _is_oom(e):
                return e
            raise
        return None

    at_found = try_fit(found.largest_fitting)
    ctx.figure(
        "plain fit at the finder's largest batch",
        "ran" if at_found is None else "out of memory",
        "",
    )
    b, step, first_oom, err = found.largest_fitting, multiple, None, None
    while not ctx.over() and b <= 4 * found.largest_fitting:
        b += step
        err = try_fit(b)
        if err is not None:
            first_oom = b
            break
        step *= 2  # bounded: a few tries reach far past the finder
    if first_oom is None:
        ctx.cut(f"no out-of-memory error up to batch {b}")
        return
    ctx.figure(
        "first batch raising ResourceExhaustedError (scan upward)",
        first_oom,
        "samples",
        note=f"finder's largest / first OOM: "
        f"{found.largest_fitting / first_oom:.3f}; the step after the "
        f"finder's batch was {multiple}",
    )
    report = getattr(err, "report", None)
    ctx.figure(
        "OOM report on that error (tfmemopt.Model.fit)",
        "yes" if report is not None else "no",
        "",
        note=f"{type(err).__name__}; plan: "
        + ("yes" if getattr(report, "plan", None) is not None else "no"),
    )
    if report is not None:
        ctx.data("oom_report", report.text.splitlines()[:30])


# -- mixed precision and alignment -------------------------------------------


def _policy_model(ctx, policy, widths):
    with tfmemopt.precision.configure(policy):
        return mlp(ctx.size(1024, 64), widths)


def part_precision(ctx):
    """mixed_float16 / mixed_bfloat16 step time and peak vs float32."""
    fresh()
    width, depth = ctx.size(4096, 512), ctx.size(4, 2)
    batch = ctx.size(4096, 256)
    x, y = data(batch, ctx.size(1024, 64))
    models = {}
    for policy in ("float32", "mixed_bfloat16", "mixed_float16"):
        model = _policy_model(ctx, policy, [width] * depth)
        model.compile(keras.optimizers.Adam(1e-4), loss())
        model.train_on_batch(x, y)
        models[policy] = model
    scaled = isinstance(
        models["mixed_float16"].optimizer, keras.optimizers.LossScaleOptimizer
    )
    peaks = {
        p: step_peak(ctx, lambda m=m: m.train_on_batch(x, y))
        for p, m in models.items()
    }
    for p in models:
        ctx.figure(f"step peak, {p}", mib(peaks[p]), "MiB")
    times = interleaved_times(
        ctx,
        {p: (lambda m=m: m.train_on_batch(x, y)) for p, m in models.items()},
        rounds=ctx.size(7, 1),
    )
    cpu_rows = {
        "mixed_bfloat16": ("keras.Model", "mixed_bfloat16"),
        "mixed_float16": ("keras.Model, remapping off", "mixed_float16"),
    }
    for p in ("mixed_bfloat16", "mixed_float16"):
        ctx.figure(
            f"step peak {p} / float32",
            ratio(peaks[p], peaks["float32"]),
            "x",
            cpu=("precision", cpu_rows[p], 3),
            note=f"MLP {width}x{depth}, batch {batch}, Adam"
            + ("; LossScaleOptimizer added by compile" if scaled else "")
            * (p == "mixed_float16"),
        )
        ctx.figure(
            f"step time {p} / float32",
            round(times[p] / times["float32"], 2),
            "x",
            cpu=("precision", cpu_rows[p], 7),
            note=f"{times[p] * 1e3:.2f} ms vs {times['float32'] * 1e3:.2f} ms",
        )
    ctx.data("loss_scaling_mixed_float16", scaled)
    if ctx.over():
        ctx.cut("no time left for the alignment check")
        return
    _alignment(ctx, x, y, batch)


def _alignment(ctx, x, y, batch):
    """check_alignment on a misaligned Dense, then on the padded one."""
    hardware = "h100" if ctx.kind == "CPU" else "auto"
    units = ctx.size(4001, 1001)
    mis = _policy_model(ctx, "mixed_bfloat16", [units, units])
    before = tfmemopt.check_alignment(
        mis, batch_size=batch, policy="mixed_bfloat16", hardware=hardware
    )
    padded = units
    for f in before:
        if f.attribute == "units" and f.value == units:
            padded = f.suggested
    ok = _policy_model(ctx, "mixed_bfloat16", [padded, padded])
    after = tfmemopt.check_alignment(
        ok, batch_size=batch, policy="mixed_bfloat16", hardware=hardware
    )
    for model in (mis, ok):
        model.compile(keras.optimizers.Adam(1e-4), loss())
        model.train_on_batch(x, y)
    times = interleaved_times(
        ctx,
        {
            "misaligned": lambda: mis.train_on_batch(x, y),
            "padded": lambda: ok.train_on_batch(x, y),
        },
        rounds=ctx.size(7, 1),
    )
    hw_note = (
        "advice for the h100 preset (CPU run)" if ctx.kind == "CPU" else ""
    )
    ctx.figure(
        f"check_alignment findings, Dense({units}) x2, mixed_bfloat16",
        len(before),
        "",
        note=hw_note or (before[0].message if before else "none"),
    )
    ctx.figure(
        f"check_alignment findings after padding to {padded}",
        len(after),
        "",
    )
    ctx.figure(
        f"step time padded ({padded}) / misaligned ({units})",
        ratio(times["padded"], times["misaligned"], 3),
        "x",
        note=f"{times['padded'] * 1e3:.2f} ms vs "
        f"{times['misaligned'] * 1e3:.2f} ms; padding adds "
        f"{100 * (padded - units) / units:.2f}% units",
    )


# -- accumulation and checkpointing -------------------------------------------


def part_accumulation_checkpointing(ctx):
    """Peak and time ratios on the device (CPU ratios say nothing of
    kernels)."""
    _accumulation(ctx)
    if ctx.over():
        ctx.cut("no time left for checkpointing")
        return
    _checkpointing(ctx)


def _accumulation(ctx):
    fresh()
    n = ctx.size(8, 4)
    if ctx.smoke:
        batch = 256

        def build(cls, **kw):
            return mlp(32, [1024, 1024], cls=cls, **kw)

        x, y = data(batch, 32)
        what = f"MLP 32-1024x2, B={batch}, N={n}"
    else:
        import accumulation as bench  # benchmarks/accumulation.py

        batch = 64
        build = bench.transformer
        x, y = bench.data("transformer", batch)
        what = (
            f"the transformer of benchmarks/accumulation.py, B={batch}, N={n}"
        )
    micro = batch // n
    plain = build(keras.Model)
    small = build(keras.Model)
    ours = build(tfmemopt.Model, accumulation_steps=n)
    for m in (plain, small, ours):
        m.compile(keras.optimizers.Adam(1e-4), loss())
    plain.train_on_batch(x, y)
    small.train_on_batch(x[:micro], y[:micro])
    ours.train_on_batch(x, y)
    p_plain = step_peak(ctx, lambda: plain.train_on_batch(x, y))
    p_ours = step_peak(ctx, lambda: ours.train_on_batch(x, y))
    ctx.figure(
        f"accumulation: step peak tfmemopt.Model N={n} / plain at B",
        ratio(p_ours, p_plain),
        "x",
        cpu=("accumulation", (f"tfmemopt.Model N={n}, batch {batch}",), 2),
        note=f"{what}; {mib(p_ours)} vs {mib(p_plain)} MiB",
    )
    t = interleaved_times(
        ctx,
        {
            "plain": lambda: plain.train_on_batch(x, y),
            "small": lambda: small.train_on_batch(x[:micro], y[:micro]),
            "ours": lambda: ours.train_on_batch(x, y),
        },
        rounds=ctx.size(7, 1),
    )
    # samples/s against plain fit at B/N, as the CPU table gives it
    ctx.figure(
        f"accumulation: samples/s tfmemopt.Model N={n} vs plain at B/N",
        round((batch / t["ours"]) / (micro / t["small"]), 2),
        "x",
        cpu=("accumulation", (f"tfmemopt.Model N={n}, batch {batch}",), 3),
        note="CPU counterpart: wall clock (the CPU-time column is "
        "beside it in BENCHMARKS.md)",
    )
    ctx.figure(
        f"accumulation: step time tfmemopt.Model N={n} / plain at B",
        round(t["ours"] / t["plain"], 2),
        "x",
    )


def _checkpointing(ctx):
    fresh()
    if ctx.smoke:
        import checkpointing as bench  # benchmarks/checkpointing.py

        batch, seq, width = 8, 64, 64

        def build():
            keras.utils.set_random_seed(0)
            inp = keras.Input((seq, width))
            h = inp
            for i in range(2):
                h = bench.PreLNBlock(width, 2, 256, name=f"block{i}")(h)
            return keras.Model(inp, keras.layers.Dense(1)(h))

        what = f"2 pre-LN blocks, width {width}, seq {seq}, batch {batch}"
    else:
        import checkpointing as bench  # benchmarks/checkpointing.py

        batch, seq, width = 16, 256, 256
        build = bench.transformer
        what = "the 6-block transformer of benchmarks/checkpointing.py"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, seq, width)).astype("float32")
    y = rng.normal(size=(batch, seq, 1)).astype("float32")
    plain = build()
    ckpt = build()
    tfmemopt.enable_checkpointing(ckpt, "auto")
    for m in (plain, ckpt):
        m.compile(keras.optimizers.SGD(1e-4), "mse")
        m.train_on_batch(x, y)
    p_plain = step_peak(ctx, lambda: plain.train_on_batch(x, y))
    p_ckpt = step_peak(ctx, lambda: ckpt.train_on_batch(x, y))
    row = ("tfmemopt enable_checkpointing 'auto'",)
    ctx.figure(
        "checkpointing 'auto': step peak / none",
        ratio(p_ckpt, p_plain),
        "x",
        cpu=("checkpointing", row, "peak ratio"),
        note=f"{what}; {mib(p_ckpt)} vs {mib(p_plain)} MiB",
    )
    t = interleaved_times(
        ctx,
        {
            "none": lambda: plain.train_on_batch(x, y),
            "auto": lambda: ckpt.train_on_batch(x, y),
        },
        rounds=ctx.size(7, 1),
    )
    ctx.figure(
        "checkpointing 'auto': step time / none",
        round(t["auto"] / t["none"], 2),
        "x",
        cpu=("checkpointing", row, "wall ratio"),
        note=f"{t['auto'] * 1e3:.1f} ms vs {t['none'] * 1e3:.1f} ms",
    )


# -- AdamW8bit against Keras AdamW ---------------------------------------------


def part_optimizers(ctx):
    """AdamW8bit step time vs Keras AdamW, jit_compile off and on; state."""
    fresh()
    dev = ctx.device
    if ctx.smoke:
        widths, d = (1024, 1024), 256
    else:
        widths, d = (1500, 1500, 1000), 1000  # benchmarks/optimizer_states.py
    batch = 64
    x, y = data(batch, d)
    makers = {
        "keras.AdamW": lambda: keras.optimizers.AdamW(1e-3),
        "AdamW8bit": lambda: tfmemopt.optimizers.AdamW8bit(1e-3),
    }
    models, state = {}, {}
    jits = (False,) if ctx.smoke else (False, True)
    for jit in jits:
        for name, make in makers.items():
            model = mlp(d, list(widths))
            opt = make()
            before = memory.device_memory(dev)["current"]
            opt.build(model.trainable_variables)
            held = memory.device_memory(dev)["current"] - before
            model.compile(opt, loss(), jit_compile=jit)
            model.train_on_batch(x, y)
            label = name + (" (jit_compile)" if jit else "")
            models[label] = model
            state[name] = (state_bytes(opt), held)
    adamw, w8 = state["keras.AdamW"], state["AdamW8bit"]
    for name, (computed, held) in state.items():
        ctx.figure(
            f"{name} state, allocator after build",
            mib(held),
            "MiB",
            cpu=("optimizer_states", (name,), "state MiB")
            if not ctx.smoke
            else None,
            note=f"variables: {mib(computed)} MiB",
        )
    ctx.figure(
        "AdamW8bit / AdamW state (allocator)",
        ratio(w8[1], adamw[1], 3),
        "x",
        cpu=("optimizer_states", ("AdamW8bit",), "state ratio"),
    )
    t = interleaved_times(
        ctx,
        {k: (lambda m=m: m.train_on_batch(x, y)) for k, m in models.items()},
        rounds=ctx.size(9, 1),
    )
    base = t["keras.AdamW"]
    for label, sec in t.items():
        if label == "keras.AdamW":
            continue
        ctx.figure(
            f"step time {label} / keras.AdamW",
            round(sec / base, 2),
            "x",
            cpu=("optimizer_states", (label,), "vs AdamW"),
            note=f"{sec * 1e3:.2f} ms vs {base * 1e3:.2f} ms, batch {batch}",
        )


# -- ShardedOptimizer across devices -----------------------------------------


def part_sharding(ctx):
    """Bytes per device and step time, ShardedOptimizer vs unsharded."""
    devices = ctx.gpus if len(ctx.gpus) >= 2 else []
    if not devices and ctx.smoke:
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
        devices = cpus[:2] if len(cpus) >= 2 else []
    if len(devices) < 2:
        raise Skip(f"needs two or more GPUs; this machine has {len(ctx.gpus)}")
    fresh()
    strategy = tf.distribute.MirroredStrategy(devices)
    # Logical CPUs share one allocator, which answers as CPU:0 only.
    short = (
        ["CPU:0"]
        if ctx.kind == "CPU"
        else [d.split("device:")[-1] for d in devices]
    )
    if ctx.smoke:
        widths, batch = (64, 128, 10), 32
    else:
        widths, batch = (784, 1023, 1021, 10), 512  # benchmarks/sharding.py
    steps = ctx.size(8, 1)
    x, y = data(batch * steps, widths[0], widths[-1])

    def build(variant):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            inp = keras.Input((widths[0],))
            h = inp
            for w in widths[1:-1]:
                h = keras.layers.Dense(w, activation="relu")(h)
            out = keras.layers.Dense(widths[-1])(h)
            kwargs = {"shard_parameters": True} if variant == "params" else {}
            model = tfmemopt.Model(inp, out, **kwargs)
            opt = keras.optimizers.Adam(1e-3)
            if variant.startswith("stage"):
                opt = tfmemopt.ShardedOptimizer(opt, stage=int(variant[-1]))
            model.compile(optimizer=opt, loss=loss())
        return model

    variants = ["unwrapped", "stage 1"] + ([] if ctx.smoke else ["stage 2"])
    try:
        build("params")
        variants.append("params")
        ctx.data("shard_parameters", "accepted by tfmemopt.Model")
    except TypeError as e:
        ctx.data("shard_parameters", f"not accepted here: {e}"[:200])
    except Exception as e:  # noqa: BLE001 - accepted, but failed: recorded
        ctx.data(
            "shard_parameters", f"build failed: {type(e).__name__}: {e}"[:300]
        )
    models, held, state = {}, {}, {}
    for v in variants:
        before = {d: memory.device_memory(d)["current"] for d in short}
        try:
            model = build(v)
            model.fit(x[:batch], y[:batch], batch_size=batch, verbose=0)
        except Exception as e:  # noqa: BLE001 - recorded, others go on
            ctx.data(f"{v} error", f"{type(e).__name__}: {e}"[:300])
            continue
        after = {d: memory.device_memory(d)["current"] for d in short}
        held[v] = max(after[d] - before[d] for d in short)
        models[v] = model
        opt = model.optimizer
        st = opt.state_variables if hasattr(opt, "stage") else opt.variables
        per = {}
        for var in st:
            for c in strategy.experimental_local_results(var.value):
                per[c.device] = per.get(c.device, 0) + (
                    int(np.prod(c.shape)) * c.dtype.size
                )
        ctx.data(f"{v} state bytes per device", per)
        state[v] = max(per.values())
        if ctx.over():
            ctx.cut(f"stopped after building {v!r}")
            break
    shared = ctx.kind == "CPU"
    for v in models:
        label = {"params": "shard_parameters=True"}.get(v, v)
        ctx.figure(
            f"R={len(devices)} {label}: allocator bytes held per device "
            "after build and one step",
            mib(held[v]),
            "MiB",
            note="logical CPUs share one allocator: the sum over devices"
            if shared
            else "the largest over the devices",
        )
    if "unwrapped" not in models:
        return
    for v in models:
        if v == "unwrapped":
            continue
        label = {"params": "shard_parameters=True"}.get(v, v)
        ctx.figure(
            f"R={len(devices)} {label}: optimizer state per device / unwrapped",
            ratio(state[v], state["unwrapped"], 3),
            "x",
            cpu=("sharding", (str(len(devices)), v), "vs unwrapped")
            if v != "params"
            else None,
            note=f"{mib(state[v])} MiB vs {mib(state['unwrapped'])} MiB "
            "(the variables' components on each device)",
        )
    t = interleaved_times(
        ctx,
        {
            v: (lambda m=m: m.fit(x, y, batch_size=batch, verbose=0))
            for v, m in models.items()
        },
        rounds=ctx.size(7, 1),
        per_round=1,
    )
    for v in models:
        if v == "unwrapped":
            continue
        label = {"params": "shard_parameters=True"}.get(v, v)
        ctx.figure(
            f"R={len(devices)} {label}: step time / unwrapped",
            round(t[v] / t["unwrapped"], 2),
            "x",
            cpu=("sharding", (str(len(devices)), v), "step ratio (wall)")
            if v != "params"
            else None,
            note=f"{t[v] / steps * 1e3:.1f} ms per step",
        )


PARTS = {
    "memory": part_memory,
    "estimator": part_estimator,
    "find_batch_size": part_find_batch_size,
    "precision": part_precision,
    "accumulation_checkpointing": part_accumulation_checkpointing,
    "optimizers": part_optimizers,
    "sharding": part_sharding,
}
