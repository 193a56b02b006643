"""Which input's buffer an element-wise op writes its output into, in the
simulation of a step (`_simulate`): TensorFlow's kernels take an input
that nothing else holds (`forward_input_or_allocate_output`)."""

from __future__ import annotations

# Element-wise kernels that write their output into an input's buffer when
# nothing else holds that input (`forward_input_or_allocate_output`):
# measured on CPU, the gradient of GlobalAveragePooling1D (Tile, then
# RealDiv) held one 128 MiB buffer, not two. The softmax cross-entropy
# kernels (`xent_op.cc`, `sparse_xent_op.cc`) write their second output,
# the gradient, into the logits' buffer the same way: in the allocator
# trace of a GPT-2 step (batch 32 x 128 tokens, 4000 words) the 62.5 MiB
# logits' chunk was the only one of that size at the peak.
_IN_PLACE = {
    "Abs",
    "Add",
    "AddN",
    "AddV2",
    "BiasAdd",
    "Div",
    "DivNoNan",
    "Elu",
    "EluGrad",
    "Erf",
    "Exp",
    "LeakyRelu",
    "LeakyReluGrad",
    "Log",
    "Maximum",
    "Minimum",
    "Mul",
    "Neg",
    "RealDiv",
    "Reciprocal",
    "Relu",
    "Relu6",
    "Relu6Grad",
    "ReluGrad",
    "Rsqrt",
    "RsqrtGrad",
    "Selu",
    "SeluGrad",
    "Sigmoid",
    "SigmoidGrad",
    "SoftmaxCrossEntropyWithLogits",
    "Softplus",
    "SparseSoftmaxCrossEntropyWithLogits",
    "Sqrt",
    "Square",
    "SquaredDifference",
    "Sub",
    "Tanh",
    "TanhGrad",
}


def _reusable_input(op, i, n, last, keep, buffer_of, holders, size):
    """The buffer an element-wise op `i` writes its output into, or None:
    an input of the same size that only this op reads and nothing else
    holds (not a graph input, a variable or a kept output), the first such
    in input order (`forward_input_or_allocate_output` tries each
    candidate: the gradient of a softmax cross-entropy, `Mul` of the
    broadcast loss gradient and the kernel's 62.5 MiB gradient, took the
    latter's buffer; the first, smaller input was taken and the output
    counted anew). An input with several readers is not taken: the
    executor runs ready ops on several threads, so another reader may
    still hold it when this op runs."""
    if op.type not in _IN_PLACE or not n:
        return None
    for u in op.inputs:
        if last.get(u.name) != i or u.name in keep:
            continue
        if len(u.consumers()) != 1:
            continue
        if u.op.type in ("Placeholder", "ReadVariableOp", "Const"):
            continue
        src = buffer_of.get(u.name)
        if src is not None and holders.get(src) == {u.name}:
            if size.get(src) == n:
                return src
    return None
