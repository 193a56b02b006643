"""The devices that a `tf.distribute` strategy computes on, in short names."""

from __future__ import annotations

import tensorflow as tf

from tfmemopt.memory._device import canonical_device


def replica_devices(strategy: tf.distribute.Strategy | None = None) -> list:
    """Short names (`"GPU:0"`, `"CPU:1"`) of this worker's replica devices.

    Free: reads the strategy's device list, touches no device.

    Args:
        strategy: A `tf.distribute.Strategy`, defaults to `None` (the
            strategy in scope, `tf.distribute.get_strategy()`).

    Returns:
        A list of device names in replica order, without duplicates; empty
        for the default (no-op) strategy, whose ops go wherever TensorFlow
        places them.

    Example:
        >>> strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
        >>> replica_devices(strategy)
        ['CPU:0', 'CPU:1']
    """
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    try:  # the default strategy raises RuntimeError here
        devices = strategy.extended.worker_devices
    except (RuntimeError, AttributeError, NotImplementedError):
        return []
    names = []
    for device in devices:
        name = canonical_device(device)
        if name not in names:
            names.append(name)
    return names
