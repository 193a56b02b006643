"""The registry of `tfmemopt` subcommands (no imports: every command module
registers here, and `_main` builds the parser from it)."""

from __future__ import annotations

from typing import Callable

# name -> (help, add_arguments(parser), run(args) -> exit code)
COMMANDS: dict[str, tuple[str, Callable, Callable]] = {}


def subcommand(name: str, help: str, arguments: Callable | None = None):
    """Registers `run(args) -> int` as `tfmemopt <name>`."""

    def register(run):
        COMMANDS[name] = (help, arguments or (lambda parser: None), run)
        return run

    return register
