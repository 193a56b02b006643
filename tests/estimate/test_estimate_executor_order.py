"""The step's replay follows TensorFlow's executor (issue #23): ops run as
their inputs become ready, on the inter-op threads, each thread going deep
into one branch; an op's inputs are released when it ends; Grappler's
rewrites that change what is alive (a sum accumulated input by input, a
product by one folded away) are replayed too."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfmemopt.estimate import _op_orders
from tfmemopt.estimate import _step_graph
from tfmemopt.estimate import _step_trace
from tfmemopt.estimate._dedup import times_one
from tfmemopt.estimate._executor import replay_order
from tfmemopt.estimate._simulate import _simulate

from ._graphs import graph_ops
from ._graphs import size

MIB = 1 << 20


def _conv_mse():
    # An image-sized MSE target: the gradient of the loss's mean is a
    # broadcast of a constant to the output's shape (a Tile).
    inp = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", name="c1")(inp)
    out = keras.layers.Conv2D(3, 3, padding="same", name="c2")(x)
    model = keras.Model(inp, out)
    model.compile(optimizer="sgd", loss="mse")
    return model


def _first(keys, test):
    return next(i for i, k in enumerate(keys) if isinstance(k, str) and test(k))


def test_what_needs_nothing_of_the_batch_is_made_as_the_step_starts():
    # Allocator trace of ESPCN (batch 32): the loss gradient's broadcasts,
    # 4.5 and 13.5 MiB, were allocated before the first convolution's
    # output; in graph order a replay makes them after the forward pass.
    # Replayed, the broadcast runs beside the first convolution, on the
    # other thread, before the second.
    step = _step_graph.trace_step(_conv_mse(), 8)
    made = [key for key, n in step.events if n]
    tile = _first(made, lambda k: k.startswith("gradient_tape") and "Tile" in k)
    conv = _first(made, lambda k: "c2" in k and "gradient_tape" not in k)
    assert tile < conv, made


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_the_replay_keeps_every_op_after_its_inputs(threads):
    model = _conv_mse()
    concrete, n_fwd, loss = _step_trace._traced_step(
        model, 8, None, None, None, None
    )
    ops, _ = _step_trace._ops_that_run_in(concrete, n_fwd, loss)
    order, spans = replay_order(ops, _step_trace._nbytes, threads=threads)
    assert sorted(op.name for op in order) == sorted(op.name for op in ops)
    position = {op.name: i for i, op in enumerate(order)}
    for op in order:
        for p in [t.op for t in op.inputs] + list(op.control_inputs):
            if p.name in position:
                assert position[p.name] < position[op.name], (p.name, op.name)
                assert spans[p.name][1] <= spans[op.name][0]
    starts = [spans[op.name][0] for op in order]
    assert starts == sorted(starts)
    # At most `threads` ops run at any time.
    for op in order:
        t = spans[op.name][0]
        running = [s for s, e in spans.values() if s <= t < e]
        assert len(running) <= threads


def _branches(n=3, depth=2):
    # A root, `n` chains of `depth` ops that each read the one before, and
    # a sum of the chains' ends.
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (4,), name="x")
        ends = []
        for b in range(n):
            y = x
            for d in range(depth):
                y = tf.math.square(y, name=f"b{b}_{d}")
            ends.append(y)
        tf.math.add_n(ends, name="join")
    return g.get_operations()


def test_one_thread_goes_deep_into_one_branch_at_a_time():
    ops = _branches()
    order = _op_orders.executor_order(ops, lambda op: 1, lambda op: True, 1)
    names = [op.name for op in order]
    # The executor runs the last ready branch inline and queues the others
    # at the front of its queue: b2, then b1, then b0, each whole (graph
    # order would run b0 first).
    assert names == [
        "x",
        "b2_0",
        "b2_1",
        "b1_0",
        "b1_1",
        "b0_0",
        "b0_1",
        "join",
    ]


def test_an_idle_thread_steals_the_oldest_task():
    ops = _branches()
    order = _op_orders.executor_order(ops, lambda op: 1, lambda op: True, 2)
    names = [op.name for op in order]
    # Thread 0 runs b2 inline and queues b0, b1 (b1 at the front); thread
    # 1 steals from the back: b0. Both run their branch to its end.
    assert names.index("b2_1") < names.index("b1_0")
    assert names.index("b0_0") < names.index("b1_0")
    assert names[-1] == "join"


def test_inexpensive_ops_run_inline_before_the_next_task():
    ops = _branches()
    cheap = {"b0_0", "b1_0", "b2_0"}
    order = _op_orders.executor_order(
        ops, lambda op: 1, lambda op: op.name not in cheap, 1
    )
    names = [op.name for op in order]
    # All three first ops are inline successors of the root: they run
    # before any second op, in their readers' order.
    assert names[1:4] == ["b0_0", "b1_0", "b2_0"]


def test_an_op_holds_its_inputs_until_it_ends():
    # `slow` reads `a` and runs long; `made` starts meanwhile, on the other
    # thread: `a` is still held when it allocates.
    def build():
        x = tf.compat.v1.placeholder(tf.float32, (256, 1024), name="x")
        a = tf.math.square(x, name="a")
        tf.math.square(a, name="slow")
        tf.math.square(x, name="made")

    ops = graph_ops(build)
    assert [op.name for op in ops] == ["x", "a", "slow", "made"]
    keep = [ops[2].outputs[0], ops[3].outputs[0]]
    spans = {"x": (0, 0), "a": (0, 1), "slow": (1, 10), "made": (2, 3)}
    alone = _simulate(ops, keep, size, {}, in_place=False)
    beside = _simulate(ops, keep, size, {}, in_place=False, spans=spans)
    assert alone == 3 * MIB  # x, slow, made: a is freed as slow starts
    assert beside == 4 * MIB  # a is held until slow ends


def test_a_rewritten_sum_adds_each_input_as_it_is_made():
    # Four 1 MiB terms made one after another, then summed: all four are
    # alive before the sum; accumulated, each is added and freed once the
    # sum's buffer (made with the first input) is there.
    def build():
        x = tf.compat.v1.placeholder(tf.float32, (256, 1024), name="x")
        terms = [tf.math.square(x, name=f"t{i}") for i in range(4)]
        tf.math.add_n(terms, name="sum")

    ops = graph_ops(build)
    out = [ops[-1].outputs[0]]
    plain = _simulate(ops, out, size, {}, in_place=False)
    summed = _simulate(ops, out, size, {}, in_place=False, accumulated={"sum"})
    assert plain == 5 * MIB  # four terms and the sum (x freed after t3)
    assert summed == 3 * MIB  # x, the sum's buffer, the term being added
    # The first input comes last: every other term waits for it.
    ops = ops[:1] + ops[2:5] + ops[1:2] + ops[5:]
    assert [op.name for op in ops[1:5]] == ["t1", "t2", "t3", "t0"]
    late = _simulate(ops, out, size, {}, in_place=False, accumulated={"sum"})
    # x, t1..t3 held, then t0 and the sum's buffer on top.
    assert late == 6 * MIB


def test_a_product_by_one_is_folded_into_its_factor():
    def build():
        x = tf.compat.v1.placeholder(tf.float32, (4, 8), name="x")
        tf.math.multiply(x, 1.0, name="one")
        tf.math.multiply(
            tf.constant(np.ones((4, 8), np.float32)), x, name="ones"
        )
        tf.math.multiply(x, 2.0, name="two")
        tf.math.multiply(tf.ones((4, 1)), x, name="broadcast")
        tf.math.multiply(x[:1], tf.ones((4, 8)), name="wider")

    folded = times_one(graph_ops(build))
    assert folded == {"one:0": "x:0", "ones:0": "x:0", "broadcast:0": "x:0"}


def test_grappler_cannot_size_a_loop_s_lists():
    # An LSTM's TensorLists are variant scalars to Grappler's static
    # estimate: its peak, which decides the rewrite of large sums, leaves
    # them out, where the simulation counts every element.
    inp = keras.Input((64, 32))
    x = keras.layers.LSTM(256, return_sequences=True)(inp)
    model = keras.Model(inp, keras.layers.Dense(4)(x))
    step = _step_graph.trace_step(model, 64, min_counted_bytes=1)
    assert step.grappler_peak < 0.5 * step.peak, (step.grappler_peak, step.peak)
