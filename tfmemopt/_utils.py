"""Helpers shared by every subpackage: argument checks, byte formatting,
and the config step of wrappers that hold another Keras object.

One function per idea, so that every entry point refuses bad input with the
same kind of error and message, and every report prints bytes alike.
"""

from __future__ import annotations

import functools
import inspect
import warnings

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


class ForwardsToInner:
    """What a wrapper optimizer forwards to `self.inner_optimizer`, as
    Keras's `LossScaleOptimizer` does: the learning rate (read and set),
    the update count and the loss scaling; and the config step of such a
    wrapper (`_wrapper_config`, `from_config`). Put it before
    `keras.optimizers.Optimizer` among the bases."""

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        """Updates applied to the weights (the inner optimizer's count)."""
        return self.inner_optimizer.iterations

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def _wrapper_config(self, **config) -> dict:
        """The config of the wrapper: its name, the serialized inner
        optimizer (read back by `pop_keras_object`) and `config`."""
        return {
            "name": self.name,
            "inner_optimizer": keras.saving.serialize_keras_object(
                self.inner_optimizer
            ),
            **config,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        inner, config = pop_keras_object(
            config, "inner_optimizer", custom_objects
        )
        return cls(inner, **config)


# CPU features that give oneDNN native bfloat16 arithmetic: AVX512_BF16
# (Intel Cooper Lake and later, AMD Zen 4 and later) and AMX (Intel Sapphire
# Rapids and later). Without them TensorFlow's CPU kernels emulate bfloat16.
NATIVE_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset | None:
    """The first CPU's feature flags (Linux's `/proc/cpuinfo`), or None
    where they cannot be read (another OS)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def cpu_has_native_bfloat16(flags=None) -> bool | None:
    """Whether this CPU computes bfloat16 natively (`NATIVE_BFLOAT16_FLAGS`):
    True or False, or None where its flags cannot be read."""
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return None
    return any(flag in flags for flag in NATIVE_BFLOAT16_FLAGS)


def step_regime(model) -> str | None:
    """How `model`'s train step runs: `"xla"` (compiled by XLA,
    `jit_compile=True`; Keras's choice for `"auto"` on one GPU or a TPU),
    `"graph"` (TensorFlow's graph executor), or `None` before `compile`."""
    if model is None or not getattr(model, "compiled", False):
        return None
    try:
        return "xla" if model.jit_compile is True else "graph"
    except Exception:  # noqa: BLE001 - a report asks, it never fails
        return None


def auto_jit_compile_here() -> bool:
    """What `compile(jit_compile="auto")` picks on this machine for a model
    outside `tf.distribute`: XLA where a GPU or TPU is visible (Keras 3's
    rule), the graph executor on a CPU-only machine."""
    import tensorflow as tf

    return any(
        d.device_type != "CPU" for d in tf.config.list_physical_devices()
    )


REGIME_TEXT = {
    "xla": "XLA (jit_compile=True)",
    "graph": "TensorFlow's graph executor (jit_compile=False)",
}


def keyword_options(function):
    """Lets `function`'s keyword-only options still be passed by position,
    with a `FutureWarning`, for one release.

    The entry points take their options keyword-only (`plan(model, 256,
    "16GiB", optimizer="adamw")`); code written against the older
    signature, where they could be positional, keeps working and is told
    what to write instead, as Keras deprecates an argument.

    Example:

    >>> @keyword_options
    ... def scale(x, *, factor=2):
    ...     return x * factor
    >>> scale(3, factor=4)
    12
    """
    signature = inspect.signature(function)
    params = list(signature.parameters.values())
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    options = [p.name for p in params if p.kind == p.KEYWORD_ONLY]

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        extra = args[len(positional) :]
        if extra:
            if len(extra) > len(options):
                raise TypeError(
                    f"{function.__qualname__}() takes {len(positional)} "
                    f"positional arguments and {len(options)} options; "
                    f"received {len(args)} positional arguments."
                )
            names = options[: len(extra)]
            twice = [n for n in names if n in kwargs]
            if twice:
                raise TypeError(
                    f"{function.__qualname__}() got multiple values for "
                    f"{', '.join(map(repr, twice))}."
                )
            shown = ", ".join(f"{n}=..." for n in names)
            warnings.warn(
                f"Passing {', '.join(names)} to {function.__qualname__}() "
                f"by position is deprecated and will be an error in the "
                f"next release; pass them by name ({shown}).",
                FutureWarning,
                stacklevel=2,
            )
            kwargs.update(zip(names, extra))
            args = args[: len(positional)]
        return function(*args, **kwargs)

    return wrapper
