"""The simulation merges identical ops as Grappler does (`_dedup`): a
WaveNet-like gate applies two dilated convolutions to one input, and each
traces its own `SpaceToBatchND` (and causal `Pad`) of it; the step keeps
one of each (issue #23, third held-out set: the allocator trace held 5
`SpaceToBatchND` outputs where the graph has 10, and the estimate was
+23%)."""

import keras
import tensorflow as tf

from tfmemopt.estimate import _step_graph
from tfmemopt.estimate._dedup import duplicates

F32 = 4


def _gate(steps=256, width=16):
    inp = keras.Input((steps, width))
    conv = dict(kernel_size=2, dilation_rate=4, padding="causal")
    f = keras.layers.Conv1D(width, activation="tanh", **conv)(inp)
    g = keras.layers.Conv1D(width, activation="sigmoid", **conv)(inp)
    out = keras.layers.Multiply()([f, g])
    return keras.Model(inp, keras.layers.Dense(1)(out))


def test_identical_ops_are_merged_and_others_are_not():
    @tf.function
    def f(x, y):
        a = tf.add(x, y, name="a")
        b = tf.add(y, x, name="b")  # commutative: the same sum
        c = tf.subtract(x, y, name="c")
        d = tf.subtract(y, x, name="d")  # not commutative
        m = tf.maximum(x, y, name="m")
        n = tf.maximum(y, x, name="n")  # not registered commutative
        s = tf.add_n([x, y, x], name="s")
        t = tf.add_n([x, x, y], name="t")  # commutative
        e = tf.random.uniform([4], name="e")  # stateful: never merged
        h = tf.random.uniform([4], name="h")
        return a + b + c + d + e + h + m + n + s + t

    spec = tf.TensorSpec([4])
    ops = f.get_concrete_function(spec, spec).graph.get_operations()
    same = duplicates(ops, {op.name for op in ops})
    assert same["b:0"] == "a:0"
    assert "d:0" not in same and "c:0" not in same
    assert "n:0" not in same and "m:0" not in same
    assert same["t:0"] == "s:0"
    random = [op.outputs[0].name for op in ops if op.type == "RandomUniform"]
    assert len(random) == 2 and not any(r in same for r in random)
    # Only the ops named in `forward` are merged.
    assert duplicates(ops, {"a"}) == {}
    assert duplicates(ops, {"a", "b"}) == {"b:0": "a:0"}


def _forward_allocations(step, kind):
    return [
        k
        for k, n in step.events
        if n is not None and kind in str(k) and "gradient_tape" not in str(k)
    ]


def test_a_gate_keeps_one_space_to_batch_of_its_input(monkeypatch):
    model = _gate()
    batch, steps, width = 8, 256, 16
    step = _step_graph.trace_step(model, batch, min_counted_bytes=0)
    ops = [
        op
        for op in tf.function(model)
        .get_concrete_function(tf.TensorSpec([batch, steps, width]))
        .graph.get_operations()
        if op.type == "SpaceToBatchND"
    ]
    assert len(ops) == 2  # the graph has one per convolution
    # The simulation allocates one, and one causal Pad.
    assert len(_forward_allocations(step, "SpaceToBatchND")) == 1
    assert len(_forward_allocations(step, "/Pad")) == 1
    # Every buffer allocated is freed or is a step output: the merged
    # Pad is released by its duplicate's reader (it was kept to the
    # end, a leak, when only the first Pad's readers released it).
    live = {}
    for k, n in step.events:
        if n is None:
            live.pop(k, None)
        else:
            live[k] = n
    assert not [k for k in live if "Pad" in str(k)]
    # The kept activations count the shared input once: without the
    # merge, the second convolution's copy is kept too.
    monkeypatch.setattr(_step_graph, "duplicates", lambda ops, fwd: {})
    both = _step_graph.trace_step(model, batch, min_counted_bytes=0)
    s2b = batch * 4 * ((steps + 4) // 4) * width * F32  # 4 blocks
    assert both.saved - step.saved == s2b
    assert both.peak > step.peak


def test_the_backward_pass_recomputations_are_not_merged(monkeypatch):
    # `swish`'s gradient recomputes `beta * features` and its sigmoid so
    # that the forward pass can free them; merged with the forward ops,
    # they would be kept until the backward pass (docstring of `_dedup`).
    inp = keras.Input((64,))
    out = keras.layers.Dense(64, activation="swish")(inp)
    model = keras.Model(inp, keras.layers.Dense(1)(out))
    seen = []

    def spy(ops, forward):
        seen.append((ops, forward))
        return duplicates(ops, forward)

    monkeypatch.setattr(_step_graph, "duplicates", spy)
    _step_graph.trace_step(model, 8)
    ops, forward = seen[-1]
    merged = duplicates(ops, forward)
    everywhere = duplicates(ops, {op.name for op in ops})
    # With every op allowed, the gradient's second `beta * features`
    # merges with the forward product; with the forward pass alone, no
    # backward op is merged.
    fwd_product = [
        op.outputs[0].name
        for op in ops
        if op.name in forward
        and op.type == "Mul"
        and any(t.op.type == "BiasAdd" for t in op.inputs)
        and not any(t.op.type == "Sigmoid" for t in op.inputs)
    ]
    assert len(fwd_product) == 1
    backward_products = [
        t
        for t, kept in everywhere.items()
        if kept == fwd_product[0] and t.rsplit(":", 1)[0] not in forward
    ]
    assert backward_products
    assert not any(t.rsplit(":", 1)[0] not in forward for t in merged)


def test_a_merged_away_op_does_not_run(monkeypatch):
    # Both convolutions read `h` through their own causal Pad; the second
    # Pad is merged away (Grappler deletes it): one Pad's buffer is made,
    # and the second convolution waits for the one kept. Were the
    # merged-away Pad still run, its buffer would be made too.
    inp = keras.Input((256, 16))
    h = keras.layers.Dense(16)(inp)
    conv = dict(kernel_size=2, dilation_rate=4, padding="causal")
    f = keras.layers.Conv1D(16, **conv)(h)
    g = keras.layers.Conv1D(16, **conv)(h)
    model = keras.Model(inp, keras.layers.Multiply()([f, g]))

    def pads_and_order(step):
        made = [str(k) for k, n in step.events if n]
        pads = [k for k in made if k.endswith("/Pad:0")]
        dense = next(i for i, k in enumerate(made) if "MatMul" in k)
        convs = [
            i
            for i, k in enumerate(made)
            if "BatchToSpaceND" in k and not k.startswith("gradient_tape")
        ]
        return len(pads), dense, convs

    pads, dense, convs = pads_and_order(_step_graph.trace_step(model, 8))
    assert pads == 1
    # Both convolutions run after `h`, the merged-away Pad's reader too.
    assert len(convs) == 2 and dense < min(convs)
    monkeypatch.setattr(_step_graph, "merged_ops", lambda same: set())
    pads, dense, convs = pads_and_order(_step_graph.trace_step(model, 8))
    assert pads == 2
