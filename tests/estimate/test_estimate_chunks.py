"""estimate_memory: the allocator's whole chunks (a model of TensorFlow's BFC
allocator), gradients consumed by their update as soon as they are made,
and Grappler's rewrite of large gradient sums. Every expected number below
is counted by hand."""

import dataclasses

import keras
import pytest

from tfmemopt import estimate_memory
from tfmemopt.estimate import CPU_STATS_MIN_BYTES
from tfmemopt.estimate import _step_graph
from tfmemopt.estimate._allocator import BFCModel
from tfmemopt.estimate._allocator import chunk_overhead
from tfmemopt.estimate._allocator import rounded
from tfmemopt.estimate._kernels import CPU_DEVICE_BYTES
from tfmemopt.estimate._kernels import rewritten_sum_zeros

MIB = 2**20
F32 = 4


def test_bfc_model_hands_out_whole_chunks_under_twice_the_request():
    bfc = BFCModel()
    # 10 MiB: regions grow 2 -> 4 -> 8 -> 16 MiB; 16 < 2 x 10: not split.
    assert bfc.allocate("a", 10 * MIB) == 16 * MIB
    # No free chunk: a new region of 16 MiB (the last one grew to fit, so
    # it is not doubled), again whole; the next region is 32 MiB.
    assert bfc.allocate("b", 10 * MIB) == 16 * MIB
    # 32 >= 2 x 10: split, 22 MiB stay free.
    assert bfc.allocate("c", 10 * MIB) == 10 * MIB
    assert bfc.in_use == 42 * MIB
    bfc.free("a")
    # Best fit among the free 16 and 22 MiB chunks: 16, split for 3 MiB.
    assert bfc.allocate("d", 3 * MIB) == 3 * MIB
    # The 13 MiB left of it is the best fit for 12 MiB: under twice, whole.
    assert bfc.allocate("e", 12 * MIB) == 13 * MIB
    assert bfc.in_use == 16 * MIB + 10 * MIB + 3 * MIB + 13 * MIB
    assert bfc.peak == 42 * MIB
    # Freed neighbours merge back into the 16 MiB chunk.
    bfc.free("d")
    bfc.free("e")
    assert bfc.allocate("f", 9 * MIB) == 16 * MIB
    # Requests are rounded up to 256 bytes.
    assert rounded(1) == 256 and rounded(257) == 512
    assert bfc.allocate("g", 1000) == 1024


def test_chunk_overhead_counts_the_whole_chunk_of_a_reused_buffer():
    # A 10 MiB weight (in a 16 MiB region, whole), then a step that makes
    # and frees a 10 MiB tensor: the first step's tensor opens a second 16
    # MiB region; the measured second step gets that free chunk whole.
    # Peak: 16 + 16 MiB in chunks, 10 + 10 MiB requested.
    events = [("t", 10 * MIB), ("t", None)]
    assert chunk_overhead([10 * MIB], events, 1, []) == 12 * MIB
    # The optimizer's update (two 10 MiB temporaries) after the step: in
    # the measured step the first takes the free 16 MiB chunk whole, the
    # second a split of the 32 MiB region the first step opened: 16 + 16 +
    # 10 MiB in chunks against 30 MiB requested.
    update = [[10 * MIB, 10 * MIB]]
    assert chunk_overhead([10 * MIB], [], 1, update) == 12 * MIB


def test_chunk_overhead_counts_loop_lists_as_requested():
    # A TensorList's elements are allocated one by one: no whole chunk.
    as_list = [(("list", "l"), 10 * MIB), (("list", "l"), None)]
    assert chunk_overhead([], as_list, 1, []) == 0
    one_buffer = [("t", 10 * MIB), ("t", None)]
    assert chunk_overhead([], one_buffer, 1, []) == 6 * MIB


def _two_dense():
    inp = keras.Input((1024,))
    h = keras.layers.Dense(1024)(inp)
    return keras.Model(inp, keras.layers.Dense(1024)(h))


KERNEL = 1024 * 1024 * F32
SMALL = 256 * 1024  # batch 8: every activation, input and bias is 32 KiB


@pytest.mark.parametrize("optimizer, alive", [("adam", 4), ("sgd", 2)])
def test_each_gradient_is_freed_by_its_update_before_the_next(optimizer, alive):
    # Batch 8: the two 4 MiB kernels' gradients dominate. Each weight's
    # update runs as soon as its gradient is made (Adam: two kernel-sized
    # temporaries, SGD: one), then the gradient is freed: both gradients
    # are never alive together. Adam's two linger while the first
    # kernel's gradient and its update's first temporary are made
    # (`_consumers.consumers`): 4 kernels at the peak; measured on CPU, a
    # `tfmemopt.Model` of this model at batch 8 peaks 16.0 MiB above its
    # weights and slots (5 steps). SGD's do not: the gradient and its one.
    model = _two_dense()
    est = estimate_memory(model, 8, optimizer=optimizer)
    state = est.parameters + est.optimizer_state
    assert est.total == pytest.approx(state + alive * KERNEL, abs=SMALL)
    # The fields still count both gradients; what is not alive at the
    # peak comes off the temporaries, and below them is `freed`.
    assert est.gradients == 2 * KERNEL + 2 * 1024 * F32
    assert est.to_dict()["total"] == est.total
    assert est.to_dict()["freed"] == est.freed
    # Two replicas all-reduce every gradient at once: all of them alive.
    two = estimate_memory(model, 16, optimizer=optimizer, replicas=2)
    assert two.freed == 0
    assert two.total >= state + 2 * KERNEL + 2 * KERNEL


def _three_readers():
    # `h` has three readers: its gradient is a sum of three (AddN). A
    # small head: the loss gradient's broadcast is made as the step starts
    # (the executor's order), and one as wide as `h` would hold the peak in the
    # forward pass, away from the sum.
    inp = keras.Input((1024,))
    h = keras.layers.Dense(1024)(inp)
    branches = [keras.layers.Dense(1024)(h) for _ in range(3)]
    return keras.Model(inp, keras.layers.Dense(8)(keras.layers.Add()(branches)))


def test_grappler_keeps_the_zeros_of_a_large_gradient_sum():
    model = _three_readers()
    # Batch 16384: every activation is 64 MiB and the step's simulated
    # peak is above 0.8 x 256 MiB (the CPU device's memory as Grappler
    # sees it); the sum of the three 64 MiB gradients of `h` is alive at
    # the peak, so its 64 MiB of zeros stay allocated.
    big = _step_graph.trace_step(
        model, 16384, min_counted_bytes=CPU_STATS_MIN_BYTES
    )
    assert big.peak > 0.8 * CPU_DEVICE_BYTES
    assert big.sums_at_peak == [16384 * 1024 * F32]
    assert rewritten_sum_zeros(big) == 64 * MIB
    est = estimate_memory(model, 16384, min_counted_bytes=CPU_STATS_MIN_BYTES)
    assert any("Grappler" in n and "64.0 MiB" in n for n in est.notes)
    # Batch 1024: the same sum is alive at a peak far below: no rewrite.
    small = _step_graph.trace_step(
        model, 1024, min_counted_bytes=CPU_STATS_MIN_BYTES
    )
    assert small.sums_at_peak == [1024 * 1024 * F32]
    assert rewritten_sum_zeros(small) == 0
    est = estimate_memory(model, 1024, min_counted_bytes=CPU_STATS_MIN_BYTES)
    assert not any("Grappler" in n for n in est.notes)


def test_grappler_decides_on_its_own_view_of_the_peak():
    # Grappler's static estimate (GraphMemory) counts every tensor and
    # writes none into an input's buffer: its peak is above the
    # simulation's where an op runs in place (here each Dense's BiasAdd),
    # and the rewrite is decided on it (the third held-out set's PointNet
    # kept its zeros while the simulated peak was below 0.8 x 256 MiB).
    step = _step_graph.trace_step(
        _three_readers(), 4096, min_counted_bytes=CPU_STATS_MIN_BYTES
    )
    assert step.grappler_peak > step.peak
    assert sum(step.sums_at_peak) > 0
    threshold = int(0.8 * CPU_DEVICE_BYTES)
    at = dataclasses.replace(step, peak=threshold + 1, grappler_peak=threshold)
    assert rewritten_sum_zeros(at) == 0
    above = dataclasses.replace(step, peak=0, grappler_peak=threshold + 1)
    assert rewritten_sum_zeros(above) == sum(step.sums_at_peak)
