"""Which devices `MemoryMonitor` reads: names checked, "auto" worked out."""

from __future__ import annotations

from tfmemopt import memory
from tfmemopt.memory import canonical_device

_KINDS = ("CPU", "GPU", "TPU")


def check_device_name(device) -> str:
    """A short device name (`"GPU:0"`), or a TypeError/ValueError."""
    if not isinstance(device, str):
        raise TypeError(
            "`devices` must be 'auto', a device name or a list of device "
            "names such as ['GPU:0', 'GPU:1']. Received an entry "
            f"{device!r} (of type {type(device).__name__})."
        )
    name = canonical_device(device)
    kind, _, index = name.partition(":")
    if kind not in _KINDS or not index.isdigit():
        raise ValueError(
            f"Unknown device name {device!r} in `devices`: expected a name "
            "like 'GPU:0', 'TPU:0' or 'CPU:0', or devices='auto'."
        )
    return name


def candidate_devices(requested, strategy=None) -> tuple[list, set]:
    """(devices to try in order, those whose lack of stats deserves a word).

    `requested` is `"auto"` or a list of short names. "auto" means every
    GPU and TPU, the strategy's replica devices, and `CPU:0`; `CPU:0` is
    only worth a warning when nothing else computes here.

    Raises:
        ValueError: a requested device does not exist in this process.
    """
    local = memory.local_devices()
    if requested != "auto":
        unknown = [d for d in requested if d not in local]
        if unknown:
            raise ValueError(
                f"MemoryMonitor: unknown device(s) {unknown}. This process "
                f"sees {local}; pass some of those, or devices='auto'."
            )
        return list(requested), set(requested)
    accelerators = [d for d in local if not d.startswith("CPU")]
    replicas = memory.replica_devices(strategy)
    wanted = set(accelerators) | set(replicas)
    if not wanted:
        wanted.add("CPU:0")  # the only device that computes here
    ordered = []
    for name in accelerators + replicas + ["CPU:0"]:
        if name not in ordered:
            ordered.append(name)
    return ordered, wanted


def no_stats_message(missing, prefix, host) -> str:
    """The one warning for devices whose allocator keeps no statistics."""
    names = ", ".join(missing)
    text = f"MemoryMonitor: no allocator memory statistics for {names}."
    if host:
        text += f" Logging host memory ({prefix}/host/rss_mib) only."
    if any(d.startswith("CPU") for d in missing):
        text += (
            " On CPU the statistics come from oneDNN's allocator: set "
            "TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is imported."
        )
    return text
