"""Peaks and the summary table from `MemoryMonitor.records` (pure Python)."""

from __future__ import annotations


def _split(key, prefix):
    """`"memory/GPU:0/peak_mib"` -> `("GPU:0", "peak_mib")`, else None."""
    if not key.startswith(prefix + "/"):
        return None
    return tuple(key[len(prefix) + 1 :].rsplit("/", 1))


def peaks(records, prefix="memory"):
    """`{device: {"peak_mib", "step", "epoch"}}`: each device's highest value.

    Devices are read from `peak_mib` keys, the host from `rss_mib`. Batch
    and epoch records are both read: an epoch's reading covers its
    validation and what ran after its last logged batch, which may be the
    highest. The first of equal values wins (a batch before its epoch).
    """
    result = {}
    for row in records:
        for key, value in row.items():
            parts = _split(key, prefix)
            if parts is None or parts[1] not in ("peak_mib", "rss_mib"):
                continue
            best = result.get(parts[0])
            if best is None or value > best["peak_mib"]:
                result[parts[0]] = {
                    "peak_mib": value,
                    "step": row["step"],
                    "epoch": row["epoch"],
                }
    return result


def format_summary(records, prefix="memory"):
    """A text table: device, peak MiB, its step and epoch, the last value."""
    best = peaks(records, prefix)
    if not best:
        return "MemoryMonitor: nothing recorded (call after `fit`)."
    last = records[-1]
    lines = [
        "MemoryMonitor summary (MiB; host = process RSS; epochs from 1)",
        f"{'device':<10}{'peak':>12}{'at step':>9}{'epoch':>7}{'last':>12}",
    ]
    for device, b in best.items():
        what = "rss_mib" if device == "host" else "current_mib"
        now = last.get(f"{prefix}/{device}/{what}", float("nan"))
        lines.append(
            f"{device:<10}{b['peak_mib']:>12.1f}{b['step']:>9}"
            f"{b['epoch'] + 1:>7}{now:>12.1f}"
        )
    return "\n".join(lines)
