"""The registry of `tfmemopt` subcommands and what every command shares.

Every command module registers here, and `_main` builds the parser from it;
`load_saved_model` and `bad_input` are the commands' common steps.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
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


_FORMATS = (".keras", ".h5", ".hdf5")


def model_arguments(parser, input_sizes: bool = True) -> None:
    """The saved model, `--import` and, with `input_sizes`, `--seq-len` and
    `--input-shape`: the arguments of every command that loads a model."""
    parser.add_argument(
        "model",
        help="path of a saved model: .keras (model.save('m.keras')) or "
        ".h5/.hdf5 (legacy Keras); a SavedModel directory cannot be loaded "
        "as a Keras model",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE before loading (repeatable): the module that "
        "defines your own layers, losses or models; its classes and "
        "functions are also passed to Keras as custom objects",
    )
    if not input_sizes:
        return
    parser.add_argument(
        "--seq-len",
        type=int,
        default=None,
        metavar="N",
        help="size of every unknown input dimension besides the batch "
        "(variable-length inputs, e.g. keras-hub text models)",
    )
    parser.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="SHAPE",
        help="one sample's shape without the batch, e.g. 128 or 224,224,3; "
        "repeat it once per input, or give NAME=SHAPE per input name",
    )


def json_argument(parser, instead_of: str = "text") -> None:
    """`--json`: print JSON instead of `instead_of`."""
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print JSON instead of {instead_of}",
    )


def sizes_and_model(args, command: str, load: Callable, check=None):
    """The first steps of a command that loads a model.

    Reads `--seq-len`/`--input-shape` (then runs `check()`, which may raise
    ValueError for the command's own arguments) and loads the model with
    `load(args, command)`. Returns `(sizes, model)`, or the exit code 2
    after saying on stderr what is wrong.
    """
    try:
        sizes = input_sizes(args)
        if check is not None:
            check()
    except ValueError as e:
        return bad_input(command, e)
    model = load(args, command)
    if model is None:
        return 2
    return sizes, model


def input_sizes(args) -> dict:
    """`estimate_memory`'s `input_shape`/`sequence_length` from `args`
    (ValueError for a malformed `--input-shape`)."""
    shapes, named = [], {}
    for text in getattr(args, "input_shape", None) or []:
        name, _, dims = text.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            raise ValueError(
                f"--input-shape must be dimensions separated by commas, "
                f"e.g. 128 or 224,224,3 (or NAME=128). Received: {text!r}."
            ) from None
        if name:
            named[name] = shape
        else:
            shapes.append(shape)
    if named and shapes:
        raise ValueError(
            "--input-shape: give every input by name (NAME=SHAPE) or none "
            f"by name. Received: {args.input_shape}."
        )
    input_shape = named or (shapes[0] if len(shapes) == 1 else (shapes or None))
    return {
        "input_shape": input_shape,
        "sequence_length": getattr(args, "seq_len", None),
    }


def _import_modules(modules, command):
    """The custom objects of the modules named by `--import`, or None
    after saying which one could not be imported."""
    import importlib

    if modules and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` finds the cwd's
    custom = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import error is reported
            print(
                f"tfmemopt {command}: --import {name}: cannot import it "
                f"({type(e).__name__}: {e}). Pass a module importable from "
                "the current directory or PYTHONPATH, e.g. --import "
                "my_layers for my_layers.py.",
                file=sys.stderr,
            )
            return None
        for key, value in vars(module).items():
            if not key.startswith("_") and callable(value):
                custom[key] = value
    return custom


def _unsupported(path: str, command: str) -> str | None:
    """Why `path` cannot be loaded, or None."""
    if os.path.isdir(path):
        kind = (
            "a TensorFlow SavedModel directory"
            if os.path.isfile(os.path.join(path, "saved_model.pb"))
            else "a directory"
        )
        return (
            f"{path!r} is {kind}. Keras 3 loads only .keras files and "
            "legacy .h5 files as models (a SavedModel can only be wrapped "
            "for inference, `keras.layers.TFSMLayer`, which cannot be "
            "trained or estimated). Save the model from the code that "
            "builds it with `model.save('model.keras')`."
        )
    if not os.path.isfile(path):
        return (
            f"no such file: {path!r}. Pass the path of a model saved with "
            "`model.save('model.keras')`."
        )
    if not path.lower().endswith(_FORMATS):
        return (
            f"{path!r} is not a saved Keras model: supported are "
            f"{', '.join(_FORMATS)} files (`model.save('model.keras')`)."
        )
    return None


def load_saved_model(
    path: str,
    command: str,
    compile_as: dict | None = None,
    imports=(),
):
    """The model saved at `path`, or None after saying why not.

    `imports` are modules to import first (the user's own layers); their
    public classes and functions are passed as custom objects. A model
    whose saved optimizer or loss cannot be rebuilt loads without them,
    compiled with `compile_as` (keyword arguments) when given. Imports
    tfmemopt first, which registers its serializable classes.
    """
    why = _unsupported(path, command)
    if why is not None:
        print(f"tfmemopt {command}: {why}", file=sys.stderr)
        return None
    # Only effective when TensorFlow is not imported yet.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    import tfmemopt  # noqa: F401 - registers tfmemopt's serializable objects

    custom = _import_modules(imports, command)
    if custom is None:
        return None
    with warnings.catch_warnings():
        # A model saved before it trained holds no optimizer state; Keras
        # builds the optimizer as it loads and warns that it skips the
        # saved variables. The commands read only the optimizer's class and
        # configuration: the warning would only alarm.
        warnings.filterwarnings(
            "ignore", message="Skipping variable loading for optimizer"
        )
        try:
            return keras.saving.load_model(path, custom_objects=custom)
        except Exception:  # a saved optimizer or loss that cannot be rebuilt
            pass
    try:
        model = keras.saving.load_model(
            path, custom_objects=custom, compile=False
        )
    except Exception as e:  # noqa: BLE001 - said in one line, not a trace
        text = " ".join(str(e).split())
        missing = re.search(
            r"Could not locate (class|function) '([^']+)'", text
        )
        fix = (
            "pass --import MODULE, the module that defines it (and "
            "decorate it with @keras.saving.register_keras_serializable())."
        )
        if missing:  # Keras's own text names it after a long config
            said = (
                f"it uses the {missing.group(1)} {missing.group(2)!r}, "
                f"which is not registered here: {fix}"
            )
        else:
            said = f"{type(e).__name__}: {text[:300]}"
            if "Could not locate" in text or "custom" in text.lower():
                said += (
                    " It uses a class or function that is not registered "
                    f"here: {fix}"
                )
        print(
            f"tfmemopt {command}: cannot load {path!r}: {said}",
            file=sys.stderr,
        )
        return None
    if compile_as is not None:
        model.compile(**compile_as)
    return model
