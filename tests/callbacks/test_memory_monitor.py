"""tfmemopt.callbacks.MemoryMonitor: logs, records, summary, plot.

CPU statistics come from oneDNN's allocator, which counts only allocations
of 256 KiB or more (tests/memory/test_memory.py pins this): every model here has
activations of at least that size per layer.
"""

from __future__ import annotations

import csv
import glob
import os
import statistics
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import run_in_subprocess

import tfmemopt
from tfmemopt import memory
from tfmemopt.callbacks import MemoryMonitor

MIB = 1024 * 1024
KEY_CUR = "memory/CPU:0/current_mib"
KEY_PEAK = "memory/CPU:0/peak_mib"
KEY_RSS = "memory/host/rss_mib"

try:
    import tensorboard  # noqa: F401 - tf.summary needs it

    HAS_TENSORBOARD = True
except ImportError:
    HAS_TENSORBOARD = False

needs_stats = pytest.mark.skipif(
    not memory.stats_available("CPU:0"),
    reason="CPU allocator statistics need TF_ENABLE_ONEDNN_OPTS=1",
)


def _mlp(width=256, depth=3, d_in=64):
    model = keras.Sequential(
        [keras.Input((d_in,))]
        + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
        + [keras.layers.Dense(1)]
    )
    model.compile(optimizer="sgd", loss="mse")
    return model


def _data(n, d_in=64):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, d_in)).astype("float32")
    return x, x[:, :1].copy()


def _batch_rows(monitor):
    return [r for r in monitor.records if r["kind"] == "batch"]


def _held_mib():
    """What the process holds now (MiB): the logged peaks include it, and in
    a shared test process it depends on earlier tests, so the ratios below
    compare peaks above it."""
    return memory.device_memory("CPU:0")["current"] / MIB


# -- bad input ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"devices": "XPU:0"}, ValueError, "Unknown device name 'XPU:0'"),
        ({"devices": ["GPU:0", "bogus"]}, ValueError, "like 'GPU:0'"),
        ({"devices": 3}, TypeError, "Received: devices=3"),
        ({"devices": []}, TypeError, "non-empty"),
        ({"devices": [0]}, TypeError, "Received an entry 0"),
        ({"every_n_batches": 0}, ValueError, r"integer >= 1.*=0"),
        ({"every_n_batches": 2.5}, TypeError, "of type float"),
        ({"every_n_batches": True}, TypeError, "of type bool"),
        ({"reset_peak": "step"}, ValueError, "'step'.*'batch', 'epoch'"),
        ({"prefix": ""}, ValueError, "non-empty string"),
        ({"prefix": 3}, TypeError, "of type int"),
        ({"host": "yes"}, TypeError, "True or False.*'yes'"),
        ({"devices": ["CPU:0", "CPU:0"]}, ValueError, "CPU:0 more than once"),
        ({"verbose": 2}, ValueError, "'auto', 0 or 1"),
    ],
)
def test_bad_input_raises_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        MemoryMonitor(**kwargs)


def test_device_this_process_does_not_have_is_refused_at_fit():
    model = _mlp(width=8, depth=1, d_in=4)
    x, y = _data(8, d_in=4)
    with pytest.raises(ValueError, match=r"unknown device\(s\) \['GPU:7'\]"):
        model.fit(x, y, callbacks=[MemoryMonitor(devices="GPU:7")], verbose=0)


def test_config_round_trip():
    monitor = MemoryMonitor(devices=["cpu:0"], every_n_batches=3)
    config = monitor.get_config()
    assert config["devices"] == ["CPU:0"]
    assert MemoryMonitor(**config).get_config() == config


# -- what the numbers mean -----------------------------------------------------


@needs_stats
def test_logged_peaks_grow_with_batch_size():
    # Per Dense(256) layer the forward pass keeps a (batch, 256) float32
    # output for the backward pass: 2 MiB at batch 2048, 0.25 MiB at 256.
    # Three layers: at least 5.25 MiB more at the larger batch.
    x, y = _data(4 * 2048)
    medians = {}
    for batch in (256, 2048):
        keras.backend.clear_session()
        monitor = MemoryMonitor(verbose=0)
        model = _mlp()
        held = _held_mib()
        model.fit(x, y, batch_size=batch, callbacks=[monitor], verbose=0)
        peaks = [r[KEY_PEAK] - held for r in _batch_rows(monitor)][1:]
        medians[batch] = statistics.median(peaks)
    expected_extra = 3 * (2048 - 256) * 256 * 4 / MIB
    assert medians[2048] - medians[256] > 0.8 * expected_extra, medians
    assert medians[2048] > 1.3 * medians[256], medians


class _Probe(keras.callbacks.Callback):
    """Reads the allocator by hand, just before the monitor does."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(tf.config.experimental.get_memory_info("CPU:0"))


@needs_stats
def test_values_match_get_memory_info_read_by_hand():
    probe, monitor = _Probe(), MemoryMonitor(verbose=0)
    x, y = _data(2048)
    _mlp().fit(x, y, batch_size=512, callbacks=[probe, monitor], verbose=0)
    rows = _batch_rows(monitor)
    assert len(rows) == len(probe.seen) == 4
    for row, info in zip(rows, probe.seen):
        assert row[KEY_CUR] == info["current"] / MIB
        assert row[KEY_PEAK] == info["peak"] / MIB
        assert row[KEY_PEAK] >= row[KEY_CUR] > 0


def _big_then_small():
    # One batch of 4096 rows, then three of 256: a big peak, then small ones.
    x, y = _data(4096 + 3 * 256)
    big = tf.data.Dataset.from_tensors((x[:4096], y[:4096]))
    small = tf.data.Dataset.from_tensor_slices((x[4096:], y[4096:]))
    return big.concatenate(small.batch(256))


@needs_stats
def test_reset_peak_epoch_differs_from_batch_as_documented():
    runs = {}
    for mode in ("batch", "epoch", "train"):
        keras.backend.clear_session()
        monitor = MemoryMonitor(reset_peak=mode, verbose=0)
        model, data = _mlp(), _big_then_small()
        held = _held_mib()
        model.fit(data, epochs=2, callbacks=[monitor], verbose=0)
        runs[mode] = monitor, held
    for mode, (monitor, held) in runs.items():
        for epoch in (0, 1):
            peaks = [
                r[KEY_PEAK] - held
                for r in _batch_rows(monitor)
                if r["epoch"] == epoch
            ]
            assert len(peaks) == 4
            if mode == "batch":  # peak of each step alone: it falls
                assert peaks[-1] < 0.8 * peaks[0], (mode, peaks)
            else:  # running peak: never falls within the epoch
                assert peaks == sorted(peaks), (mode, peaks)
                assert min(peaks[1:]) >= peaks[0], (mode, peaks)
    # "train" resets once: the running peak spans both epochs.
    train_peaks = [r[KEY_PEAK] for r in _batch_rows(runs["train"][0])]
    assert train_peaks == sorted(train_peaks)


# -- Keras's own loggers -----------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two epochs of 4 batches with the monitor, CSVLogger and TensorBoard."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    tmp = tmp_path_factory.mktemp("monitor")
    monitor = MemoryMonitor(verbose=0)
    callbacks = [monitor, keras.callbacks.CSVLogger(str(tmp / "log.csv"))]
    if HAS_TENSORBOARD:
        callbacks.append(
            keras.callbacks.TensorBoard(str(tmp / "tb"), update_freq="batch")
        )
    x, y = _data(2048)
    history = _mlp().fit(
        x, y, batch_size=512, epochs=2, callbacks=callbacks, verbose=0
    )
    return monitor, history.history, tmp


def _epoch_rows(monitor):
    return [r for r in monitor.records if r["kind"] == "epoch"]


def test_history_has_one_value_per_epoch_per_key(trained):
    monitor, history, _ = trained
    epochs = _epoch_rows(monitor)
    assert [r["step"] for r in epochs] == [4, 8]
    keys = [k for k in epochs[0] if k.startswith("memory/")]
    assert KEY_RSS in keys
    if memory.stats_available("CPU:0"):
        assert {KEY_CUR, KEY_PEAK} <= set(keys)
    for key in keys:
        assert history[key] == [r[key] for r in epochs]
    # The epoch peak is the highest reading of the epoch.
    for epoch, row in enumerate(epochs):
        batch_peaks = [
            r.get(KEY_PEAK, 0.0)
            for r in _batch_rows(monitor)
            if r["epoch"] == epoch
        ]
        assert row.get(KEY_PEAK, 0.0) >= max(batch_peaks)


def test_csv_logger_writes_the_keys(trained):
    monitor, history, tmp = trained
    with open(tmp / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for key in history:
        if key.startswith("memory/"):
            logged = [float(r[key]) for r in rows]
            np.testing.assert_allclose(logged, history[key], rtol=1e-6)


def _read_events(directory):
    scalars = {}
    for path in sorted(glob.glob(os.path.join(directory, "events.out.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if "memory/" not in value.tag:
                    continue  # the model graph, learning rate, loss
                number = float(tf.make_ndarray(value.tensor))
                scalars.setdefault(value.tag, []).append((event.step, number))
    return scalars


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="needs tensorboard")
def test_tensorboard_event_file_holds_the_values(trained):
    monitor, history, tmp = trained
    scalars = _read_events(str(tmp / "tb" / "train"))
    for key in history:
        if not key.startswith("memory/"):
            continue
        epoch_values = [v for _, v in sorted(scalars["epoch_" + key])]
        np.testing.assert_allclose(epoch_values, history[key], rtol=1e-6)
        batch_values = [v for _, v in sorted(scalars["batch_" + key])]
        expected = [r[key] for r in _batch_rows(monitor)]
        np.testing.assert_allclose(batch_values, expected, rtol=1e-6)


# -- summary and plot ----------------------------------------------------------


def test_peaks_and_summary_name_the_worst_step(trained):
    monitor, _, _ = trained
    rows = monitor.records  # batches and epochs (an epoch's validation)
    best = monitor.peaks()
    worst = max(rows, key=lambda r: r[KEY_RSS])
    assert best["host"]["peak_mib"] == worst[KEY_RSS]
    assert best["host"]["step"] == worst["step"]
    text = monitor.summary()
    assert f"{worst[KEY_RSS]:.1f}" in text
    if KEY_PEAK in rows[0]:
        worst = max(rows, key=lambda r: r[KEY_PEAK])
        assert best["CPU:0"] == {
            "peak_mib": worst[KEY_PEAK],
            "step": worst["step"],
            "epoch": worst["epoch"],
        }
        line = next(s for s in text.splitlines() if s.startswith("CPU:0"))
        assert line.split()[1:3] == [
            f"{worst[KEY_PEAK]:.1f}",
            str(worst["step"]),
        ]


@pytest.mark.parametrize("verbose, printed", [(1, True), (0, False)])
def test_summary_printed_at_end_of_fit_unless_verbose_0(
    capsys, verbose, printed
):
    x, y = _data(512)
    monitor = MemoryMonitor(verbose=verbose)
    _mlp(width=8, depth=1).fit(
        x, y, batch_size=256, callbacks=[monitor], verbose=0
    )
    assert ("MemoryMonitor summary" in capsys.readouterr().out) is printed


def test_plot_writes_a_real_png_of_the_run(trained, tmp_path):
    Image = pytest.importorskip("PIL.Image")

    monitor, _, _ = trained
    path = monitor.plot(str(tmp_path / "memory.png"))
    image = np.asarray(Image.open(path).convert("RGB"))
    panels = 2 if KEY_PEAK in monitor.records[0] else 1
    assert image.shape == (int(2.4 * panels * 100), 800, 3)
    not_white = (image.min(axis=2) < 250).mean()
    assert not_white > 0.02, not_white
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 20


def test_plot_draws_the_recorded_values(trained):
    pytest.importorskip("matplotlib")
    from tfmemopt.callbacks._plot import figure

    monitor, _, _ = trained
    fig = figure(monitor.records)
    rows = _batch_rows(monitor)
    lines = {
        (ax.get_title(loc="left"), line.get_label()): line
        for ax in fig.axes
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }
    line = lines[("memory/host", "rss_mib")]
    assert list(line.get_xdata()) == [r["step"] for r in rows]
    assert list(line.get_ydata()) == [r[KEY_RSS] for r in rows]
    boundaries = [
        line.get_xdata()[0]
        for line in fig.axes[0].get_lines()
        if line.get_label().startswith("_")
    ]
    assert boundaries == [4, 8]


def test_plot_without_matplotlib_says_how_to_install(trained, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        trained[0].plot("unused.png")


def test_plot_before_fit_raises():
    with pytest.raises(ValueError, match="after `model.fit"):
        MemoryMonitor().plot("unused.png")


# -- steps, strategies, accumulation -----------------------------------------


@pytest.mark.parametrize(
    "steps_per_execution, every_n, expected_steps",
    [
        (1, 1, [1, 2, 3, 4, 5, 6, 7, 8]),
        (1, 3, [3, 6]),
        (2, 1, [2, 4, 6, 8]),
        (2, 3, [4, 6]),  # Keras reports steps 2, 4, 6, 8
        # Keras reports the last, partial execution at batch index 8 of
        # batches 0-7 (docs/memory_monitor.md).
        (3, 1, [3, 6, 9]),
    ],
)
def test_every_n_batches_and_steps_per_execution(
    steps_per_execution, every_n, expected_steps
):
    model = _mlp(width=8, depth=1)
    model.compile(
        optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution
    )
    monitor = MemoryMonitor(every_n_batches=every_n, verbose=0)
    x, y = _data(8 * 32)
    history = model.fit(
        x, y, batch_size=32, epochs=1, callbacks=[monitor], verbose=0
    )
    assert [r["step"] for r in _batch_rows(monitor)] == expected_steps
    assert [r["step"] for r in _epoch_rows(monitor)] == [
        max(8, expected_steps[-1])
    ]
    assert len(history.history[KEY_RSS]) == 1


@needs_stats
def test_a_peak_in_validation_is_the_runs_peak():
    """The summary's peak is the run's, as `History` has it: validation at a
    batch 16x the training batch peaks above every training batch."""
    model = _mlp()
    monitor = MemoryMonitor(verbose=0)
    x, y = _data(2048)
    history = model.fit(
        x[:256],
        y[:256],
        batch_size=64,
        epochs=2,
        validation_data=(x, y),
        validation_batch_size=1024,
        callbacks=[monitor],
        verbose=0,
    ).history
    batches = max(r[KEY_PEAK] for r in _batch_rows(monitor))
    assert max(history[KEY_PEAK]) > batches
    best = monitor.peaks()["CPU:0"]
    assert best["peak_mib"] == max(history[KEY_PEAK])
    assert best["step"] in [r["step"] for r in _epoch_rows(monitor)]
    # The host's peak is never below its last reading.
    host = monitor.peaks()["host"]["peak_mib"]
    assert host >= monitor.records[-1][KEY_RSS]


@needs_stats
def test_with_tfmemopt_model_accumulation_peaks_fall():
    # 8 micro-batches of 512 instead of one batch of 4096: the activations
    # kept per Dense(256) layer fall from 4 MiB to 0.5 MiB (three layers:
    # 10.5 MiB less), while the float32 accumulators add one copy of the
    # gradients (0.6 MiB).
    x, y = _data(3 * 4096)
    peaks = {}
    for steps in (1, 8):
        keras.backend.clear_session()
        inputs = keras.Input((64,))
        h = inputs
        for _ in range(3):
            h = keras.layers.Dense(256, activation="relu")(h)
        model = tfmemopt.Model(
            inputs, keras.layers.Dense(1)(h), accumulation_steps=steps
        )
        model.compile(optimizer="sgd", loss="mse")
        monitor = MemoryMonitor(verbose=0)
        held = _held_mib()
        history = model.fit(
            x, y, batch_size=4096, callbacks=[monitor], verbose=0
        )
        assert len(history.history[KEY_PEAK]) == 1
        rows = _batch_rows(monitor)
        assert [r["step"] for r in rows] == [1, 2, 3]
        peaks[steps] = statistics.median(r[KEY_PEAK] - held for r in rows[1:])
    expected_saving = 3 * (4096 - 512) * 256 * 4 / MIB - 0.6
    assert peaks[1] - peaks[8] > 0.5 * expected_saving, peaks
    assert peaks[8] < 0.8 * peaks[1], peaks


def test_gpu_keys_with_nvml(monkeypatch):
    """GPU and NVML keys, with both readers faked (no GPU here)."""
    fake = {"current": 3 * MIB, "peak": 5 * MIB}
    monkeypatch.setattr(memory, "local_devices", lambda: ["GPU:0", "CPU:0"])
    monkeypatch.setattr(
        memory, "stats_available", lambda device="CPU:0": device == "GPU:0"
    )
    monkeypatch.setattr(memory, "device_memory", lambda device: dict(fake))
    monkeypatch.setattr(memory, "reset_peak", lambda device: True)
    monkeypatch.setattr(
        memory,
        "nvml_memory",
        lambda d: (
            {"used": 7 * MIB, "total": 80 * MIB} if d == "GPU:0" else None
        ),
    )
    monitor = MemoryMonitor(verbose=0)
    x, y = _data(64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # CPU:0 without stats: no warning
        history = _mlp(width=8, depth=1).fit(
            x, y, batch_size=32, callbacks=[monitor], verbose=0
        )
    keys = sorted(k for k in history.history if k.startswith("memory/"))
    assert keys == [
        "memory/GPU:0/current_mib",
        "memory/GPU:0/peak_mib",
        "memory/GPU:0/total_mib",
        "memory/GPU:0/used_mib",
        KEY_RSS,
    ]
    assert history.history["memory/GPU:0/peak_mib"] == [5.0]
    assert history.history["memory/GPU:0/used_mib"] == [7.0]
    assert history.history["memory/GPU:0/total_mib"] == [80.0]
    assert monitor.devices == ["GPU:0"]


@pytest.mark.slow
def test_mirrored_strategy_one_set_of_keys_per_replica():
    result = run_in_subprocess(
        """
        import warnings
        import keras
        import numpy as np
        from tfmemopt import memory
        from tfmemopt.callbacks import MemoryMonitor

        strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
        with strategy.scope():
            model = keras.Sequential([
                keras.Input((64,)),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(1),
            ])
            model.compile("sgd", "mse")
        x = np.random.rand(2048, 64).astype("float32")
        monitor = MemoryMonitor(verbose=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = model.fit(
                x, x[:, :1], batch_size=1024, callbacks=[monitor], verbose=0
            )
        emit({
            "replicas": memory.replica_devices(strategy),
            "devices": monitor.devices,
            "history": {
                k: v for k, v in history.history.items()
                if k.startswith("memory/")
            },
            "warnings": [
                str(w.message) for w in caught
                if "MemoryMonitor" in str(w.message)
            ],
        })
        """,
        n_cpus=2,
    )
    assert result["replicas"] == ["CPU:0", "CPU:1"]
    assert result["devices"] == ["CPU:0", "CPU:1"]
    assert result["warnings"] == []
    history = result["history"]
    expected = {KEY_RSS}
    for device in ("CPU:0", "CPU:1"):
        for what in ("current_mib", "peak_mib"):
            expected.add(f"memory/{device}/{what}")
    assert set(history) == expected
    # Logical CPUs share one allocator: the same numbers, and real ones.
    for what in ("current_mib", "peak_mib"):
        assert (
            history[f"memory/CPU:0/{what}"] == history[f"memory/CPU:1/{what}"]
        )
    # At least the hidden activations of the global batch (2 MiB); the
    # measured peak sat at 4.0-4.5 MiB, so a bound of 4 MiB was flaky.
    assert history["memory/CPU:0/peak_mib"][0] >= 1024 * 512 * 4 / MIB


@pytest.mark.slow
def test_without_onednn_stats_one_warning_and_host_memory():
    result = run_in_subprocess(
        """
        import sys
        import warnings
        import keras
        import numpy as np
        from tfmemopt import memory
        from tfmemopt.callbacks import MemoryMonitor

        model = keras.Sequential([
            keras.Input((16,)), keras.layers.Dense(32), keras.layers.Dense(1)
        ])
        model.compile("sgd", "mse")
        x = np.random.rand(256, 16).astype("float32")
        monitor = MemoryMonitor(verbose=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(x, x[:, :1], batch_size=32, epochs=2,
                      callbacks=[monitor], verbose=0)
            history = model.fit(x, x[:, :1], batch_size=32,
                                callbacks=[monitor], verbose=0)
        emit({
            "stats": memory.stats_available("CPU:0"),
            "keys": sorted(k for k in history.history if "memory/" in k),
            "rss": history.history["memory/host/rss_mib"],
            "rows": len(monitor.records),
            "warnings": [
                str(w.message) for w in caught
                if "MemoryMonitor" in str(w.message)
            ],
            "pynvml_imported": "pynvml" in sys.modules,
        })
        """,
        n_cpus=1,
        env={"TF_ENABLE_ONEDNN_OPTS": "0"},
    )
    assert result["stats"] is False
    assert result["keys"] == [KEY_RSS]
    assert 10 < result["rss"][0] < 64 * 1024  # MiB: a real process size
    assert result["rows"] == 8 + 1  # the second fit: 8 batches, 1 epoch
    assert len(result["warnings"]) == 1, result["warnings"]
    message = result["warnings"][0]
    assert "no allocator memory statistics for CPU:0" in message
    assert "memory/host/rss_mib" in message
    assert "TF_ENABLE_ONEDNN_OPTS=1" in message
    assert result["pynvml_imported"] is False  # NVML is imported lazily
