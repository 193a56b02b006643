"""Bytes of optimizer state, from the real Keras optimizer's configuration.

Known Keras optimizers are counted by rule (the slots their `build` creates,
read from their configuration: `amsgrad`, `momentum`, `centered`, `use_ema`,
`gradient_accumulation_steps`). Any other optimizer is probed: a fresh copy
is built on small stand-in variables of each distinct shape and its
variables are counted, so custom optimizers are measured, not guessed.
"""

from __future__ import annotations

import math

import keras

from tfmemopt._protocols import CountsStateBytes
from tfmemopt.estimate._optimizer_names import optimizer_from_name

# Slots (full copies of each variable) per optimizer class, as a function
# of its config.
_SLOTS = {
    "SGD": lambda c: 1 if c.get("momentum", 0.0) else 0,
    "Adam": lambda c: 3 if c.get("amsgrad") else 2,
    "AdamW": lambda c: 3 if c.get("amsgrad") else 2,
    "Adamax": lambda c: 2,
    "Nadam": lambda c: 2,
    "Lamb": lambda c: 2,
    "Lion": lambda c: 1,
    "Adagrad": lambda c: 1,
    "Adadelta": lambda c: 2,
    "Ftrl": lambda c: 2,
    "RMSprop": lambda c: (
        1
        + (1 if c.get("momentum", 0.0) else 0)
        + (1 if c.get("centered") else 0)
    ),
    "ScheduleFreeAdamW": lambda c: 2,
}

# Largest stand-in variable used to probe an unknown optimizer (elements).
_PROBE_LIMIT = 1 << 22


def resolve_optimizer(optimizer, model):
    """Returns (a Keras optimizer instance, a note on where it came from)."""
    if optimizer is None:
        compiled = getattr(model, "optimizer", None)
        if compiled is not None:
            return compiled, "the model's compiled optimizer"
        return keras.optimizers.Adam(), "Adam (default: model not compiled)"
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer, "given"
    if isinstance(optimizer, str):
        opt, note = optimizer_from_name(optimizer)
        return opt, f"given: {note}" if note else "given"
    raise TypeError(
        "`optimizer` must be None, a string such as 'adam', or a "
        "`keras.optimizers.Optimizer`. Received: "
        f"optimizer={optimizer!r} (of type {type(optimizer).__name__})."
    )


def _inner(optimizer):
    # LossScaleOptimizer (and wrappers like it) keep their state in the inner
    # optimizer, plus a few scalars.
    inner = getattr(optimizer, "inner_optimizer", None)
    return inner if isinstance(inner, keras.optimizers.Optimizer) else None


def _itemsize(dtype) -> int:
    import numpy as np

    name = keras.backend.standardize_dtype(dtype)
    if name == "bfloat16":
        return 2
    return np.dtype(name).itemsize


def _adafactor_bytes(shape, dtype) -> int:
    size = _itemsize(dtype)
    full = math.prod(shape) * size
    if len(shape) < 2:
        return full + 2 * size  # velocity, two scalar placeholders
    rows = math.prod(shape[:-1])
    cols = math.prod(shape[:-2]) * shape[-1]
    return full + (rows + cols) * size


def _probe_bytes(optimizer, shape, dtype) -> int:
    """Bytes a fresh copy of `optimizer` allocates for one variable."""
    small = tuple(shape)
    scale = 1.0
    n = math.prod(shape)
    if n > _PROBE_LIMIT:
        # Shrink the leading axis; state that is linear in size scales back.
        lead = max(1, _PROBE_LIMIT // max(1, n // shape[0]))
        scale = shape[0] / lead
        small = (lead,) + tuple(shape[1:])
    fresh = optimizer.__class__.from_config(optimizer.get_config())
    fresh.build([])
    base = sum(_itemsize(v.dtype) * math.prod(v.shape) for v in fresh.variables)
    probe = optimizer.__class__.from_config(optimizer.get_config())
    var = keras.Variable(keras.ops.zeros(small, dtype=dtype), name="probe")
    probe.build([var])
    total = sum(
        _itemsize(v.dtype) * math.prod(v.shape) for v in probe.variables
    )
    return int((total - base) * scale)


def optimizer_state_bytes(optimizer, variables) -> tuple[int, str]:
    """Bytes of state `optimizer` keeps for trainable `variables`.

    Args:
        optimizer: Keras optimizer instance.
        variables: list of `(shape, dtype)` of the trainable variables.

    Returns:
        `(bytes, description)`, e.g. `(8000, "Adam: 2 slots per weight")`.
    """
    extra = 0
    wrapper = ""
    inner = _inner(optimizer)
    if inner is not None:
        wrapper = f"{type(optimizer).__name__}({type(inner).__name__}): "
        extra += 2 * 8  # loss scale and step counter
        optimizer = inner
    name = type(optimizer).__name__
    config = optimizer.get_config()
    weight_bytes = sum(math.prod(s) * _itemsize(d) for s, d in variables)
    copies = 0
    if config.get("use_ema"):
        copies += 1
        if isinstance(optimizer, CountsStateBytes):
            # tfmemopt's optimizers keep float32 averages of 16-bit weights.
            extra += sum(
                math.prod(s) * max(4, _itemsize(d)) for s, d in variables
            )
        else:
            extra += weight_bytes
    if config.get("gradient_accumulation_steps"):
        copies += 1
        extra += weight_bytes
    if isinstance(optimizer, CountsStateBytes):
        # tfmemopt.optimizers (8-bit, factored): their own exact count.
        body = sum(optimizer.variable_state_bytes(s, d) for s, d in variables)
        count = max(1, sum(math.prod(s) for s, _ in variables))
        how = f"{name}: {body / count:.2f} bytes per parameter"
    elif name in _SLOTS:
        slots = _SLOTS[name](config)
        how = f"{name}: {slots} slot(s) per weight"
        body = slots * weight_bytes
    elif name == "Adafactor":
        body = sum(_adafactor_bytes(s, d) for s, d in variables)
        how = "Adafactor: velocity plus factored row/column statistics"
    else:
        cache = {}
        body = 0
        for shape, dtype in variables:
            key = (tuple(shape), str(dtype))
            if key not in cache:
                cache[key] = _probe_bytes(optimizer, shape, dtype)
            body += cache[key]
        how = f"{name}: probed (state of a fresh copy built per shape)"
    if copies:
        how += f", +{copies} copy(ies) for EMA/accumulation"
    return body + extra, wrapper + how
