"""The `tfmemopt` console command, answering `--help` without TensorFlow.

`import tfmemopt.cli` runs `tfmemopt/__init__.py` first, which imports
Keras and TensorFlow (10-30 s) so that `import tfmemopt` registers every
serializable class (Keras needs them to load saved models). Parsing the
command line needs none of it: this module, outside the `tfmemopt`
package, parses with the real parser (`tfmemopt.cli.build_parser`) loaded
under a bare stand-in for the `tfmemopt` package, so `--help`, `-h` and
argument errors answer at once. Only a command that runs imports the
real package (and TensorFlow), then runs `tfmemopt.cli.main`.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def _parse_without_tensorflow(argv) -> None:
    """Parses `argv` with tfmemopt's parser without `tfmemopt/__init__`;
    exits here for `--help` and for argument errors (argparse's)."""
    spec = importlib.util.find_spec("tfmemopt")
    if spec is None or not spec.submodule_search_locations:
        return
    saved = {
        k: v
        for k, v in sys.modules.items()
        if k == "tfmemopt" or k.startswith("tfmemopt.")
    }
    if saved:  # tfmemopt already imported: nothing to save
        return
    stand_in = types.ModuleType("tfmemopt")
    stand_in.__path__ = list(spec.submodule_search_locations)
    sys.modules["tfmemopt"] = stand_in
    try:
        from tfmemopt.cli._main import build_parser

        build_parser().parse_args(argv)
    finally:
        for name in [
            k
            for k in sys.modules
            if k == "tfmemopt" or k.startswith("tfmemopt.")
        ]:
            del sys.modules[name]


def main(argv: list[str] | None = None) -> int:
    """Runs `tfmemopt ...`; returns the exit code (see `tfmemopt.cli`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    _parse_without_tensorflow(argv)
    from tfmemopt.cli import main as run

    return run(argv)
