"""Memory beyond the graph's tensors: what a kernel allocates inside, and
what Grappler's rewrites of the graph add."""

from __future__ import annotations

import tensorflow as tf


def _einsum_copies(equation: str):
    """`(inputs copied, output copied)` by TensorFlow's Einsum kernel.

    The kernel (einsum_op_impl.h) brings each operand to the order
    `[batch, free, contract]` (labels sorted by kind, then by first
    appearance; `[batch, contract, free]` is taken as is, with the matmul's
    adjoint flag): any other order is a transposed copy. The BatchMatMul
    writes `[batch, free of input 0, free of input 1]`; when the output's
    labels are in another order that result is a temporary, transposed
    into the output. `None` for what is not modelled (ellipses, one input).
    """
    if "..." in equation or "->" not in equation:
        return None
    lhs, out = equation.replace(" ", "").split("->")
    ins = lhs.split(",")
    if len(ins) != 2:
        return None
    ids = {}
    for c in "".join(ins) + out:
        ids.setdefault(c, len(ids))
    other = (ins[1], ins[0])

    def kind(c, i):
        if c in other[i]:
            return 0 if c in out else 2  # batch / contract
        return 1 if c in out else 3  # free / reduced

    copied = []
    for i, labels in enumerate(ins):
        kinds = [kind(c, i) for c in labels]
        key = [(k, ids[c]) for k, c in zip(kinds, labels)]
        swapped = [
            (0 if k == 0 else 3 - k if k in (1, 2) else k, ids[c])
            for k, c in zip(kinds, labels)
        ]
        copied.append(key != sorted(key) and swapped != sorted(swapped))
    batch = sorted((c for c in ins[0] if kind(c, 0) == 0), key=ids.get)
    free = [
        sorted((c for c in labels if kind(c, i) == 1), key=ids.get)
        for i, labels in enumerate(ins)
    ]
    result = "".join(batch + free[0] + free[1])
    return copied, result != out


# Grappler's memory optimizer (memory_optimizer.cc, `SchedulingPass`)
# rewrites a sum of 3 or more tensors (AddN) into an accumulation into a
# temporary variable, initialised from a tensor of zeros, when its own
# estimate of the graph's peak is above 0.8 of the device's memory, for the
# sums with an input alive at that peak. The device's memory is what its
# attributes say: 256 MiB for a CPU (`ThreadPoolDevice`), whatever the RAM.
_REWRITE_SHARE = 0.8
CPU_DEVICE_BYTES = 256 << 20


def sums_rewritten(grappler_peak: int, device_bytes: int = CPU_DEVICE_BYTES):
    """Whether Grappler rewrites the step's large gradient sums: its own
    estimate of the step's peak is above 0.8 of `device_bytes`."""
    return grappler_peak > _REWRITE_SHARE * device_bytes


def rewritten_sum_zeros(step, device_bytes: int = CPU_DEVICE_BYTES) -> int:
    """Bytes of zeros that Grappler's rewrite of the step's gradient sums
    keeps for the whole run (constant-folded, allocated once): the sums with
    an input alive at the simulated peak (`step.sums_at_peak`), when the
    peak of Grappler's own estimate of the step (`step.grappler_peak`:
    every tensor counted, none written in place) is above 0.8 of
    `device_bytes`.
    Measured on CPU: the CNN at batch 512 (peak about 330 MiB) kept 64 MiB
    of zeros of its largest 3-input sum (`AddN_5/tmp_var_zeros`), at
    batches 32 and 128 none."""
    if not sums_rewritten(step.grappler_peak, device_bytes):
        return 0
    return sum(step.sums_at_peak)


# Ops whose output Grappler's constant folding turns into a constant when
# its shape is fully known (constant_folding.cc,
# `MaterializeConstantValuedNode`: "represented compactly ... regardless of
# their shape"), and a `Fill` of constant inputs; a constant's kernel
# allocates its tensor once, when the graph's kernels are made, and holds
# it for the whole run.
_CONSTANT_VALUED = {"ZerosLike": 0.0, "OnesLike": 1.0}
# Ops whose output depends on their input's shape alone.
SHAPE_ONLY = {*_CONSTANT_VALUED, "Fill"}
# Dtypes that are handles (a variable, a loop's TensorList), not data.
HANDLES = (tf.resource, tf.variant)


def folded_constants(ops, size_of):
    """`(names, sizes)`: the outputs of `ops` that Grappler folds into
    constants (a `ZerosLike` / `OnesLike` of a fully known shape, a `Fill`
    whose inputs are constants), which the step does not allocate; and the
    bytes of each constant the run keeps, equal `Fill`s (dtype, shape and
    value) counted once, as Grappler merges them (measured: the clips'
    zeros below). A `ZerosLike` / `OnesLike` counts once per input: its
    constant keeps a control edge from the input, so constants of
    different inputs are not assumed merged (not measured).

    Allocator trace of a PSPNet-like net under `mixed_bfloat16`, batch 32:
    the gradients of its ten bilinear up-samplings' `clip_by_value` read
    `zeros_like` of their outputs; none is allocated in the step, and two
    constants (`.../clip_by_value/zeros_like`, one per shape, 23.6 and
    2.25 MiB) are allocated in the first step and never freed. Counted in
    the step, as before, the two largest were alive at the simulated peak:
    estimated +23.4% (257.7 MiB against a measured 208.8).
    """
    names, kept = set(), {}
    for op in ops:
        if not op.outputs:
            continue
        t = op.outputs[0]
        shape = t.shape
        if shape.rank is None or not shape.is_fully_defined():
            continue
        if t.dtype in HANDLES:  # a TensorList's zeros
            continue
        if op.type in _CONSTANT_VALUED:
            # Folded, it keeps a control edge from its input: equal ones
            # of different inputs are not assumed merged.
            value = (_CONSTANT_VALUED[op.type], op.inputs[0].name)
        elif op.type == "Fill" and all(u.op.type == "Const" for u in op.inputs):
            value = tf.get_static_value(op.inputs[1]).item()
        else:
            continue
        names.add(t.name)
        key = (t.dtype, tuple(shape.as_list()), value)
        kept[key] = max(kept.get(key, 0), size_of(t) or 0)
    return names, [n for n in kept.values() if n]
