"""The public API: every exported name exists, is documented, is importable."""

import inspect

import pytest

import tfmemopt


@pytest.mark.parametrize("name", tfmemopt.__all__)
def test_exported_name_exists_and_is_documented(name):
    obj = getattr(tfmemopt, name)
    if name == "__version__":
        assert isinstance(obj, str) and obj
        return
    doc = inspect.getdoc(obj)
    assert doc and len(doc.splitlines()[0]) > 10, f"{name} has no summary"


def test_all_has_no_duplicates():
    assert len(tfmemopt.__all__) == len(set(tfmemopt.__all__))


@pytest.mark.parametrize(
    "name",
    [
        "Model",
        "AccumulatingOptimizer",
        "CheckpointBlock",
        "enable_checkpointing",
        "disable_checkpointing",
        "check_precision",
        "check_alignment",
        "estimate_memory",
        "find_batch_size",
        "suggest_accumulation",
        "plan",
        "oom_report",
    ],
)
def test_contract_names_are_top_level(name):
    assert name in tfmemopt.__all__


def test_callbacks_and_distribute_namespaces():
    assert tfmemopt.callbacks.MemoryMonitor.__doc__
    assert callable(tfmemopt.distribute.auto_strategy)
    assert callable(tfmemopt.mixed_precision.configure)


def test_no_keras_src_imports():
    import pathlib
    import re

    root = pathlib.Path(tfmemopt.__file__).parent
    offenders = [
        str(p)
        for p in root.rglob("*.py")
        if re.search(r"^\s*(from|import)\s+keras\.src", p.read_text(), re.M)
    ]
    assert offenders == []
