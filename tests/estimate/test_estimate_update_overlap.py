"""An optimizer's update overlaps the next one (issue #23): Adam updates a
weight in a chain of a dozen element-wise ops, so its two temporaries are
still allocated when the backward pass has made the next weight's gradient
and that update its first temporary, unless the ops that run meanwhile
take longer than the update's own (its bytes read and written).
Allocator traces on CPU: a chain of Dense(1024) kernels at batch 1, each
kernel's `adam/Sqrt` alive beside the next kernel's gradient and
`adam/Square`; the held-out FlowNetS-like net at batch 8, the step's
peak, where a deconvolution kernel's `adam/Mul` and `adam/Sqrt` (8 MiB
each) were alive beside the next kernel's gradient and `adam/Square` (9
MiB each)."""

import keras
import pytest
import tensorflow as tf

from tfmemopt.estimate import _consumers
from tfmemopt.estimate import _step_graph
from tfmemopt.estimate._simulate import _simulate

from ._graphs import graph_ops
from ._graphs import size

MIB = 1 << 20


def _gradients(*sizes):
    # One gradient per size (MiB), made one after another from `x`: each
    # is consumed by its weight's update.
    def build():
        x = tf.compat.v1.placeholder(tf.float32, (1024,), name="x")
        for i, n in enumerate(sizes):
            tf.tile(x, [256 * n], name=f"g{i}")

    ops = graph_ops(build)
    return ops, [op.outputs[0] for op in ops if op.type == "Tile"]


NEVER = 1 << 60  # an update that lasts longer than the step


def _peak(sizes, temps, lingering, events=None, runs=NEVER, spans=None):
    ops, grads = _gradients(*sizes)
    consumed = {g.name: [n * MIB for n in t] for g, t in zip(grads, temps)}
    return _simulate(
        ops,
        [],
        size,
        {},
        in_place=False,
        consumed=consumed,
        lingering={g.name: runs if lingering else 0 for g in grads},
        events=events,
        spans=spans,
    )


def test_an_update_s_temporaries_linger_until_the_next_update_makes_one():
    # Two 4 MiB gradients, each updated with two 4 MiB temporaries: at
    # once, one gradient and its update's (12 MiB); lingering, the first
    # update's two beside the second gradient and its first (16 MiB).
    sizes, temps = [4, 4], [[4, 4], [4, 4]]
    assert _peak(sizes, temps, lingering=False) == 12 * MIB + 4096
    assert _peak(sizes, temps, lingering=True) == 16 * MIB + 4096


def test_a_much_smaller_update_runs_in_the_gaps_of_the_lingering_one():
    # A kernel, its bias, the next kernel (8, 1 and 8 MiB). The bias's
    # update is 1/8 of the kernel's: it runs in its gaps, and the next
    # kernel still meets the first kernel's update: 8+8 + 8+8.
    assert _peak([8, 1, 8], [[8, 8], [1, 1], [8, 8]], True) == 32 * MIB + 4096
    # A bias of 1/4 ends it, and lingers in its turn (2+2): the next
    # kernel meets that, 2+2 + 8+8, or its own update, 8 + 8+8.
    assert _peak([8, 2, 8], [[8, 8], [2, 2], [8, 8]], True) == 24 * MIB + 4096


def test_a_lingering_update_is_freed_in_the_events():
    events = []
    _peak([4, 4], [[4, 4], [4, 4]], lingering=True, events=events)
    updates = [
        k for k, n in events if isinstance(k, tuple) and k[0] == "update"
    ]
    made = [k for k, n in events if n and k in updates]
    freed = [k for k, n in events if n is None and k in updates]
    assert len(made) == 4
    # The first update's two are freed after the second's first is made,
    # before its second.
    assert freed[:2] == made[:2]
    first, second = (events.index((made[j], 4 * MIB)) for j in (2, 3))
    assert first < events.index((made[0], None)) < second
    # The last one ends with the step: every update's temporaries freed.
    assert sorted(freed) == sorted(made)


def _timed(ops, at_second):
    # The first gradient's op runs 0 to 1, the second's 30 units from
    # `at_second`; the others take no time.
    spans, at = {}, 0
    first, second = [op for op in ops if op.type == "Tile"]
    for op in ops:
        if op is first:
            spans[op.name], at = (0, 1), 1
        elif op is second:
            spans[op.name] = (at_second, at_second + 30)
        else:
            spans[op.name] = (at, at)
    return spans


@pytest.mark.parametrize("at_second, peak", [(5, 17), (100, 24)])
def test_the_gradient_is_free_before_the_update_s_second_temporary(
    at_second, peak
):
    # An 8 MiB gradient whose update (two 8 MiB temporaries) reads it last
    # in its first; then a 1 MiB op. When that op starts while the update
    # runs (the backward pass goes on), the update's chains run one after
    # the other: the gradient and the first temporary (16 MiB), then the
    # two temporaries without the gradient (16 MiB), beside the next op's
    # output (17). With nothing beside it (the op starts after the update
    # has run), Adam's `g - m` and `square(g)` run at once on the threads:
    # the gradient and both (24 MiB). Allocator traces: the VAE of
    # held-out set 3 at batch 16 (beside: its [16384, 256] kernel's
    # gradient and `adam/Square_4` alone); one Dense(2048) kernel after
    # the backward pass (alone: the gradient, `adam/Square` and
    # `adam/Sub_2`).
    ops, grads = _gradients(8, 1)
    consumed = {grads[0].name: [8 * MIB, 8 * MIB], grads[1].name: []}
    got = _simulate(
        ops,
        [],
        size,
        {},
        in_place=False,
        consumed=consumed,
        lingering={grads[0].name: 20, grads[1].name: 0},
        reads_gradient={grads[0].name: 1},
        spans=_timed(ops, at_second),
    )
    assert got == peak * MIB + 4096


def test_an_update_ends_when_its_ops_have_run():
    # Three 4 MiB gradients, one op each, 10 units apart (`spans`: each
    # runs 10 units, then nothing for 10). An update that runs 5 units is
    # over before the next gradient is made; one of 25 units meets it.
    ops, _ = _gradients(4, 4, 4)
    spans, at = {}, 0
    for op in ops:  # x and each tile's multiples: no time of their own
        if op.type == "Tile":
            spans[op.name] = (at, at + 10)
            at += 20
        else:
            spans[op.name] = (at, at)
    sizes, temps = [4, 4, 4], [[4, 4], [4, 4], [4, 4]]
    assert _peak(sizes, temps, True, runs=5, spans=spans) == 12 * MIB + 4096
    assert _peak(sizes, temps, True, runs=25, spans=spans) == 16 * MIB + 4096
    # 15 units: over while the next gradient's op runs (10 to 25, that op
    # 20 to 30), so before that gradient's update starts; the gradient is
    # made beside it (8 + 4), its update after it (4 + 8).
    assert _peak(sizes, temps, True, runs=15, spans=spans) == 12 * MIB + 4096


@pytest.mark.parametrize(
    "optimizer, traffic",
    [
        # g - m 3, its product 2, assign_add 3; square(g) 2, - v 3, its
        # product 2, assign_add 3; m * alpha 2, sqrt 2, + eps 2, / 3,
        # assign_sub 3.
        (keras.optimizers.Adam, 30),
        (lambda: keras.optimizers.Adam(amsgrad=True), 35),
        (lambda: keras.optimizers.SGD(momentum=0.9), 12),
        # The decay runs at the step's start, the moving average after
        # every update: neither is in a weight's chain.
        (lambda: keras.optimizers.AdamW(use_ema=True), 30),
        # A learning rate that cannot be deserialized is left out too.
        (lambda: keras.optimizers.Adam(learning_rate=lambda: 1e-3), 30),
    ],
)
def test_an_update_s_traffic_is_traced(optimizer, traffic):
    assert _consumers.update_traffic(optimizer()) == traffic


def test_the_traffic_is_traced_once_per_configuration():
    _consumers.update_traffic(keras.optimizers.Adam(beta_1=0.8))
    known = len(_consumers._TRAFFIC)
    _consumers.update_traffic(keras.optimizers.Adam(beta_1=0.8))  # adam_1
    assert len(_consumers._TRAFFIC) == known


def test_what_reads_every_gradient_first_consumes_none_as_made():
    # A global norm reads every gradient before any update; Keras's own
    # accumulation updates in a `cond` every few steps.
    clipped = keras.optimizers.Adam(global_clipnorm=1.0)
    assert _consumers.consumers(clipped, False, 1, len) is None
    every = keras.optimizers.Adam(gradient_accumulation_steps=2)
    (use,) = _consumers.consumers(every, False, 1, lambda v: 100)([None])
    assert use.runs == 0


@pytest.mark.parametrize(
    "optimizer, copies, lingers",
    [
        (keras.optimizers.Adam, 2, True),
        (keras.optimizers.AdamW, 2, True),
        (lambda: keras.optimizers.SGD(momentum=0.9), 2, True),
        (keras.optimizers.SGD, 1, False),
    ],
)
def test_which_updates_linger(optimizer, copies, lingers):
    opt = optimizer()
    (use,) = _consumers.consumers(opt, False, 1, lambda v: 100)([None])
    assert (use.runs > 0) == lingers
    runs = 100 * _consumers.update_traffic(opt) if lingers else 0
    # Two temporaries: the gradient's last read comes before the second.
    reads = 1 if copies > 1 else None
    # Adam reads the gradient twice: a sparse one's rows are copied.
    rows = _consumers.gradient_reads(opt) > 1 and lingers
    assert use == _consumers.Consumer([100] * copies, runs, reads, rows)


def test_an_accumulator_or_a_shard_does_not_linger():
    adam = keras.optimizers.Adam()
    (added,) = _consumers.consumers(adam, True, 1, len)([[1]])
    assert added == _consumers.Consumer([], 0)  # acc + g, in place
    (sliced,) = _consumers.consumers(adam, False, 2, len, sharded=True)([[1]])
    assert sliced == _consumers.Consumer([1], 0)
    assert _consumers.consumers(adam, False, 2, len) is None


def _dense_chain(depth):
    inp = keras.Input((1024,))
    x = inp
    for i in range(depth):
        x = keras.layers.Dense(1024, name=f"d{i}")(x)
    model = keras.Model(inp, x)
    model.compile(optimizer="adam", loss="mse")
    return model


def _bytes(v):
    n = 4
    for d in v.shape:
        n *= d
    return n


@pytest.mark.parametrize("floor", [0, 256 * 1024])
def test_a_chain_of_kernels_peaks_at_two_updates(floor):
    # Allocator trace and measured peak, 4 x Dense(1024), batch 1, Adam:
    # 16 MiB above the weights and slots, 4 tensors of a kernel's size.
    # (The biases' updates, 4 KiB, run in the kernels' gaps in both
    # views: counted or not.)
    model = _dense_chain(4)

    def counted(v):
        n = _bytes(v)
        return n if n >= floor else 0

    adam = _consumers.consumers(model.optimizer, False, 1, counted)

    def at_once(variables):
        return [u._replace(runs=0) for u in adam(variables)]

    def peak(update):
        step = _step_graph.trace_step(
            model, 1, update=update, min_counted_bytes=floor
        )
        return step.updating_peak

    assert abs(peak(at_once) - 12 * MIB) < MIB // 8
    assert abs(peak(adam) - 16 * MIB) < MIB // 8


def _flatten_to_dense(optimizer):
    # Two convolutions, then a [16384, 256] kernel (16 MiB): its gradient
    # is made while the convolutions' backward pass goes on.
    inp = keras.Input((32, 32, 16))
    x = inp
    for _ in range(2):
        x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.Dense(256)(keras.layers.Flatten()(x))
    model = keras.Model(inp, keras.layers.Dense(8)(x))
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _one_kernel(optimizer):
    # One [2048, 2048] kernel (16 MiB) whose gradient is the last op of the
    # backward pass: its update runs alone.
    inp = keras.Input((2048,))
    model = keras.Model(
        inp, keras.layers.Dense(8)(keras.layers.Dense(2048)(inp))
    )
    model.compile(optimizer=optimizer, loss="mse")
    return model


@pytest.mark.parametrize(
    "build, saved",
    [
        # Measured, Adam, batch 16, 3 steps in each of 2 processes: 83,
        # 83, 96 and 84, 84, 84 MiB; estimated 100 MiB reading the
        # gradient to the update's end, 84 now.
        (_flatten_to_dense, 16 * MIB),
        # Measured, batch 4: 96, 96, 96 and 96, 80, 80; estimated 96.
        (_one_kernel, 0),
    ],
)
def test_a_kernel_s_update_beside_the_backward_pass_holds_two_tensors(
    build, saved
):
    model = build("adam")
    adam = _consumers.consumers(model.optimizer, False, 1, _bytes)

    def reading_to_the_end(variables):
        return [u._replace(reads_gradient=None) for u in adam(variables)]

    def peak(update):
        return _step_graph.trace_step(model, 16, update=update).updating_peak

    assert peak(reading_to_the_end) - peak(adam) == saved
