"""Device memory from TensorFlow's allocators, host memory from psutil.

`tf.config.experimental.get_memory_info` works on GPUs and TPUs, and on
`CPU:0` when oneDNN's allocator is registered (`TF_ENABLE_ONEDNN_OPTS=1`,
TensorFlow's default only on some x86-64 CPUs). Elsewhere it raises
`ValueError("Allocator stats not available ...")`: these helpers turn that
into `MemoryStatsUnavailable` or `None`, never a crash in a callback.
"""

from __future__ import annotations

import os
from typing import Callable

import tensorflow as tf

MIB = 1024 * 1024


class MemoryStatsUnavailable(RuntimeError):
    """The device's allocator keeps no statistics."""


def canonical_device(device: str) -> str:
    """`"/device:GPU:0"`, `"/job:.../device:GPU:0"`, `"gpu:0"` -> `"GPU:0"`."""
    if not isinstance(device, str) or not device:
        raise TypeError(
            "`device` must be a device name such as 'GPU:0' or 'CPU:0'. "
            f"Received: device={device!r} (of type {type(device).__name__})."
        )
    name = device.split("device:")[-1].lstrip("/")
    kind, _, index = name.rpartition(":")
    if not kind:
        kind, index = name, "0"
    return f"{kind.upper()}:{index}"


def local_devices() -> list[str]:
    """Names (`"GPU:0"`, `"TPU:0"`, `"CPU:0"`) of the devices TF sees here."""
    names = []
    for kind in ("TPU", "GPU", "CPU"):
        for dev in tf.config.list_logical_devices(kind):
            names.append(canonical_device(dev.name))
    return names


def device_memory(device: str = "CPU:0") -> dict[str, int]:
    """Current and peak bytes held by TensorFlow's allocator on `device`.

    Returns:
        `{"current": int, "peak": int}` in bytes.

    Raises:
        MemoryStatsUnavailable: the device's allocator keeps no statistics
            (on CPU: oneDNN is off; set `TF_ENABLE_ONEDNN_OPTS=1` before
            TensorFlow is imported).
    """
    name = canonical_device(device)
    try:
        info = tf.config.experimental.get_memory_info(name)
    except (ValueError, tf.errors.OpError) as e:
        hint = ""
        if name.startswith("CPU"):
            flag = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset")
            hint = (
                " On CPU the statistics come from oneDNN's allocator: set "
                "TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is imported "
                f"(now: TF_ENABLE_ONEDNN_OPTS={flag})."
            )
        raise MemoryStatsUnavailable(
            f"No memory statistics for device {name!r}: {e}.{hint}"
        ) from e
    return {"current": int(info["current"]), "peak": int(info["peak"])}


def stats_available(device: str = "CPU:0") -> bool:
    """Whether `device_memory(device)` works here."""
    try:
        device_memory(device)
    except MemoryStatsUnavailable:
        return False
    return True


def reset_peak(device: str = "CPU:0") -> bool:
    """Resets the peak of `device` to its current usage; False if impossible."""
    try:
        tf.config.experimental.reset_memory_stats(canonical_device(device))
    except (ValueError, tf.errors.OpError):
        return False
    return True


_STATM: dict = {}  # pid -> descriptor of /proc/<pid>/statm, or None


def _statm_rss() -> int | None:
    """RSS from /proc/<pid>/statm through a descriptor kept open (Linux).

    About 10 us, against 60-400 us for psutil, which opens the file (and
    builds a Process) on every call: this is read after every batch.
    """
    pid = os.getpid()  # a forked child must not read its parent's file
    if pid not in _STATM:
        try:
            _STATM[pid] = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
        except OSError:
            _STATM[pid] = None
    fd = _STATM[pid]
    if fd is None:
        return None
    try:
        return int(os.pread(fd, 256, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None


def host_rss_bytes() -> int | None:
    """Resident set size of this process in bytes (None without psutil)."""
    rss = _statm_rss()
    if rss is not None:
        return rss
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return None
    return int(psutil.Process().memory_info().rss)


def measure_peak(
    fn: Callable[[], object], device: str = "CPU:0"
) -> tuple[int, object]:
    """Runs `fn()` and returns (peak bytes above the starting usage, result).

    The peak is reset before the call, so the figure is the extra memory
    that `fn` needed at its worst moment, not what was held before it.
    """
    # Touch the device so that its allocator exists before the baseline.
    with tf.device(canonical_device(device)):
        tf.constant(0.0) + 1.0
    base = device_memory(device)["current"]
    reset_peak(device)
    result = fn()
    peak = device_memory(device)["peak"]
    return max(peak - base, 0), result
