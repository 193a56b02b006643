"""The package's shape holds: imports go one way, no cycles, no keras.src.

`lint-imports` checks the contracts in pyproject.toml ([tool.importlinter]):
the layers (cli > callbacks > tuning > estimate > accumulation | optimizers >
checkpointing > memory | distribute | precision > shared helpers) and the
independence of the low techniques. grimp, under it, reads every import
statement, also those written inside functions.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import grimp
import pytest
from conftest import ROOT

LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def _lint(cwd, pythonpath):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run(
        [LINT, "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_contracts_are_kept():
    proc = _lint(ROOT, ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_an_upward_import_inside_a_function_breaks_the_contract(tmp_path):
    """What CI would see if `memory` reached up into `tuning` lazily."""
    shutil.copytree(
        os.path.join(ROOT, "tfmemopt"),
        tmp_path / "tfmemopt",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path)
    with open(tmp_path / "tfmemopt" / "memory" / "_device.py", "a") as f:
        f.write(
            "\n\ndef _upward():\n"
            "    from tfmemopt.tuning import plan\n\n"
            "    return plan\n"
        )
    proc = _lint(tmp_path, str(tmp_path))
    assert proc.returncode != 0
    assert "tfmemopt.memory is not allowed to import tfmemopt.tuning" in (
        proc.stdout
    ), proc.stdout[-4000:]


def _strongly_connected(edges):
    """Groups of two or more nodes that reach each other (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in list(edges):
        if v not in index:
            visit(v)
    return groups


@pytest.mark.parametrize("level", ["module", "subpackage"])
def test_no_import_cycles(level):
    graph = grimp.build_graph("tfmemopt", cache_dir=None)
    edges = {}
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = importer, imported
            if level == "subpackage":
                a, b = (".".join(m.split(".")[:2]) for m in (a, b))
            if a != b:
                edges.setdefault(a, set()).add(b)
    assert _strongly_connected(edges) == []


def test_cycle_finder_finds_a_cycle():
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [
        ["a", "b", "c"]
    ]


_STACK_READERS = ("sys._getframe", "inspect.currentframe", "inspect.stack(")


def test_nothing_reads_the_call_stack():
    # #15: tfmemopt finds its wrappers and models through explicit hooks
    # (`tfmemopt._compat.on_loss_scale_optimizer`, `in_xla_function`), never
    # by walking the caller's frames.
    root = pathlib.Path(ROOT)
    found = [
        f"{path.relative_to(root)}: {reader}"
        for path in sorted((root / "tfmemopt").rglob("*.py"))
        for reader in _STACK_READERS
        if reader in path.read_text()
    ]
    assert not found, found


def _private_imports_across_packages(root: pathlib.Path) -> list:
    """`file:line` of each import in a subpackage of tfmemopt of another
    subpackage's private module or private name (#50). The top-level
    private modules (`tfmemopt._compat`, `_utils`, ...) are the shared
    layer every package builds on; `tfmemopt/__init__.py` is the facade."""
    import ast

    found = []
    for path in sorted((root / "tfmemopt").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if len(parts) < 3:  # a top-level module
            continue
        package = parts[1]
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            target = node.module.split(".")
            if target[0] != "tfmemopt" or len(target) < 2:
                continue
            if target[1].startswith("_") or target[1] == package:
                continue
            for alias in node.names:
                names = target[2:] + [alias.name]
                if any(n.startswith("_") for n in names):
                    where = path.relative_to(root)
                    found.append(
                        f"{where}:{node.lineno}: from {node.module} "
                        f"import {alias.name}"
                    )
    return found


def test_no_package_imports_another_packages_private_names():
    # What another package needs is imported in its __init__ (not in
    # __all__): its private modules stay free to change.
    assert _private_imports_across_packages(pathlib.Path(ROOT)) == []


def test_the_private_import_check_finds_one(tmp_path):
    bad = tmp_path / "tfmemopt" / "tuning" / "_x.py"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "from tfmemopt.longseq._head import head_of\n"
        "from tfmemopt.longseq import _enable\n"
        "from tfmemopt.longseq import head_of\n"
        "from tfmemopt._compat import sublayers\n"
        "from tfmemopt.tuning._planner import plan\n"
    )
    assert _private_imports_across_packages(tmp_path) == [
        "tfmemopt/tuning/_x.py:1: from tfmemopt.longseq._head import head_of",
        "tfmemopt/tuning/_x.py:2: from tfmemopt.longseq import _enable",
    ]


def test_one_helper_sets_attributes_past_keras_tracking():
    # #50: `_compat.set_untracked` is the one place tfmemopt sets an
    # attribute (a replaced method, its own state) on a Keras object it did
    # not make, and says why; 32 calls of object.__setattr__ in 11 modules
    # before.
    root = pathlib.Path(ROOT)
    found = [
        str(path.relative_to(root))
        for path in sorted((root / "tfmemopt").rglob("*.py"))
        if path.name != "_compat.py"
        and (
            "object.__setattr__" in path.read_text()
            or "object.__delattr__" in path.read_text()
        )
    ]
    assert found == []


def _modules_run_by_one_step(model, x, y, monkeypatch):
    """The tfmemopt modules whose functions run while `train_step` is
    traced (the batch's path, without `fit`'s own hooks)."""
    import tfmemopt.accumulation._model as model_module

    seen = set()
    original = model_module.Model.train_step

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name == "tfmemopt" or name.startswith("tfmemopt."):
                seen.add(name)

    def traced(self, data):
        sys.setprofile(profile)
        try:
            return original(self, data)
        finally:
            sys.setprofile(None)

    monkeypatch.setattr(model_module.Model, "train_step", traced)
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0)
    return seen


def test_one_step_runs_through_at_most_8_modules(monkeypatch):
    """A newcomer follows one batch through at most 8 modules, the ones
    docs/architecture.md lists ("One training step")."""
    import keras
    import numpy as np

    import tfmemopt

    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = tfmemopt.Model(
        inputs, keras.layers.Dense(3)(hidden), accumulation_steps=2
    )
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x = np.random.default_rng(0).normal(size=(8, 8)).astype("float32")
    y = np.arange(8) % 3
    seen = _modules_run_by_one_step(model, x, y, monkeypatch)
    documented = {
        "tfmemopt._compat",
        "tfmemopt.accumulation._model",
        "tfmemopt.accumulation._micro_batching",
        "tfmemopt.accumulation._window",
        "tfmemopt.accumulation._window_accumulators",
        "tfmemopt.accumulation._loss_normalization",
        "tfmemopt.distribute.step_hooks",
        "tfmemopt.distribute._gradients",
    }
    assert seen == documented, sorted(seen ^ documented)
    assert len(seen) <= 8
    doc = (pathlib.Path(ROOT) / "docs" / "architecture.md").read_text()
    for name in documented:
        assert f"`{name.rsplit('.', 1)[-1]}`" in doc, name


# Functions of more than 80 lines of code (docstring, comments and blank
# lines not counted) that remain, each with why: none (the last two, the
# executor estimator's `_simulate` and `trace_step`, are a `_Simulation`
# class and three phases: `_prepare`, `_simulated`, the record).
_LONG_FUNCTIONS: set = set()


def _long_functions(root, limit=80):
    import ast

    found = set()
    for path in sorted(pathlib.Path(root, "tfmemopt").rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first = node.body[0]
            start = first.lineno
            if isinstance(first, ast.Expr) and isinstance(
                getattr(first, "value", None), ast.Constant
            ):
                start = first.end_lineno + 1
            code = [
                line
                for line in lines[start - 1 : node.end_lineno]
                if line.strip() and not line.strip().startswith("#")
            ]
            if len(code) > limit:
                rel = path.relative_to(root).as_posix()
                found.add((rel, node.name))
    return found


def test_functions_are_at_most_80_lines():
    """#50: a function a reader can hold; the exceptions are listed."""
    assert _long_functions(ROOT) == _LONG_FUNCTIONS


def test_the_function_length_check_finds_one(tmp_path):
    package = tmp_path / "tfmemopt"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    (package / "long.py").write_text(f'def f():\n    """Doc."""\n{body}\n')
    (package / "short.py").write_text("def g():\n    return 1\n")
    assert _long_functions(tmp_path) == {("tfmemopt/long.py", "f")}
