"""The `tfmemopt` command: `estimate`, `doctor`, `find-batch-size`, `plan`.

Each subcommand is one function registered with `@subcommand(name, help)`
(`tfmemopt.cli._commands`); `_main` holds `estimate` and `doctor` and the
parser, `_plan` holds `find-batch-size` and `plan`.
"""

from tfmemopt.cli._commands import COMMANDS
from tfmemopt.cli._commands import subcommand
from tfmemopt.cli._main import build_parser
from tfmemopt.cli._main import doctor_report
from tfmemopt.cli._main import main

__all__ = [
    "COMMANDS",
    "build_parser",
    "doctor_report",
    "main",
    "subcommand",
]
