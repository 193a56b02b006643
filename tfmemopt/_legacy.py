"""The module paths of tfmemopt 0.1, kept importable after the move (#15).

0.1 kept every module at the top of `tfmemopt/`; they now live in concept
subpackages. `import tfmemopt.model` or `from tfmemopt.oom import
OutOfMemoryError` keep working: `tfmemopt/__init__.py` enters each old name
in `sys.modules` as the module it moved to (the same module object, so a
class imported either way is the same class), and its `__getattr__` answers
`tfmemopt.oom` with it (without listing the old names in `dir(tfmemopt)`).
Nothing is copied, and no import hook is installed.

Saved `.keras` files do not need these paths: Keras 3 resolves a class that
is not Keras's own by its registered name (`tfmemopt>Model`), which a plain
`import tfmemopt` registers (tests/test_saved_fixtures.py loads files saved
by 0.1.0.dev0). `tfmemopt.mixed_precision`, a public 0.1 name, is also an
attribute of `tfmemopt`: the module behind `tfmemopt.precision.configure`.

The CLI modules (`tfmemopt.cli`, now a package; `tfmemopt._cli_plan`) are
not aliased: `tfmemopt.cli` keeps its name and `main`.
"""

from __future__ import annotations

import importlib
import sys

# 0.1 path -> where the module lives now.
MOVED = {
    "tfmemopt.model": "tfmemopt.accumulation._model",
    "tfmemopt._wrapped": "tfmemopt.accumulation._wrapped",
    "tfmemopt._window": "tfmemopt.accumulation._window",
    "tfmemopt.loss_normalization": (
        "tfmemopt.accumulation._loss_normalization"
    ),
    "tfmemopt.micro_batching": "tfmemopt.accumulation._micro_batching",
    "tfmemopt.accumulating_optimizer": (
        "tfmemopt.accumulation._accumulating_optimizer"
    ),
    "tfmemopt._accumulation_hooks": (
        "tfmemopt.accumulation._accumulation_hooks"
    ),
    "tfmemopt.checkpointing.apply": "tfmemopt.checkpointing._apply",
    "tfmemopt.checkpointing.block": "tfmemopt.checkpointing._block",
    "tfmemopt.checkpointing.policies": "tfmemopt.checkpointing._policies",
    "tfmemopt.mixed_precision": "tfmemopt.precision._mixed_precision",
    "tfmemopt.advice": "tfmemopt.precision._advice",
    "tfmemopt._alignment": "tfmemopt.precision._alignment",
    "tfmemopt.findings": "tfmemopt.precision._findings",
    "tfmemopt._policy_clone": "tfmemopt.precision._policy_clone",
    "tfmemopt._step_graph": "tfmemopt.estimate._step_graph",
    "tfmemopt._activation_rules": "tfmemopt.estimate._activation_rules",
    "tfmemopt._while_loops": "tfmemopt.estimate._while_loops",
    "tfmemopt._optimizer_state": "tfmemopt.estimate._optimizer_state",
    "tfmemopt.batch_size": "tfmemopt.tuning._batch_size",
    "tfmemopt._search": "tfmemopt.tuning._search",
    "tfmemopt._trials": "tfmemopt.tuning._trials",
    "tfmemopt.planner": "tfmemopt.tuning._planner",
    "tfmemopt._plan_apply": "tfmemopt.tuning._plan_apply",
    "tfmemopt.oom": "tfmemopt.tuning._oom",
}


def alias_0_1_paths() -> None:
    """Enters every 0.1 path in `sys.modules` as the module it moved to."""
    for old, new in MOVED.items():
        module = sys.modules.setdefault(old, importlib.import_module(new))
        parent, leaf = old.rsplit(".", 1)
        if parent != "tfmemopt":  # tfmemopt's own answer: legacy_attribute
            # `tfmemopt.checkpointing.block`, as a submodule attribute was.
            setattr(sys.modules[parent], leaf, module)


def legacy_attribute(name: str):
    """`tfmemopt.<name>` for a 0.1 module name (`tfmemopt.oom`), else
    AttributeError: what `import tfmemopt.oom; tfmemopt.oom.X` needs."""
    fullname = f"tfmemopt.{name}"
    if fullname in MOVED and fullname in sys.modules:
        return sys.modules[fullname]
    raise AttributeError(f"module 'tfmemopt' has no attribute {name!r}")
