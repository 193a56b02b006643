"""GPU memory as the driver sees it, through NVML (`nvidia-ml-py`).

TensorFlow's allocator statistics count only what TensorFlow's BFC allocator
holds; NVML counts everything on the card (other processes, the CUDA context,
cuDNN workspaces, memory that TensorFlow reserved but has not handed out).
Both are useful, so `MemoryMonitor` logs both where NVML is present.

`pynvml` is imported lazily, on the first call: without `nvidia-ml-py`, or
without an NVIDIA driver, every function here returns `None` and nothing
fails.

TensorFlow's `GPU:i` is the i-th GPU that CUDA shows this process; NVML
numbers all GPUs of the machine. The i-th entry of `CUDA_VISIBLE_DEVICES`
(an index or a `GPU-...` UUID) maps one to the other; without it they are
the same. MIG slices and logical GPUs split from one physical GPU are not
mapped (`None`).
"""

from __future__ import annotations

import os
import threading

import tensorflow as tf

from tfmemopt.memory._device import canonical_device

_LOCK = threading.Lock()
_STATE: dict = {}


def _pynvml():
    """The initialised `pynvml` module, or None (not installed, no driver)."""
    with _LOCK:
        if "module" not in _STATE:
            _STATE["module"] = None
            try:
                import pynvml
            except ImportError:
                return None
            try:
                pynvml.nvmlInit()
            except Exception:  # NVMLError subclasses; no driver, no library
                return None
            _STATE["module"] = pynvml
        return _STATE["module"]


def nvml_available() -> bool:
    """Whether NVML can be read here (`nvidia-ml-py` and a driver)."""
    return _pynvml() is not None


def _visible_entry(index: int) -> str | None:
    """The `CUDA_VISIBLE_DEVICES` entry for CUDA device `index`, or None."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(index)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if index >= len(entries):
        return None
    return entries[index]


def _handle(nvml, gpu_index: int):
    entry = _visible_entry(gpu_index)
    if entry is None or entry.upper().startswith("MIG"):
        return None
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    return nvml.nvmlDeviceGetHandleByUUID(entry)


def nvml_memory(device: str) -> dict[str, int] | None:
    """Used and total bytes of a GPU as NVML reports them.

    Costs one NVML call (microseconds); the first call loads NVML.

    Args:
        device: String, a TensorFlow GPU name such as `"GPU:0"` or
            `"/device:GPU:0"`.

    Returns:
        `{"used": int, "total": int}` in bytes, or `None` where NVML is not
        installed, no driver answers, the device is not a GPU, or its NVML
        counterpart is unknown (MIG, logical GPUs).

    Example:
        >>> nvml_memory("GPU:0")  # None on a machine without NVIDIA GPUs
    """
    name = canonical_device(device)
    kind, _, index = name.partition(":")
    if kind != "GPU":
        return None
    nvml = _pynvml()
    if nvml is None:
        return None
    # Logical GPUs split from one card cannot be told apart by index.
    n_logical = len(tf.config.list_logical_devices("GPU"))
    n_physical = len(tf.config.list_physical_devices("GPU"))
    if n_logical != n_physical or int(index) >= n_logical:
        return None
    try:
        handle = _handle(nvml, int(index))
        if handle is None:
            return None
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception:  # NVMLError: device lost, not permitted, ...
        return None
    return {"used": int(info.used), "total": int(info.total)}


def _reset_for_tests() -> None:
    """Forgets the cached module so that a test can swap `pynvml`."""
    with _LOCK:
        _STATE.clear()
