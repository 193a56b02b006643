"""Helpers shared by every subpackage: argument checks, byte formatting,
and the config step of wrappers that hold another Keras object.

One function per idea, so that every entry point refuses bad input with the
same kind of error and message, and every report prints bytes alike.
"""

from __future__ import annotations

import keras

MIB = 1024 * 1024


def check_int(name: str, value, minimum: int = 1, hint: str = "") -> int:
    """`value` if it is an int >= `minimum`; raises otherwise.

    Raises `TypeError` when `value` is not an int (a bool, a float such as
    `2.0`, a string such as `"4"`) and `ValueError` when it is an int below
    `minimum`. The message says what was passed, what was expected and, with
    `hint`, how to fix it.

    Example:

    >>> check_int("accumulation_steps", 4)
    4
    """
    if isinstance(value, bool) or not isinstance(value, int):
        error = TypeError
    elif value < minimum:
        error = ValueError
    else:
        return value
    message = (
        f"`{name}` must be an integer >= {minimum}. Received: {name}="
        f"{value!r} (of type {type(value).__name__})."
    )
    raise error(f"{message} {hint}" if hint else message)


def pop_keras_object(config: dict, key: str, custom_objects=None):
    """`(object, rest)`: `config[key]` deserialized, and the other entries.

    For the `from_config` of a wrapper that serializes the object it wraps
    (an inner optimizer, a wrapped model) under `key`.
    """
    rest = dict(config)
    obj = keras.saving.deserialize_keras_object(
        rest.pop(key), custom_objects=custom_objects
    )
    return obj, rest


def format_bytes(n: float) -> str:
    """`n` bytes in the largest binary unit below 1024: `"1.5 GiB"`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def format_mib(n, missing: str = "-", unit: bool = True) -> str:
    """`n` bytes as MiB with one decimal (`"1,024.0 MiB"`), or `missing`
    when `n` is None; `unit=False` leaves out `" MiB"` (table cells)."""
    if n is None:
        return missing
    return f"{n / MIB:,.1f}" + (" MiB" if unit else "")
