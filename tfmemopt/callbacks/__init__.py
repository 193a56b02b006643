"""Keras callbacks: memory readings in `logs`, summaries and plots."""

from tfmemopt.callbacks.memory_monitor import MemoryMonitor

__all__ = [
    "MemoryMonitor",
]
