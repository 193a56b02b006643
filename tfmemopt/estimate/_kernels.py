"""Memory that a kernel allocates beyond its graph tensors."""

from __future__ import annotations


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
