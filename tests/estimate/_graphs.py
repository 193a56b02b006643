"""Small graphs for the simulation's tests: ops built in a fresh graph,
and each tensor's bytes as the step trace sizes it."""

import tensorflow as tf

from tfmemopt.estimate import _step_trace


def graph_ops(build):
    """The ops `build()` adds to a fresh graph, in creation order."""
    g = tf.Graph()
    with g.as_default():
        build()
    return g.get_operations()


def size(t):
    """Bytes of tensor `t` (0 when unknown)."""
    return _step_trace._nbytes(t) or 0
