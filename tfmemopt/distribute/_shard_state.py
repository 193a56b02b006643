"""Reading and writing `ShardedOptimizer`'s per-replica state as whole tensors.

Each slot of a sharded optimizer is a `synchronization="on_read"` variable
whose R components hold different partitions. Read outside a replica it
would return replica 0's part (or raise), so saving gathers the parts with a
collective inside `strategy.run` (every worker of a multi-worker strategy
must join), and loading hands each replica the whole value and lets it keep
its own part.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def replica_id(ctx) -> int:
    """The replica's index as a Python int (a graph constant per replica)."""
    value = tf.get_static_value(ctx.replica_id_in_sync_group)
    if value is None:
        raise ValueError(
            "tfmemopt.ShardedOptimizer needs each replica's index as a "
            "constant when the step is traced; this strategy "
            f"({type(tf.distribute.get_strategy()).__name__}) gives it only "
            "at run time (TPUStrategy does). Use the inner optimizer "
            "unwrapped on this strategy."
        )
    return int(value)


def gather_bits(ctx, flat):
    """`ctx.all_gather(flat, axis=0)`, also for bfloat16: the gather
    collective takes none, so its 16 bits travel as a float16 (a bitcast:
    every bit pattern comes back as it was). Not differentiable for
    bfloat16 (`_fsdp` gives that gather its gradient)."""
    if flat.dtype != tf.bfloat16:
        return ctx.all_gather(flat, axis=0)
    gathered = ctx.all_gather(tf.bitcast(flat, tf.float16), axis=0)
    return tf.bitcast(gathered, tf.bfloat16)


def all_gather_parts(ctx, parts, replicas: int):
    """All-gathers equal-length flat parts in one collective.

    Args:
        ctx: The replica context.
        parts: List of 1-D tensors of one dtype (this replica's parts).
        replicas: Number of replicas.

    Returns:
        List of `[replicas, len(part)]` tensors, row r from replica r.
    """
    sizes = [int(p.shape[0]) for p in parts]
    flat = tf.concat(parts, 0) if len(parts) > 1 else parts[0]
    gathered = gather_bits(ctx, flat)
    blocks = tf.reshape(gathered, [replicas, sum(sizes)])
    out, start = [], 0
    for size in sizes:
        out.append(blocks[:, start : start + size])
        start += size
    return out


def gather_by_dtype(ctx, parts, replicas: int):
    """`all_gather_parts` with one collective per dtype, order kept."""
    groups: dict = {}
    for i, p in enumerate(parts):
        groups.setdefault(p.dtype, []).append(i)
    out = [None] * len(parts)
    for indices in groups.values():
        chosen = [parts[i] for i in indices]
        for i, block in zip(indices, all_gather_parts(ctx, chosen, replicas)):
            out[i] = block
    return out


def read_whole(strategy, partitioned, replicated):
    """Whole values of the per-replica state, as numpy arrays.

    Args:
        strategy: The strategy the state was built under.
        partitioned: List of `(variable, Layout)`: slots holding one part per
            replica.
        replicated: List of per-replica variables whose components are equal.

    Returns:
        `(whole_partitioned, replicated_values)`: lists of numpy arrays.
    """
    replicas = strategy.num_replicas_in_sync

    @tf.function
    def step():
        ctx = tf.distribute.get_replica_context()
        parts = [_gatherable(v.value) for v, _ in partitioned]
        blocks = gather_by_dtype(ctx, parts, replicas) if parts else []
        same = [tf.convert_to_tensor(v.value) for v in replicated]
        return blocks, same

    with strategy.scope():
        blocks, same = strategy.run(step)
    first = strategy.experimental_local_results
    whole = [
        layout.assemble(np.asarray(first(b)[0])).astype(_numpy_dtype(v))
        for b, (v, layout) in zip(blocks, partitioned)
    ]
    return whole, [np.asarray(first(s)[0]) for s in same]


def _numpy_dtype(variable):
    return tf.as_dtype(variable.dtype).as_numpy_dtype


def _gatherable(value):
    """`value` as a tensor the all-gather takes: 8- and 16-bit integers
    (8-bit optimizer codes) travel as int32, at save time only."""
    t = tf.convert_to_tensor(value)
    if t.dtype in (tf.uint8, tf.int8, tf.uint16, tf.int16):
        t = tf.cast(t, tf.int32)
    return t


def write_whole(strategy, partitioned, whole, replicated, values):
    """Writes whole values into the per-replica state (each keeps its part)."""

    @tf.function
    def step(whole, values):
        r = replica_id(tf.distribute.get_replica_context())
        for (v, layout), w in zip(partitioned, whole):
            v.assign(layout.local(tf.reshape(w, [-1]), r))
        for v, w in zip(replicated, values):
            v.assign(w)

    whole = [tf.convert_to_tensor(w) for w in whole]
    values = [tf.convert_to_tensor(w) for w in values]
    with strategy.scope():
        strategy.run(step, args=(whole, values))
