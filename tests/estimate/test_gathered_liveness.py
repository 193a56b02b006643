"""Gathered weights live briefly in the real train step (`shard_parameters`).

One subprocess on 2 logical CPUs builds a stack of 4 Dense blocks and a
head, sharded, and reads the graph Keras runs per train step
(`estimate/_gathered_liveness.py`): without checkpointing every weight that
a backward pass reads is alive at the turn from forward to backward; with
every block checkpointed, no more than one block's weights (plus the
head's, outside the segments) are alive at the step's peak, or at any
point as whole weights. Logical CPUs share one allocator, so this is read
from the graph, not from the allocator.
"""

from conftest import run_in_subprocess

CODE = """
import keras, numpy as np, tfmemopt
from tfmemopt.estimate._gathered_liveness import gathered_liveness
from tfmemopt.estimate._gathered_liveness import whole_bytes

STRATEGY = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
W, BLOCKS = 128, ["b0", "b1", "b2", "b3"]
# 128 rows per replica: the activations a block keeps (64 KiB) weigh as
# much as its kernel, so the step's peak is at the forward/backward turn.
X = np.zeros((256, W), "float32")
Y = np.zeros((256, 4), "float32")


def report(shard, checkpointing):
    with STRATEGY.scope():
        inp = keras.Input((W,))
        h = inp
        for name in BLOCKS:
            h = keras.layers.Dense(W, activation="relu", name=name)(h)
        out = keras.layers.Dense(4, name="head")(h)
        model = tfmemopt.Model(inp, out, shard_parameters=shard,
                               checkpointing=checkpointing)
        model.compile(keras.optimizers.SGD(0.01), "mse")
    r = gathered_liveness(model, X, Y)

    def nbytes(names, attr="trainable_weights"):
        return [whole_bytes(getattr(model.get_layer(n), attr))
                for n in names]

    return {
        "gathers": r.gathers_by_layer,
        "orders": {k: v._asdict() for k, v in r.orders.items()},
        "whole": whole_bytes(model.trainable_weights),
        "blocks": nbytes(BLOCKS),
        "head": nbytes(["head"])[0],
        "kernels": [whole_bytes([model.get_layer(n).kernel])
                    for n in BLOCKS + ["head"]],
    }


emit({"plain": report(True, None), "checkpointed": report(True, BLOCKS),
      "unsharded": report(False, None)})
"""


def test_gathered_weights_live_briefly_in_the_step_graph():
    out = run_in_subprocess(CODE, n_cpus=2)
    plain, ckpt = out["plain"], out["checkpointed"]

    # Each weight gathered once per step; checkpointed blocks gather again
    # in the recompute (2 weights per layer).
    assert plain["gathers"] == {"b0": 2, "b1": 2, "b2": 2, "b3": 2, "head": 2}
    assert ckpt["gathers"] == {"b0": 4, "b1": 4, "b2": 4, "b3": 4, "head": 2}
    assert out["unsharded"]["gathers"] == {}
    assert out["unsharded"]["orders"]["graph"]["max_gathered"] == 0

    # Without checkpointing, at the peak (the forward/backward turn) every
    # kernel a backward pass reads is alive: all but the first layer's
    # (the input needs no gradient); biases are not read.
    graph = plain["orders"]["graph"]
    read_by_backward = sum(plain["kernels"][1:])
    assert graph["gathered_at_peak"] == read_by_backward, graph
    assert graph["max_whole"] >= read_by_backward, graph

    # With every block checkpointed: whole weights alive together, at any
    # point and in either order, at most the largest segment's and the
    # head's (outside the segments). Counting the gather's own copies too
    # (`ReplicaContext.all_gather` copies the gathered parts once more to
    # drop its padding, and the cut's parts are joined into the weight's
    # shape): at most one weight's second copy on top.
    bound = max(ckpt["blocks"]) + ckpt["head"]
    transient = max(ckpt["kernels"])
    # "gathers_first": every gather (and what it needs) runs as soon as it
    # can, ahead of the layers' compute, as TF's executor ran them in a
    # profiled step: a segment's gathers must wait for its inputs.
    for order in ("graph", "asap", "gathers_first"):
        live = ckpt["orders"][order]
        assert live["max_whole"] <= bound, (order, live, bound)
        assert live["max_gathered"] <= bound + transient, (order, live)
        assert live["gathered_at_peak"] <= bound + transient, (order, live)
    # ... which the plain step exceeds: the bound can fail.
    assert graph["gathered_at_peak"] > bound + transient
    assert graph["max_whole"] > bound
    assert ckpt["orders"]["graph"]["peak"] < graph["peak"]


def test_observed_order_follows_the_profile_and_the_graph():
    import tensorflow as tf

    from tfmemopt.estimate._op_orders import observed_order

    @tf.function
    def step(x):
        a = tf.nn.relu(x, name="a")
        b = tf.exp(x, name="b")
        c = tf.add(a, b, name="c")
        return tf.identity(c * 2.0, name="d")

    graph = step.get_concrete_function(tf.TensorSpec([4])).graph
    ops = graph.get_operations()
    # b ran before a; c's time was not recorded (fused into d's kernel);
    # d is recorded before a, which it reads: it cannot run before a.
    started = {"b": 1, "a": 5, "d": 3}
    names = [op.name for op in observed_order(ops, started)]
    assert names.index("b") < names.index("a") < names.index("c")
    assert names.index("c") < names.index("d")
    assert sorted(names) == sorted(op.name for op in ops)
