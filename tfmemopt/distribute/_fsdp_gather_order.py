"""When a sharded weight's all-gather may run (`shard_parameters=True`).

Under parameter sharding with accumulation, `tfmemopt.Model` traces its
micro-batches one after another in Python (the all-gather's `merge_call`
cannot run inside a `tf.while_loop`, see accumulation/_window.py). Graph
execution runs an op as soon as its inputs exist, and a gather's only input
is the replica's part: every micro-batch's gathers could run at the start of
the step and keep `accumulation_steps` whole copies of each weight alive.
The window therefore opens `gathers_after(start)` around each micro-batch,
where `start` exists only once the previous micro-batch is accumulated, and
`ordered(part)` makes each gather wait for it.

Each replica of `MirroredStrategy` traces in its own thread, so the setting
is thread-local.
"""

from __future__ import annotations

import threading

import tensorflow as tf

_STATE = threading.local()


class gathers_after:
    """Context manager: gathers traced inside wait for `tensor` (or None)."""

    def __init__(self, tensor):
        self.tensor = tensor if tf.is_tensor(tensor) else None

    def __enter__(self):
        self.previous = getattr(_STATE, "after", None)
        _STATE.after = self.tensor
        return self

    def __exit__(self, *args):
        _STATE.after = self.previous
        return False


def ordered(part):
    """`part`, made to wait for the enclosing `gathers_after` tensor."""
    after = getattr(_STATE, "after", None)
    if after is None or getattr(after, "graph", None) is not part.graph:
        return part
    with tf.control_dependencies([after]):
        return tf.identity(part)
