"""find_batch_size, suggest_accumulation and the pure search behind them."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import run_in_subprocess

import tfmemopt
from tfmemopt import memory
from tfmemopt.tuning import _search
from tfmemopt.tuning._trials import TrialRunner

needs_stats = pytest.mark.skipif(
    not memory.stats_available("CPU:0"),
    reason="CPU allocator statistics need TF_ENABLE_ONEDNN_OPTS=1",
)


class OOMAbove(keras.layers.Layer):
    """Raises ResourceExhaustedError for batches above `threshold`."""

    def __init__(self, threshold, **kwargs):
        super().__init__(**kwargs)
        self.threshold = threshold

    def call(self, x):
        n = x.shape[0]
        if n is not None and n > self.threshold:
            raise tf.errors.ResourceExhaustedError(
                None, None, f"OOM when allocating tensor with shape[{n},64]"
            )
        return x


def wide_model(threshold=None, optimizer="adam"):
    """Tiny weights, large activations: memory grows with the batch."""
    inputs = keras.Input((32,))
    h = keras.layers.Dense(4096, activation="relu")(inputs)
    for _ in range(4):
        h = keras.layers.Activation("tanh")(h)
    if threshold is not None:
        h = OOMAbove(threshold)(h)
    outputs = keras.layers.Dense(1)(h)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def data(n=64):
    rng = np.random.default_rng(0)
    return (
        rng.normal(size=(n, 32)).astype("float32"),
        rng.normal(size=(n, 1)).astype("float32"),
    )


def state(model):
    variables = model.variables + model.optimizer.variables
    return [np.array(v.numpy()) for v in variables]


# --- the pure search ------------------------------------------------------


@pytest.mark.parametrize("mode", ["binsearch", "power"])
@pytest.mark.parametrize("threshold", [7, 8, 100, 1000, 4095, 4096, 9999])
def test_search_finds_largest_aligned_batch(mode, threshold):
    def fits(b):
        return _search.Trial(b, b <= threshold)

    best, trials = _search.search(fits, mode, 4096, 8)
    expected = min(threshold, 4096) // 8 * 8 or None
    assert best == expected
    tried = [t.batch_size for t in trials]
    assert len(tried) == len(set(tried)), "a batch was tried twice"
    assert all(b % 8 == 0 and b <= 4096 for b in tried)
    assert len(tried) <= 2 * 10 + 1  # log2(4096 / 8) = 9 doublings
    if best and best < 4096:
        assert best + 8 in tried  # the boundary was checked, not guessed


def test_search_rejects_bad_mode_and_alignment():
    with pytest.raises(ValueError, match="one of .*'power', 'binsearch'"):
        _search.search(lambda b: _search.Trial(b, True), "linear")
    with pytest.raises(ValueError, match="must not exceed `max_batch_size`"):
        _search.search(lambda b: _search.Trial(b, True), "power", 4, 8)


@pytest.mark.parametrize(
    "text, expected",
    [("16GiB", 16 * 2**30), ("512 MiB", 512 * 2**20), ("1.5GB", 1.5e9), (7, 7)],
)
def test_parse_bytes(text, expected):
    assert _search.parse_bytes(text) == int(expected)


def test_parse_bytes_rejects_garbage():
    with pytest.raises(ValueError, match="such as '16GiB'"):
        _search.parse_bytes("sixteen gigs")


# --- suggest_accumulation -------------------------------------------------


@pytest.mark.parametrize(
    "target, largest, multiple_of, replicas, micro, steps",
    [
        (64, 4, 4, 1, 4, 16),  # "per-device 4 with 16 steps, not 1 with 64"
        (256, 48, 8, 1, 32, 8),
        (256, 64, 8, 2, 64, 2),
        (96, 128, 8, 1, 96, 1),  # fits whole
        (384, 100, 8, 1, 96, 4),  # 96 is aligned, 64 would need 6 steps
    ],
)
def test_suggest_accumulation_keeps_the_batch(
    target, largest, multiple_of, replicas, micro, steps
):
    s = tfmemopt.suggest_accumulation(
        target, largest, multiple_of=multiple_of, replicas=replicas
    )
    assert (s.micro_batch_size, s.accumulation_steps) == (micro, steps)
    assert s.global_batch_size == target
    assert s.micro_batch_size <= largest
    assert s.aligned and not s.note


def test_suggest_accumulation_unaligned_target_says_what_it_chose():
    with pytest.warns(UserWarning, match="chose micro_batch_size=25 x"):
        s = tfmemopt.suggest_accumulation(100, 32, multiple_of=8)
    assert (s.micro_batch_size, s.accumulation_steps) == (25, 4)
    assert s.global_batch_size == 100 and not s.aligned


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((0, 8), ValueError, "target_batch_size` must be an integer >= 1"),
        ((64, 8.0), TypeError, "max_micro_batch` must be an integer"),
        ((63, 8, 8, 2), ValueError, "divisible by `replicas`"),
    ],
)
def test_suggest_accumulation_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        tfmemopt.suggest_accumulation(*args)


# --- find_batch_size on a real model ----------------------------------------


def test_oom_layer_is_searched_and_the_model_recovers():
    model = wide_model(threshold=100, optimizer="sgd")
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    before = state(model)
    iterations = int(model.optimizer.iterations.numpy())
    # Multiples of 32 (fewer trials, each a new trace): 32, 64, 128 (OOM),
    # then 96 between.
    found = tfmemopt.find_batch_size(
        model, (x, y), max_batch_size=128, multiple_of=32, margin=0.0, verbose=0
    )
    assert found.batch_size == 96 == found.largest_fitting
    failed = [t for t in found.trials if not t.fits]
    assert failed and all("OOM when allocating" in t.reason for t in failed)
    assert {t.batch_size for t in failed} == {128}
    after = state(model)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert int(model.optimizer.iterations.numpy()) == iterations
    # It recovers: training goes on at the batch it found, and a margin
    # lowers the batch, still aligned.
    history = model.fit(x[:96], y[:96], batch_size=96, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    with_margin = tfmemopt.find_batch_size(
        model, (x, y), max_batch_size=128, multiple_of=32, margin=0.2, verbose=0
    )
    assert with_margin.largest_fitting == 96
    assert with_margin.batch_size == 64  # floor(96 * 0.8 / 32) * 32


@needs_stats
@pytest.mark.slow
def test_budget_search_on_cpu_leaves_the_model_unchanged():
    model = wide_model()
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    before = state(model)
    iterations = int(model.optimizer.iterations.numpy())
    with TrialRunner(model, (x, y), steps=1) as runner:
        small = runner.run(64)[0]
        large = runner.run(512)[0]
    assert large > small + 10 * 2**20, (small, large)  # activations dominate
    budget = (small + large) // 2  # lands between 64 and 512

    results = {}
    for mode in ("binsearch", "power"):
        found = tfmemopt.find_batch_size(
            model,
            (x, y),
            mode=mode,
            memory_budget=budget,
            max_batch_size=1024,
            multiple_of=64,
            steps_per_trial=1,
            verbose=0,
        )
        by_batch = {t.batch_size: t for t in found.trials}
        best = by_batch[found.largest_fitting]
        assert best.fits and best.peak_bytes <= found.limit_bytes == budget
        above = by_batch[found.largest_fitting + 64]
        assert not above.fits and above.peak_bytes > found.limit_bytes
        # The margin comes off the batch, aligned: 0.95 x, down to 64s.
        assert found.batch_size == max(
            64, int(found.largest_fitting * 0.95) // 64 * 64
        )
        results[mode] = found.largest_fitting
    assert 64 < results["binsearch"] < 512
    assert abs(results["binsearch"] - results["power"]) <= 64

    after = state(model)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert int(model.optimizer.iterations.numpy()) == iterations
    s = found.suggest(4 * found.batch_size)
    assert s.global_batch_size == 4 * found.batch_size
    assert "| batch | peak MiB | fits |" in found.table()


_GIVES_MEMORY_BACK = """
import gc
import keras
import numpy as np
import tfmemopt
from tfmemopt import memory
from tfmemopt.tuning._trials import variable_bytes

class OOMAbove(keras.layers.Layer):
    def call(self, x):
        if x.shape[0] is not None and x.shape[0] > 24:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM")
        return x

# 48 MiB of weights, 144 MiB with Adam's slots, in 36 tensors of 4 MiB:
# above the 256 KiB under which oneDNN's allocator keeps no statistics,
# and each under 5 % of the state, so that 5 % catches a leaked set of
# gradients or slots. (With a few 16 MiB tensors, the bytes in use after
# plain `fit` alone were seen 15.75 MiB above the live tensors.)
inputs = keras.Input((1024,))
h = OOMAbove()(inputs)
for _ in range(12):
    h = keras.layers.Dense(1024, activation="tanh")(h)
model = keras.Model(inputs, keras.layers.Dense(1)(h))
model.compile(optimizer="adam", loss="mse")
rng = np.random.default_rng(0)
x = rng.normal(size=(32, 1024)).astype("float32")
y = rng.normal(size=(32, 1)).astype("float32")
model.fit(x, y, batch_size=16, verbose=0)
big = [
    v for v in model.variables + model.optimizer.variables
    if variable_bytes([v]) >= 2**18
]

def in_use():
    gc.collect()
    return memory.device_memory("CPU:0")["current"]

runs = []
for mode in ("binsearch", "power"):
    before = in_use()
    found = tfmemopt.find_batch_size(
        model, (x, y), mode=mode, memory_budget="4GiB", max_batch_size=32,
        multiple_of=8, margin=0.0, steps_per_trial=1, verbose=0,
    )
    runs.append([found.batch_size, len(found.trials), before, in_use()])
emit({"runs": runs, "state": variable_bytes(big)})
"""


@needs_stats
@pytest.mark.slow
def test_search_gives_the_device_memory_back():
    # A fresh process: the allocator's free lists hold nothing from other
    # tests. Every trial measures its peak (a budget is given), one runs
    # out of memory.
    out = run_in_subprocess(_GIVES_MEMORY_BACK, n_cpus=1)
    assert out["state"] >= 140 * 2**20
    for batch, n_trials, before, after in out["runs"]:
        assert (batch, n_trials) == (24, 4)  # 8, 16, 32 (OOM), 24
        # Nothing of the trials stays allocated, and the restored
        # variables are still in the device's memory (counted), not in
        # buffers adopted from host arrays.
        assert abs(after - before) <= 0.05 * before, out
        assert after >= out["state"], out


@needs_stats
def test_budget_smaller_than_the_weights_cannot_fit():
    model = wide_model()
    x, y = data()
    with pytest.raises(ValueError, match="cannot fit at any batch size"):
        tfmemopt.find_batch_size(model, (x, y), memory_budget="64KiB")


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (
            (np.zeros((0, 32), "float32"), np.zeros((0, 1), "float32")),
            ValueError,
            "empty",
        ),
        (
            tf.data.Dataset.from_tensor_slices(
                (np.zeros((0, 32), "float32"), np.zeros((0, 1), "float32"))
            ).batch(4),
            ValueError,
            "empty",
        ),
        ("not data", TypeError, r"\(x, y\)"),
    ],
)
def test_bad_data(bad, error, match):
    with pytest.raises(error, match=match):
        tfmemopt.find_batch_size(wide_model(), bad, verbose=0)


def test_bad_arguments():
    model = wide_model()
    with pytest.raises(ValueError, match="`mode` must be one of"):
        tfmemopt.find_batch_size(model, data(), mode="fast")
    with pytest.raises(ValueError, match="`margin` must be a fraction"):
        tfmemopt.find_batch_size(model, data(), margin=1.5)
    plain = keras.Sequential([keras.Input((32,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="call `model.compile"):
        tfmemopt.find_batch_size(plain, data())
    # A dataset of single samples (TensorFlow's unbatch error before).
    unbatched = tf.data.Dataset.from_tensor_slices(data())
    with pytest.raises(ValueError, match=r"batched tf.data.Dataset.*\.batch"):
        tfmemopt.find_batch_size(model, unbatched)


def test_cli_find_batch_size(tmp_path, capsys):
    import json

    from tfmemopt.cli import _main as cli

    path = str(tmp_path / "m.keras")
    wide_model(optimizer="sgd").save(path)
    argv = ["find-batch-size", path, "--max-batch-size", "64"]
    argv += ["--multiple-of", "32", "--steps", "1", "--target", "96"]
    assert cli.main(argv + ["--margin", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["batch_size"] == 64 and len(out["trials"]) == 2
    assert out["suggest"] == {"micro_batch_size": 32, "accumulation_steps": 3}
    assert cli.main(["find-batch-size", str(tmp_path / "no.keras")]) == 2
    # A missing --data file and --target 0: one line, exit 2 (a traceback
    # and a silently ignored target before).
    capsys.readouterr()
    missing = str(tmp_path / "missing.npz")
    assert cli.main(argv + ["--data", missing]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err and "Traceback" not in err, err
    argv[argv.index("--target") + 1] = "0"
    assert cli.main(argv + ["--margin", "0"]) == 2
    assert "target_batch_size" in capsys.readouterr().err


def test_dataset_input_is_repeated_to_fill_the_batch():
    model = wide_model(threshold=20, optimizer="sgd")
    x, y = data(10)  # fewer samples than the batches tried
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    found = tfmemopt.find_batch_size(
        model, ds, max_batch_size=32, multiple_of=16, margin=0.0, verbose=0
    )
    assert found.batch_size == 16
    assert [t.fits for t in found.trials] == [True, False]


@needs_stats
def test_tiny_model_says_why_every_peak_is_zero_and_no_retracing_warning():
    # docs/batch_size.md's model: every tensor under oneDNN's 256 KiB floor.
    import logging

    inputs = keras.Input((32,))
    h = keras.layers.Dense(64, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse")
    x, y = data(64)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    try:
        found = tfmemopt.find_batch_size(
            model,
            (x, y),
            memory_budget="8GiB",
            max_batch_size=512,
            multiple_of=8,
            steps_per_trial=1,
            verbose=0,
        )
        # Each trial is a new batch, so a new trace: TensorFlow warned
        # "triggered tf.function retracing" from the sixth trial on.
        assert len(found.trials) == 7
        assert not [r for r in records if "retracing" in r.getMessage()], [
            r.getMessage()[:80] for r in records
        ]
        # The filter is gone after the search: the warning reaches the log.
        logger.warning("5 calls triggered tf.function retracing (test)")
        assert any("(test)" in r.getMessage() for r in records)
    finally:
        logger.removeHandler(handler)
    assert all(t.peak_bytes == 0 for t in found.trials), found.trials
    assert "256 KiB" in found.note and found.note in str(found)
    # A model whose steps allocate counted tensors has no note.
    big = tfmemopt.find_batch_size(
        wide_model(optimizer="sgd"),
        data(),
        max_batch_size=64,
        multiple_of=64,
        steps_per_trial=1,
        verbose=0,
    )
    assert big.trials[0].peak_bytes > 0 and big.note == ""
