"""16-bit weights meeting an optimizer whose step rounds away.

With the `"bfloat16"` policy every weight is bfloat16 (8 bits of mantissa):
Keras's Adam, AdamW, Adamax, Nadam and Lamb cast `beta_2` to it
(bfloat16(0.999) == 1.0), so `1 - beta_2**t` is 0 and every step is 0; any
optimizer that writes its step back rounded to nearest drops the steps under
half an ulp (0.2% of the weight). This module finds both, by asking the
optimizer (tfmemopt's say how they write: `bf16_update`) or by one probe
step of a fresh copy on two 16-bit values.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tfmemopt.precision._findings import Finding

_LOW = ("bfloat16", "float16")

_FIX = (
    "Use a tfmemopt optimizer, which makes the step in float32 and writes "
    "it unbiased (tfmemopt.optimizers.AdamW8bit(..., bf16_update="
    "'stochastic' or 'kahan'): about 4.03 or 6.03 bytes per parameter of "
    "weights and state where most weights are large enough for 8-bit "
    "moments), or keep float32 weights with the 'mixed_bfloat16' policy."
)


def _innermost(optimizer):
    """The optimizer behind wrappers (loss scaling, accumulation,
    sharding), which all keep it as `inner_optimizer`."""
    seen = 0
    while hasattr(optimizer, "inner_optimizer") and seen < 8:
        optimizer = optimizer.inner_optimizer
        seen += 1
    return optimizer


def _low_dtypes(model) -> list:
    dtypes = []
    for w in getattr(model, "trainable_weights", []):
        dtype = keras.backend.standardize_dtype(w.dtype)
        if dtype in _LOW and dtype not in dtypes:
            dtypes.append(dtype)
    return dtypes


def _probe(optimizer, dtype) -> str | None:
    """What one step of a fresh copy of `optimizer` does to `dtype` weights
    [0, 1] with gradient 1: "zero" (not even 0 moves: the step itself is
    0), "lost" (0 moves, 1 does not: rounded away), None (both move), or
    "unknown" when it cannot be probed."""
    try:
        fresh = type(optimizer).from_config(optimizer.get_config())
        with tf.device("CPU:0"):
            w = keras.Variable(np.array([0.0, 1.0], np.float32), dtype=dtype)
            fresh.apply_gradients([(keras.ops.ones((2,), dtype), w)])
            after = np.asarray(keras.ops.cast(w, "float32"))
    except Exception:  # noqa: BLE001 - advice never fails the caller
        return "unknown"
    if after[0] == 0.0:
        return "zero"
    if after[1] == 1.0:
        return "lost"
    return None


def low_precision_update_findings(model, optimizer) -> list:
    """`Finding`s for 16-bit trainable weights whose optimizer's step is
    zero or rounds away (empty when there is none or no optimizer)."""
    dtypes = _low_dtypes(model)
    if not dtypes or optimizer is None:
        return []
    inner = _innermost(optimizer)
    name = type(inner).__name__
    mode = getattr(inner, "bf16_update", "absent")
    if mode != "absent":  # a tfmemopt optimizer: float32 step
        if mode != "plain":
            return []
        return [
            Finding(
                "bf16-update-lossy",
                "warning",
                "<optimizer>",
                f"{name}(bf16_update='plain') rounds each step to the "
                f"nearest {'/'.join(dtypes)}: steps under half an ulp (0.2% "
                "of a bfloat16 weight) are lost. Use bf16_update=None "
                "(stochastic rounding) or 'kahan'.",
            )
        ]
    findings = []
    for dtype in dtypes:
        result = _probe(inner, dtype)
        if result == "zero":
            message = (
                f"{name} makes no step at all on {dtype} weights: it "
                f"computes its step in {dtype} (Keras's Adam-family cast "
                f"beta_2 to the weight dtype, and {dtype}(0.999) == 1.0), "
                "so the weights never move. "
            )
        elif result == "lost":
            message = (
                f"{name} rounds its step to the nearest {dtype}: at this "
                "learning rate a weight of 1.0 does not move (steps under "
                "half an ulp are lost). "
            )
        else:
            continue
        findings.append(
            Finding("bf16-step-lost", "warning", "<optimizer>", message + _FIX)
        )
    return findings
