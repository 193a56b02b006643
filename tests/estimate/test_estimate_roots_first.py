"""The step's replay runs first what needs nothing of the batch (issue
#23): TensorFlow's executor starts every op whose inputs are ready when the
step starts, so an op that reads only constants and variables (the loss
gradient's broadcast of a constant, a weight's cast) is made while the
forward pass has barely begun and held until its last reader."""

import keras
import pytest

from tfmemopt.estimate import _op_orders
from tfmemopt.estimate import _step_graph
from tfmemopt.estimate import _step_trace


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


def test_the_loss_gradient_broadcast_is_made_before_the_forward_pass():
    # Allocator trace of ESPCN (batch 32): the loss gradient's broadcasts,
    # 4.5 and 13.5 MiB, were allocated before the first convolution's
    # output; in graph order the replay made them after the forward pass.
    step = _step_graph.trace_step(_conv_mse(), 8)
    made = [key for key, n in step.events if n]
    tile = _first(made, lambda k: k.startswith("gradient_tape") and "Tile" in k)
    conv = _first(made, lambda k: "c1" in k and "gradient_tape" not in k)
    assert tile < conv, made


def test_roots_first_keeps_every_op_after_its_inputs():
    model = _conv_mse()
    concrete, n_fwd, loss = _step_trace._traced_step(
        model, 8, None, None, None, None
    )
    ops, _ = _step_trace._ops_that_run_in(concrete, n_fwd, loss)
    captured = {t.op.name for t in concrete.graph.internal_captures}
    order = _op_orders.roots_first(ops, captured)
    assert sorted(op.name for op in order) == sorted(op.name for op in ops)
    position = {op.name: i for i, op in enumerate(order)}
    for op in order:
        for p in [t.op for t in op.inputs] + list(op.control_inputs):
            if p.name in position:
                assert position[p.name] < position[op.name], (p.name, op.name)
    # Something moved: the order is not graph order.
    assert [op.name for op in order] != [op.name for op in ops]


@pytest.mark.parametrize("captured", [set(), {"x"}])
def test_roots_first_moves_only_what_reads_constants_and_captures(captured):
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (4,), name="x")
        y = tf.compat.v1.placeholder(tf.float32, (4,), name="y")
        a = tf.math.square(y, name="a")  # reads the batch
        b = tf.tile(tf.constant([1.0]), [4], name="b")  # constants only
        c = tf.math.add(x, 1.0, name="c")  # reads x
        tf.math.add_n([a, b, c], name="d")
    ops = g.get_operations()
    names = [op.name for op in _op_orders.roots_first(ops, captured)]
    assert names.index("b") < names.index("y")
    assert (names.index("c") < names.index("y")) == ("x" in captured)
    assert names.index("a") > names.index("y")
