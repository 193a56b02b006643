"""The order a step's ops run in: TensorFlow's executor on its inter-op
threads, with each op's duration taken from the bytes it reads and writes
(`_op_orders.executor_order` simulates the threads).

TensorFlow runs a `tf.function`'s ops as their inputs become ready, on the
inter-op thread pool (as many threads as physical cores by default). The
order decides what is alive together: a replay in graph order interleaves
parallel branches as the gradient graph was built (an Inception module's
four branches' BatchNorm gradients all at once), where the executor goes
deep into one branch per thread; and it runs late what the executor runs
early (a wide-and-deep model's embedding gradients). The estimate's peak is
the simulated peak in this order (issue #23: measured on 2 threads).
"""

from __future__ import annotations

import os

import tensorflow as tf

from tfmemopt.estimate._op_orders import executor_order
from tfmemopt.estimate._saved_activations import _ALIAS
from tfmemopt.estimate._saved_activations import _FREE

# Kernels the executor runs inline, never handed to the pool: those that
# only hand a buffer on or read metadata (`OpKernel::IsExpensive` is false
# for them), and any op that touches less than this many bytes (the
# executor's cost model measures such kernels as cheap and inlines them).
INLINE_BELOW = 64 * 1024
_INLINE = _ALIAS | _FREE | {"Placeholder", "NoOp"}
# Every op costs this on top of its bytes (the executor's own work).
_OP_OVERHEAD = 1024


def inter_op_threads() -> int:
    """The inter-op threads TensorFlow runs a step's ops on: its setting,
    else the number of CPUs it uses by default."""
    threads = tf.config.threading.get_inter_op_parallelism_threads()
    if threads:
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def replay_order(ops, whole_size, threads: int | None = None, same=None):
    """`(ops in the order the executor runs them, spans)`: `spans` maps
    each op's name to its (start, end) on the simulated threads.

    `whole_size(t)`: the bytes of tensor `t` (every tensor counted, a loop's
    TensorList whole). An op's duration is the bytes it reads and writes,
    plus a fixed overhead. `same`: tensor name -> the tensor Grappler kept
    in its place (`_dedup.duplicates`); a merged-away op's readers wait for
    the kept one's.
    """
    cost = {}
    for op in ops:
        moved = sum(whole_size(t) or 0 for t in (*op.inputs, *op.outputs))
        cost[op.name] = moved + _OP_OVERHEAD

    def expensive(op):
        return op.type not in _INLINE and cost[op.name] >= INLINE_BELOW

    spans = {}
    order = executor_order(
        ops,
        lambda op: cost[op.name],
        expensive,
        threads=threads or inter_op_threads(),
        spans=spans,
        merged={
            t.split(":")[0]: kept.split(":")[0]
            for t, kept in (same or {}).items()
        },
    )
    return order, spans
