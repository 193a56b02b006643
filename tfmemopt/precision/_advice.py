"""Advice on a model: precision traps and tensor-core-unfriendly dimensions.

`check_precision` and `check_alignment` read a built model (no training, no
data) and return `Findings`: a list of `Finding` objects that print as one
line each, and as a table with `table()`.
"""

from __future__ import annotations

import keras

from tfmemopt.precision import _mixed_precision as _mp
from tfmemopt.precision._alignment import _CONV
from tfmemopt.precision._alignment import LARGE_DIM
from tfmemopt.precision._alignment import SIXTEEN_BIT
from tfmemopt.precision._alignment import _dims
from tfmemopt.precision._alignment import alignment_target
from tfmemopt.precision._alignment import rows_per_sample
from tfmemopt.precision._findings import Finding
from tfmemopt.precision._findings import Findings
from tfmemopt.precision._findings import pad_to_multiple
from tfmemopt.precision._findings import walk_layers
from tfmemopt.precision._weights_16bit import low_precision_update_findings

_SOFTMAX_NAMES = ("softmax", "log_softmax")

__all__ = [
    "Finding",
    "Findings",
    "check_alignment",
    "check_precision",
    "pad_to_multiple",
]


def _output_layers(model) -> dict:
    """{id(layer): (layer, output dtype)} for layers producing outputs."""
    found = {}
    try:
        outputs = keras.tree.flatten(model.outputs)
    except (AttributeError, ValueError, TypeError):
        outputs = []
    for out in outputs:
        history = getattr(out, "_keras_history", None)
        layer = getattr(history, "operation", None)
        if layer is not None:
            found[id(layer)] = (layer, str(out.dtype))
    if not found:
        # Subclassed model: the last layer is the best guess we have.
        layers = list(getattr(model, "layers", []))
        if layers:
            found[id(layers[-1])] = (layers[-1], layers[-1].compute_dtype)
    return found


def _softmax_of(layer) -> str | None:
    if isinstance(layer, keras.layers.Softmax):
        return "softmax"
    name = getattr(getattr(layer, "activation", None), "__name__", None)
    return name if name in _SOFTMAX_NAMES else None


_HEAVY = (
    keras.layers.Dense,
    keras.layers.EinsumDense,
    keras.layers.Embedding,
    keras.layers.MultiHeadAttention,
    *_CONV,
    keras.layers.DepthwiseConv1D,
    keras.layers.DepthwiseConv2D,
    keras.layers.LSTM,
    keras.layers.GRU,
)


def check_precision(model, optimizer=None) -> Findings:
    """Finds mixed-precision traps in a built model.

    Reports: outputs computed in 16 bits (losses then see rounded values);
    softmax/log-softmax computed in 16 bits (probabilities underflow);
    `float16` compute without loss scaling (small gradients flush to zero);
    compute-heavy layers pinned to float32 inside a mixed model (slower and
    twice the activation memory, for nothing); bfloat16 (or float16)
    weights whose optimizer makes no step or rounds it away (Keras's Adam
    family on the `"bfloat16"` policy: `"bf16-step-lost"`; a tfmemopt
    optimizer with `bf16_update="plain"`: `"bf16-update-lossy"`). The
    output layers, softmax and normalisation layers may stay float32. Costs
    one pass over the layers, and for 16-bit weights one step of a fresh
    copy of the optimizer on two numbers.

    Args:
        model: A built `keras.Model`.
        optimizer: Defaults to `None` (use `model.optimizer` if compiled).
            The optimizer of a custom training loop, to check loss scaling.

    Returns:
        `Findings` (empty when nothing is wrong).

    Example:

    >>> keras.config.set_dtype_policy("mixed_bfloat16")
    >>> inputs = keras.Input((8,))
    >>> outputs = keras.layers.Dense(4, activation="softmax")(inputs)
    >>> keras.config.set_dtype_policy("float32")
    >>> check_precision(keras.Model(inputs, outputs)).codes
    ['output-16bit', 'softmax-16bit']
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            "`model` must be a built keras.Model. Received: "
            f"model={model!r} (of type {type(model).__name__})."
        )
    if optimizer is not None and not isinstance(
        optimizer, keras.optimizers.Optimizer
    ):
        # A name was taken and checked as no optimizer at all.
        raise TypeError(
            "`optimizer` must be a keras.optimizers.Optimizer instance (the "
            "one your training loop applies), or None for the model's "
            f"compiled one. Received: optimizer={optimizer!r} (of type "
            f"{type(optimizer).__name__}). Pass e.g. "
            "keras.optimizers.get('adam')."
        )
    findings = Findings()
    layers = walk_layers(model)
    outputs = _output_layers(model)
    findings.extend(_output_and_softmax_findings(layers, outputs))
    if optimizer is None:
        optimizer = getattr(model, "optimizer", None)
    findings.extend(_loss_scaling_findings(layers, optimizer))
    findings.extend(low_precision_update_findings(model, optimizer))
    findings.extend(_needless_float32_findings(layers, outputs))
    return findings


def _output_and_softmax_findings(layers, outputs) -> list:
    """Outputs, softmax and log-softmax computed in 16 bits."""
    findings = []
    for layer, dtype in outputs.values():
        if dtype in SIXTEEN_BIT:
            findings.append(
                Finding(
                    "output-16bit",
                    "warning",
                    layer.name,
                    f"the model output is computed in {dtype}: create this "
                    "layer with dtype='float32', or end the model with "
                    "keras.layers.Activation('linear', dtype='float32').",
                )
            )
    for layer in layers:
        kind = _softmax_of(layer)
        if kind and layer.compute_dtype in SIXTEEN_BIT:
            findings.append(
                Finding(
                    "softmax-16bit",
                    "warning",
                    layer.name,
                    f"{kind} is computed in {layer.compute_dtype}: small "
                    "probabilities underflow; create the layer with "
                    "dtype='float32' (or split off a float32 "
                    f"keras.layers.Activation('{kind}', dtype='float32')).",
                )
            )
    return findings


def _loss_scaling_findings(layers, optimizer) -> list:
    """float16 compute without a loss-scaling optimizer."""
    compute = {layer.compute_dtype for layer in layers}
    if (
        "float16" in compute
        and optimizer is not None
        and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    ):
        return [
            Finding(
                "no-loss-scaling",
                "warning",
                "<model>",
                "float16 compute without loss scaling: small gradients "
                "flush to zero. compile() with auto_scale_loss=True (the "
                "default), or wrap a custom loop's optimizer in "
                "keras.optimizers.LossScaleOptimizer and use its "
                "scale_loss().",
            )
        ]
    return []


def _needless_float32_findings(layers, outputs) -> list:
    """Compute-heavy layers pinned to float32 in a mixed model."""
    compute = {layer.compute_dtype for layer in layers}
    if not compute & set(SIXTEEN_BIT):
        return []
    findings = []
    for layer in layers:
        pinned = layer.dtype_policy.name == "float32"
        if (
            pinned
            and isinstance(layer, _HEAVY)
            and id(layer) not in outputs
            and _softmax_of(layer) is None
        ):
            findings.append(
                Finding(
                    "needless-float32",
                    "info",
                    layer.name,
                    "pinned to float32 in a mixed-precision model: it "
                    "runs without tensor cores and keeps float32 "
                    "activations. Drop dtype='float32' unless it must "
                    "be exact.",
                )
            )
    return findings


def _compute_dtype(model, policy) -> str:
    if policy is None:
        dtypes = [layer.compute_dtype for layer in walk_layers(model)]
        sixteen = [d for d in dtypes if d in SIXTEEN_BIT]
        if sixteen:
            return max(set(sixteen), key=sixteen.count)
        if dtypes:
            return max(set(dtypes), key=dtypes.count)
        return keras.config.dtype_policy().compute_dtype
    try:
        return keras.DTypePolicy(policy).compute_dtype
    except (ValueError, TypeError) as e:
        raise ValueError(
            "`policy` must be None (read it from the model) or a Keras dtype "
            "policy such as 'float32', 'mixed_float16', 'mixed_bfloat16'. "
            f"Received: policy={policy!r}."
        ) from e


def check_alignment(
    model,
    batch_size: int | None = None,
    policy=None,
    hardware="auto",
    min_dim: int = 16,
) -> Findings:
    """Finds dimensions that keep matmuls off the tensor cores.

    16-bit tensor cores want multiples of 8 (A100/H100 prefer 64 for
    dimensions >= 1024), TF32 multiples of 4, TPUs multiples of 128 and a
    per-core batch that is a multiple of 8. Checks Dense units, Conv
    filters, Embedding vocabulary and width, attention key_dim and
    heads x key_dim, and the batch size. Each finding gives the value, the
    padded value (`pad_to_multiple`) and what the padding costs in %. Costs
    one pass over the layers; runs nothing.

    Args:
        model: A built `keras.Model`.
        batch_size: Int, defaults to `None` (not checked). Global batch.
        policy: Defaults to `None` (the model's 16-bit compute dtype if any
            layer has one, else its most common compute dtype). A dtype
            policy name, to ask "what if".
        hardware: Defaults to `"auto"` (detect). A
            `tfmemopt.mixed_precision.Hardware` or a preset name such as
            `"v100"`, `"a100"`, `"h100"`, `"tpu"`, `"cpu"`.
        min_dim: Int, defaults to `16`. Smaller dimensions are ignored,
            and so is any dimension smaller than its multiple (the hardware
            pads those itself; padding them by hand gains nothing).

    Returns:
        `Findings`; empty on hardware where dimensions do not matter (CPU,
        GPUs without tensor cores).

    Example:

    >>> inputs = keras.Input((16,), dtype="int32")
    >>> x = keras.layers.Embedding(50257, 768)(inputs)
    >>> model = keras.Model(inputs, x)
    >>> f = check_alignment(model, policy="mixed_bfloat16", hardware="a100")
    >>> f[0].suggested, round(f[0].cost_pct, 2)
    (50304, 0.09)
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            "`model` must be a built keras.Model. Received: "
            f"model={model!r} (of type {type(model).__name__})."
        )
    if batch_size is not None and (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or batch_size < 1
    ):
        raise ValueError(
            "`batch_size` must be None or an int >= 1 (the global batch). "
            f"Received: batch_size={batch_size!r}."
        )
    hw = _mp._resolve_hardware(hardware)
    dtype = _compute_dtype(model, policy)
    multiple, large, why = alignment_target(hw, dtype)
    findings = Findings()
    if multiple is None:
        return findings

    def check(layer_name, kind, attribute, value, target=None):
        if value is None or value < min_dim:
            return
        want = target or (large if value >= LARGE_DIM else multiple)
        # Below one tile the hardware pads anyway: nothing to gain.
        if value < want or value % want == 0:
            return
        suggested = pad_to_multiple(int(value), want)
        cost = 100.0 * (suggested - value) / value
        severity = "warning" if value % min(want, multiple) else "info"
        findings.append(
            Finding(
                "alignment",
                severity,
                layer_name,
                f"{kind} {attribute}={value} is not a multiple of {want} "
                f"({why}); use {suggested} (+{cost:.2f}% padding).",
                attribute,
                int(value),
                suggested,
                cost,
            )
        )

    for layer in walk_layers(model):
        for attribute, value, target in _dims(layer, multiple):
            check(layer.name, type(layer).__name__, attribute, value, target)
    if batch_size is not None:
        finding = _batch_finding(model, batch_size, hw, why)
        if finding is not None:
            findings.append(finding)
    return findings


def _batch_finding(model, batch_size, hw, why):
    """TPU: per-core batch multiple of 8. GPU: matmul rows per device."""
    rows = 1 if hw.kind == "tpu" else rows_per_sample(model)
    step = 8 * hw.count
    if (batch_size * rows) % step == 0:
        return None
    suggested = batch_size + 1
    while (suggested * rows) % step:
        suggested += 1
    cost = 100.0 * (suggested - batch_size) / batch_size
    what = "batch" if rows == 1 else f"batch x {rows} rows per sample"
    return Finding(
        "alignment",
        "warning",
        "<batch>",
        f"batch_size={batch_size} over {hw.count} device(s): the {what} is "
        f"not a multiple of 8 per device ({why}); use {suggested} "
        f"(+{cost:.2f}%), or accumulate gradients.",
        "batch_size",
        int(batch_size),
        suggested,
        cost,
    )
