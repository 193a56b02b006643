"""Alignment rules: which multiple each dimension wants, and which dims.

Pure functions over `Hardware` and layers; `tfmemopt.precision.check_alignment`
turns them into findings.
"""

from __future__ import annotations

import math

import keras

SIXTEEN_BIT = ("float16", "bfloat16")
# Dimensions at least this large count as "large matrices", for which
# A100/H100 prefer multiples of 64 (128 bytes of 16-bit values).
LARGE_DIM = 1024
_CONV = (
    keras.layers.Conv1D,
    keras.layers.Conv2D,
    keras.layers.Conv3D,
    keras.layers.Conv1DTranspose,
    keras.layers.Conv2DTranspose,
    keras.layers.Conv3DTranspose,
    keras.layers.SeparableConv1D,
    keras.layers.SeparableConv2D,
)


def alignment_target(hardware, compute_dtype: str):
    """(multiple, multiple for large dims, why) for this hardware and dtype.

    `(None, None, why)` when the dimensions do not matter there.
    """
    sixteen = compute_dtype in SIXTEEN_BIT
    if hardware.kind == "tpu":
        return 128, 128, "the TPU's matrix units are 128x128"
    if hardware.tensor_cores and sixteen:
        large = 64 if hardware.bfloat16_native else 8
        return 8, large, f"{compute_dtype} tensor cores on {hardware}"
    if hardware.bfloat16_native and not sixteen:
        return 4, 4, f"TF32 tensor cores on {hardware}"
    return None, None, f"no tensor cores used on {hardware} ({compute_dtype})"


def _dims(layer, multiple) -> list:
    """[(attribute, value, multiple or None for the target)] of `layer`."""
    if isinstance(layer, keras.layers.Dense):
        return [("units", layer.units, None)]
    if isinstance(layer, keras.layers.Embedding):
        return [
            ("vocabulary", layer.input_dim, None),
            ("embedding dim", layer.output_dim, None),
        ]
    if isinstance(layer, keras.layers.MultiHeadAttention):
        # The per-head dot products need only the 16-bit multiple (8);
        # the projections are heads x key_dim wide.
        small = min(multiple, 8)
        dims = [("key_dim", layer.key_dim, small)]
        dims.append(("heads x key_dim", layer.num_heads * layer.key_dim, None))
        value_dim = layer.value_dim
        if value_dim and value_dim != layer.key_dim:
            dims.append(("value_dim", value_dim, small))
        return dims
    filters = getattr(layer, "filters", None)
    if isinstance(layer, _CONV) and isinstance(filters, int):
        return [("filters", filters, None)]
    return []


def rows_per_sample(model) -> int:
    """How many matmul rows one sample makes (sequence x positions).

    A (batch, seq, features) activation feeds matmuls with batch x seq
    rows, so a batch of 12 sequences of 128 tokens is 1536 rows: aligned.
    Integer inputs are token ids (an Embedding adds the feature axis).
    Returns 1 when the input shape is unknown.
    """
    try:
        spec = keras.tree.flatten(model.inputs)[0]
    except (AttributeError, IndexError, TypeError, ValueError):
        return 1
    shape = tuple(spec.shape)
    tokens = "int" in str(spec.dtype)
    middle = shape[1:] if tokens else shape[1:-1]
    if any(d is None for d in middle):
        return 1
    return max(math.prod(middle), 1)
