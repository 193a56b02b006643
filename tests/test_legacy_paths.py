"""What imported in tfmemopt 0.1.0.dev0 still imports, as the same object.

The names of 0.1's `tfmemopt.__all__`, `tfmemopt.callbacks`,
`tfmemopt.distribute` and `tfmemopt.mixed_precision`, and the 0.1 module
paths (`tfmemopt.model`, `tfmemopt.oom`, ...), which are now aliases of the
modules they moved to (tfmemopt/_legacy.py).
"""

from __future__ import annotations

import importlib

import pytest

import tfmemopt
from tfmemopt import _legacy

TOP_0_1 = [
    "Model",
    "WrappedModel",
    "AccumulatingOptimizer",
    "checkpointing",
    "CheckpointBlock",
    "enable_checkpointing",
    "disable_checkpointing",
    "mixed_precision",
    "check_precision",
    "check_alignment",
    "pad_to_multiple",
    "distribute",
    "memory",
    "callbacks",
    "estimate_memory",
    "MemoryEstimate",
    "find_batch_size",
    "suggest_accumulation",
    "plan",
    "Plan",
    "oom_report",
]
SUBMODULE_0_1 = {
    "callbacks": ["MemoryMonitor"],
    "distribute": [
        "Environment",
        "auto_strategy",
        "describe",
        "detect_environment",
    ],
    "mixed_precision": [
        "POLICIES",
        "PRESETS",
        "Hardware",
        "PrecisionConfig",
        "choose_policy",
        "configure",
        "detect_hardware",
    ],
}


@pytest.mark.parametrize("name", TOP_0_1)
def test_top_level_names_of_0_1(name):
    assert name in tfmemopt.__all__
    assert getattr(tfmemopt, name) is not None


@pytest.mark.parametrize(
    "module, name",
    [(m, n) for m, names in SUBMODULE_0_1.items() for n in names],
)
def test_subpackage_names_of_0_1(module, name):
    imported = importlib.import_module(f"tfmemopt.{module}")
    assert getattr(imported, name) is getattr(getattr(tfmemopt, module), name)


@pytest.mark.parametrize("old, new", sorted(_legacy.MOVED.items()))
def test_0_1_module_paths_are_the_moved_modules(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    leaf = old.rsplit(".", 1)[1]
    parent = importlib.import_module(old.rsplit(".", 1)[0])
    assert getattr(parent, leaf) is importlib.import_module(new)


def test_0_1_imports_give_the_same_classes():
    from tfmemopt.accumulating_optimizer import AccumulatingOptimizer
    from tfmemopt.model import Model
    from tfmemopt.oom import OutOfMemoryError

    assert Model is tfmemopt.Model
    assert AccumulatingOptimizer is tfmemopt.AccumulatingOptimizer
    assert OutOfMemoryError is tfmemopt.tuning.OutOfMemoryError
    assert tfmemopt.oom.OutOfMemoryError is OutOfMemoryError


def test_unknown_attribute_still_raises():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        tfmemopt.nothing  # noqa: B018
