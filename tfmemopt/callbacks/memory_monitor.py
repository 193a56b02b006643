"""`MemoryMonitor`: device and host memory in Keras logs, a summary, a plot."""

from __future__ import annotations

import warnings

import keras

from tfmemopt import memory
from tfmemopt._utils import check_int
from tfmemopt.callbacks._devices import candidate_devices
from tfmemopt.callbacks._devices import check_device_name
from tfmemopt.callbacks._devices import no_stats_message
from tfmemopt.callbacks._summary import format_summary
from tfmemopt.callbacks._summary import peaks

_RESET_CHOICES = ("batch", "epoch", "train", None)


class MemoryMonitor(keras.callbacks.Callback):
    """Logs device and host memory next to the loss, per step and per epoch.

    Writes its readings into the `logs` that Keras passes along, so the
    progress bar, `History`, `CSVLogger` and `TensorBoard` show and record
    them with no extra code (list the monitor *before* `CSVLogger` and
    `TensorBoard` in `callbacks=`: Keras calls callbacks in list order;
    `History` and the progress bar always come last). It also keeps
    `records`, prints a `summary()` at the end of training and draws a
    `plot()`.

    Keys (`<p>` is `prefix`, `<device>` a short name such as `GPU:0`):

    - `<p>/<device>/current_mib`: MiB that TensorFlow's allocator holds on
      the device now (after the step).
    - `<p>/<device>/peak_mib`: the allocator's highest MiB since the last
      reset (see `reset_peak`).
    - `<p>/<device>/used_mib`, `<p>/<device>/total_mib`: MiB used on the
      whole GPU and its size, as the driver (NVML) sees them; only for
      GPUs, and only with `nvidia-ml-py` installed
      (`pip install tfmemopt[gpu]`).
    - `<p>/host/rss_mib`: resident set size of this process in MiB.

    Epoch logs carry the same keys: `current_mib` at the end of the epoch,
    `peak_mib` the highest reading during the epoch (validation included).
    On CPU, logical devices (`CPU:0`, `CPU:1`) share one allocator and
    report the same numbers, and oneDNN's allocator counts only allocations
    of 256 KiB or more (smaller tensors do not show). Where a device keeps
    no statistics (CPU without oneDNN), the monitor warns once and logs host
    memory only.

    Cost: after each logged batch, one allocator query per device (a few
    microseconds each), one `psutil` call, and one NVML call per GPU; and
    because it reads logs after each batch, Keras dispatches batch
    callbacks synchronously instead of on a thread (as for any callback
    that implements `on_train_batch_end`). Use `every_n_batches` to read
    less often. `benchmarks/monitor.py` measures the overhead.

    Args:
        devices: `"auto"`, a device name or a list of names, defaults to
            `"auto"`: every GPU and TPU that TensorFlow sees, the replica
            devices of the model's `tf.distribute` strategy, and `CPU:0`
            where its allocator keeps statistics.
        every_n_batches: Int, defaults to `1`. Read memory after every n-th
            batch (with `steps_per_execution > 1`, at the first batch end
            Keras reports at or past each multiple of n).
        reset_peak: `"batch"`, `"epoch"`, `"train"` or `None`, defaults to
            `"batch"`. When the allocator's peak is reset: after each
            reading (each batch `peak_mib` is the peak since the previous
            reading), at the start of each epoch (a running peak within
            the epoch), once at the start of `fit`, or never.
        host: Bool, defaults to `True`. Whether to log host RSS.
        prefix: String, defaults to `"memory"`. First part of every key.
        verbose: `"auto"`, `0` or `1`, defaults to `"auto"`. Whether to
            print `summary()` at the end of training; `"auto"` follows the
            `verbose` of `fit`.

    Example:

    ```python
    monitor = tfmemopt.callbacks.MemoryMonitor()
    model.fit(x, y, epochs=2, callbacks=[monitor])
    model.history.history["memory/CPU:0/peak_mib"]  # one value per epoch
    monitor.plot("memory.png")
    ```
    """

    def __init__(
        self,
        devices: str | list | tuple = "auto",
        every_n_batches: int = 1,
        reset_peak: str | None = "batch",
        host: bool = True,
        prefix: str = "memory",
        verbose: str | int = "auto",
    ):
        super().__init__()
        if isinstance(devices, str) and devices == "auto":
            self._requested = "auto"
        elif isinstance(devices, str):
            self._requested = [check_device_name(devices)]
        elif isinstance(devices, (list, tuple)) and devices:
            self._requested = [check_device_name(d) for d in devices]
            twice = sorted(
                {d for d in self._requested if self._requested.count(d) > 1}
            )
            if twice:
                raise ValueError(
                    f"`devices` names {', '.join(twice)} more than once "
                    "(each device's keys would be logged twice). Received: "
                    f"devices={devices!r}. Name each device once."
                )
        else:
            raise TypeError(
                "`devices` must be 'auto', a device name or a non-empty "
                "list of device names such as ['GPU:0', 'GPU:1']. "
                f"Received: devices={devices!r} (of type "
                f"{type(devices).__name__})."
            )
        check_int("every_n_batches", every_n_batches)
        if reset_peak not in _RESET_CHOICES:
            raise ValueError(
                f"Unknown `reset_peak`: {reset_peak!r}. Expected one of "
                "'batch', 'epoch', 'train' or None."
            )
        if not isinstance(host, bool):
            raise TypeError(
                f"`host` must be True or False. Received: host={host!r} (of "
                f"type {type(host).__name__})."
            )
        if not isinstance(prefix, str):
            raise TypeError(
                "`prefix` must be a non-empty string such as 'memory'. "
                f"Received: prefix={prefix!r} (of type "
                f"{type(prefix).__name__})."
            )
        if not prefix.strip("/"):
            raise ValueError(
                "`prefix` must be a non-empty string such as 'memory'. "
                f"Received: prefix={prefix!r}."
            )
        if verbose not in ("auto", 0, 1):
            raise ValueError(
                f"`verbose` must be 'auto', 0 or 1. Received: {verbose!r}."
            )
        self.every_n_batches = every_n_batches
        self.reset_peak = reset_peak
        self.host = bool(host)
        self.prefix = prefix.strip("/")
        self.verbose = verbose
        self.devices: list[str] = []
        self.records: list[dict] = []
        self._nvml_devices: list[str] = []
        self._warned: set = set()

    # -- device selection --------------------------------------------------

    def _resolve_devices(self) -> None:
        strategy = getattr(self.model, "distribute_strategy", None)
        candidates, wanted = candidate_devices(self._requested, strategy)
        self.devices = [d for d in candidates if memory.stats_available(d)]
        missing = [
            d
            for d in candidates
            if d in wanted and d not in self.devices and d not in self._warned
        ]
        if missing:
            self._warned.update(missing)
            message = no_stats_message(missing, self.prefix, self.host)
            warnings.warn(message, UserWarning, stacklevel=3)
        self._nvml_devices = [
            d
            for d in self.devices
            if d.startswith("GPU") and memory.nvml_memory(d) is not None
        ]

    # -- reading -----------------------------------------------------------

    def _key(self, device: str, what: str) -> str:
        return f"{self.prefix}/{device}/{what}"

    def _read(self) -> dict:
        values = {}
        for device in self.devices:
            try:
                info = memory.device_memory(device)
            except memory.MemoryStatsUnavailable:
                continue
            values[self._key(device, "current_mib")] = (
                info["current"] / memory.MIB
            )
            values[self._key(device, "peak_mib")] = info["peak"] / memory.MIB
        for device in self._nvml_devices:
            info = memory.nvml_memory(device)
            if info is not None:
                values[self._key(device, "used_mib")] = (
                    info["used"] / memory.MIB
                )
                values[self._key(device, "total_mib")] = (
                    info["total"] / memory.MIB
                )
        if self.host:
            rss = memory.host_rss_bytes()
            if rss is not None:
                values[self._key("host", "rss_mib")] = rss / memory.MIB
        return values

    def _reset(self) -> None:
        for device in self.devices:
            memory.reset_peak(device)

    def _log(self, kind, batch, step, logs, values) -> None:
        if logs is not None:
            logs.update(values)
        record = {"kind": kind, "epoch": self._epoch, "batch": batch}
        record["step"] = step
        record.update(values)
        self.records.append(record)

    # -- Keras hooks -------------------------------------------------------

    def on_train_begin(self, logs=None):
        self.records = []
        self._epoch = 0
        self._step_base = 0
        self._steps_in_epoch = 0
        self._last_read_step = 0
        self._resolve_devices()
        if self.reset_peak is not None:
            self._reset()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._steps_in_epoch = 0
        self._epoch_peaks = {}
        if self.reset_peak == "epoch":
            self._reset()

    def on_train_batch_end(self, batch, logs=None):
        # With steps_per_execution, `batch` is the execution's last index
        # as Keras reports it (`begin + steps_per_execution - 1`), also for
        # an epoch's last, partial execution: docs/memory_monitor.md.
        self._steps_in_epoch = batch + 1
        step = self._step_base + batch + 1
        n = self.every_n_batches
        if step // n <= self._last_read_step // n:
            return
        self._last_read_step = step
        values = self._read()
        for key, value in values.items():
            if key.endswith("/peak_mib"):
                self._epoch_peaks[key] = max(
                    value, self._epoch_peaks.get(key, 0.0)
                )
        if self.reset_peak == "batch":
            self._reset()
        self._log("batch", batch, step, logs, values)

    def on_epoch_end(self, epoch, logs=None):
        values = self._read()
        for key, value in self._epoch_peaks.items():
            if key in values:
                values[key] = max(values[key], value)
        if self.reset_peak == "batch":
            self._reset()
        self._step_base += self._steps_in_epoch
        self._log("epoch", None, self._step_base, logs, values)

    def on_train_end(self, logs=None):
        verbose = self.verbose
        if verbose == "auto":
            verbose = (self.params or {}).get("verbose", 1)
        if verbose:
            print(self.summary())

    # -- results -----------------------------------------------------------

    def peaks(self) -> dict:
        """The highest reading of each device and where it happened.

        Returns:
            `{device: {"peak_mib": float, "step": int, "epoch": int}}` for
            every device in `records` (`"host"` with its RSS), from the
            batch and the epoch records (an epoch's reading includes its
            validation).
        """
        return peaks(self.records, self.prefix)

    def summary(self) -> str:
        """A table: per device, the peak MiB and the step where it happened.

        Returns:
            The table as a string (also printed at the end of `fit` unless
            `verbose=0`).
        """
        return format_summary(self.records, self.prefix)

    def plot(self, path: str, dpi: int = 100) -> str:
        """Writes a PNG of current and peak MiB against step.

        One panel per device (and one for host RSS), epoch boundaries as
        dashed lines. Needs matplotlib (`pip install tfmemopt[plot]`).

        Args:
            path: String, where to write the PNG.
            dpi: Int, defaults to `100`. Pixels per inch (the figure is 8
                inches wide).

        Returns:
            `path`.

        Raises:
            ImportError: matplotlib is not installed.
            ValueError: nothing was recorded yet.
        """
        from tfmemopt.callbacks._plot import save_png

        if not self.records:
            raise ValueError(
                "MemoryMonitor.plot: nothing recorded yet. Call it after "
                "`model.fit(..., callbacks=[monitor])`."
            )
        return save_png(self.records, self.prefix, path, dpi=dpi)

    def get_config(self) -> dict:
        return {
            "devices": self._requested,
            "every_n_batches": self.every_n_batches,
            "reset_peak": self.reset_peak,
            "host": self.host,
            "prefix": self.prefix,
            "verbose": self.verbose,
        }
