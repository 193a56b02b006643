"""Draws `MemoryMonitor.records`: MiB against step, one panel per device."""

from __future__ import annotations

_INSTALL = (
    "MemoryMonitor.plot needs matplotlib, which is not installed. Install "
    "it with `pip install matplotlib` (or `pip install tfmemopt[plot]`)."
)


def _series(records, prefix):
    """{device: {what: ([steps], [values])}} from the batch records."""
    series = {}
    for row in records:
        if row["kind"] != "batch":
            continue
        for key, value in row.items():
            if not key.startswith(prefix + "/"):
                continue
            device, what = key[len(prefix) + 1 :].rsplit("/", 1)
            steps, values = series.setdefault(device, {}).setdefault(
                what, ([], [])
            )
            steps.append(row["step"])
            values.append(value)
    return series


def figure(records, prefix="memory"):
    """A matplotlib `Figure` of the records (no pyplot, no global state).

    Raises:
        ImportError: matplotlib is not installed (says how to install it).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(_INSTALL) from e
    series = _series(records, prefix)
    if not series:  # only epoch records: draw those
        series = _series(
            [dict(r, kind="batch") for r in records if r["kind"] == "epoch"],
            prefix,
        )
    boundaries = [r["step"] for r in records if r["kind"] == "epoch"]
    devices = [d for d in series if d != "host"]
    devices += ["host"] if "host" in series else []
    fig = Figure(figsize=(8, 2.4 * max(len(devices), 1)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(len(devices), 1), 1, sharex=True, squeeze=False)
    for ax, device in zip(axes[:, 0], devices):
        for what, style in (
            ("peak_mib", "-"),
            ("current_mib", "-"),
            ("used_mib", ":"),
            ("rss_mib", "-"),
        ):
            if what in series[device]:
                steps, values = series[device][what]
                ax.plot(steps, values, style, label=what, marker=".")
        for step in boundaries:
            ax.axvline(step, color="grey", linestyle="--", linewidth=0.8)
        ax.set_ylabel("MiB")
        ax.set_title(f"{prefix}/{device}", fontsize=9, loc="left")
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step (dashed: end of epoch)")
    fig.tight_layout()
    return fig


def save_png(records, prefix, path, dpi=100):
    """Writes `figure(records)` to `path` as a PNG and returns `path`."""
    fig = figure(records, prefix)
    fig.savefig(path, format="png", dpi=dpi)
    return path
