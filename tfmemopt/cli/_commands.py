"""The registry of `tfmemopt` subcommands and what every command shares.

Every command module registers here, and `_main` builds the parser from it;
`load_saved_model` and `bad_input` are the commands' common steps.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

# name -> (help, add_arguments(parser), run(args) -> exit code)
COMMANDS: dict[str, tuple[str, Callable, Callable]] = {}


def subcommand(name: str, help: str, arguments: Callable | None = None):
    """Registers `run(args) -> int` as `tfmemopt <name>`."""

    def register(run):
        COMMANDS[name] = (help, arguments or (lambda parser: None), run)
        return run

    return register


def bad_input(command: str, error: BaseException) -> int:
    """Says `tfmemopt <command>: <error>` on stderr; returns exit code 2."""
    print(f"tfmemopt {command}: {error}", file=sys.stderr)
    return 2


def load_saved_model(path: str, command: str, compile_as: dict | None = None):
    """The model saved at `path`, or None after saying there is no file.

    A model whose saved optimizer or loss cannot be rebuilt loads without
    them, compiled with `compile_as` (keyword arguments) when given.
    Imports tfmemopt first, which registers its serializable classes.
    """
    if not os.path.isfile(path):
        print(
            f"tfmemopt {command}: no such file: {path!r}. Pass the path of a "
            "model saved with `model.save('model.keras')`.",
            file=sys.stderr,
        )
        return None
    # Only effective when TensorFlow is not imported yet.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    import tfmemopt  # noqa: F401 - registers tfmemopt's serializable objects

    try:
        return keras.saving.load_model(path)
    except Exception:  # a saved optimizer or loss that cannot be rebuilt
        model = keras.saving.load_model(path, compile=False)
        if compile_as is not None:
            model.compile(**compile_as)
        return model
