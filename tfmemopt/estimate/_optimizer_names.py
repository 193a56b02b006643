"""Optimizer names: what `estimate_memory(optimizer=...)`, `plan` and
`tfmemopt estimate --optimizer` accept.

Every name the planner prints is accepted back, in any case: the
`tfmemopt.optimizers` class names (`Plan.optimizer`: `"AdamW8bit"`,
`"Adam8bit"`, `"Adafactor"`), their full paths (`Plan.optimizer_name`:
`"tfmemopt.optimizers.AdamW8bit"`) and the sharding wrapper
(`"tfmemopt.ShardedOptimizer(AdamW8bit, stage=1)"`), besides Keras's names
(`"adam"`, `"sgd"`, ...).

One name means two optimizers: Keras and tfmemopt both have an Adafactor.
A bare `"adafactor"` is tfmemopt's (`tfmemopt.optimizers.Adafactor`, the
one the planner switches to, which keeps a row and a column per matrix;
Keras's also keeps a full-size velocity) and the estimate's notes say so;
`"keras.optimizers.Adafactor"` or `"keras_adafactor"` is Keras's,
`"tfmemopt.optimizers.Adafactor"` or `"tfmemopt_adafactor"` tfmemopt's.
"""

from __future__ import annotations

import re

import keras

from tfmemopt import optimizers
from tfmemopt.distribute import ShardedOptimizer

# The tfmemopt optimizers by lower-case name (their classes' names).
TFMEMOPT = ("Adam8bit", "AdamW8bit", "Adafactor")
# Names of both a Keras and a tfmemopt optimizer: tfmemopt's is meant.
AMBIGUOUS = ("adafactor",)

_TFMEMOPT_PREFIXES = ("tfmemopt.optimizers.", "tfmemopt_", "tfmemopt.")
_KERAS_PREFIXES = ("keras.optimizers.", "keras_", "keras.")
_SHARDED = re.compile(
    r"^(?:tfmemopt\.(?:distribute\.)?)?shardedoptimizer\(\s*(?P<inner>[\w.]+)"
    r"\s*(?:,\s*(?:stage\s*=\s*)?(?P<stage>\d+)\s*)?\)$"
)


def _tfmemopt_class(name: str):
    for cls_name in TFMEMOPT:
        if cls_name.lower() == name:
            return getattr(optimizers, cls_name)
    return None


def _unknown(given: str, why: str = "") -> ValueError:
    tfm = ", ".join(TFMEMOPT)
    return ValueError(
        f"Unknown optimizer {given!r}{why}. Expected the name of a Keras "
        "optimizer ('adam', 'adamw', 'sgd', 'rmsprop', 'lion', "
        "'keras.optimizers.Adafactor', ...), of a tfmemopt optimizer "
        f"({tfm}, or 'tfmemopt.optimizers.<name>'), either wrapped as "
        "'tfmemopt.ShardedOptimizer(<name>, stage=1)', or a "
        "`keras.optimizers.Optimizer` instance; names are case-insensitive. "
        "Fix: pass e.g. optimizer='adam' or optimizer='AdamW8bit'."
    )


def optimizer_from_name(given: str):
    """`(a fresh optimizer, a note)` for the name `given`, e.g.
    `"AdamW8bit"`, `"tfmemopt.optimizers.Adafactor"`, `"adam"`,
    `"tfmemopt.ShardedOptimizer(AdamW8bit, stage=1)"`.

    The note says which optimizer a name meant when it could mean two
    (`"adafactor"`). Raises `ValueError` for an unknown name.
    """
    name = re.sub(r"\s+", "", given).lower()
    sharded = _SHARDED.match(name)
    if sharded:
        inner, note = optimizer_from_name(sharded["inner"])
        stage = int(sharded["stage"] or 1)
        try:
            return ShardedOptimizer(inner, stage=stage), note
        except ValueError as e:
            raise ValueError(f"Optimizer {given!r}: {e}") from None
    for prefix in _TFMEMOPT_PREFIXES:
        if name.startswith(prefix):
            cls = _tfmemopt_class(name[len(prefix) :])
            if cls is None:
                raise _unknown(given, " (no such tfmemopt optimizer)")
            return cls(), ""
    for prefix in _KERAS_PREFIXES:
        if name.startswith(prefix):
            return _keras(name[len(prefix) :], given), ""
    cls = _tfmemopt_class(name)
    if cls is not None:
        note = ""
        if name in AMBIGUOUS:
            note = (
                f"{given!r} is tfmemopt.optimizers.{cls.__name__}; for "
                f"Keras's pass 'keras.optimizers.{cls.__name__}'"
            )
        return cls(), note
    return _keras(name, given), ""


def _keras(name: str, given: str):
    try:
        return keras.optimizers.get(name)
    except ValueError:
        raise _unknown(given) from None
