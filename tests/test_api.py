"""The public API: every exported name exists, is documented, is importable."""

import inspect

import keras
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


@pytest.mark.parametrize(
    "function, positional",
    [
        (tfmemopt.estimate_memory, ["model", "batch_size"]),
        (tfmemopt.plan, ["model", "global_batch_size", "memory_budget"]),
        (tfmemopt.find_batch_size, ["model", "data"]),
        (tfmemopt.oom_report, ["model", "batch_size"]),
        (tfmemopt.Model.wrap, ["model", "accumulation_steps"]),
    ],
    ids=lambda f: getattr(f, "__qualname__", None),
)
def test_entry_points_take_options_by_keyword(function, positional):
    """The first arguments by position, every option by name (#50)."""
    params = inspect.signature(function).parameters.values()
    assert [
        p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD
    ] == positional
    assert all(
        p.kind == p.KEYWORD_ONLY for p in params if p.name not in positional
    )


def test_options_by_position_warn_and_still_work():
    """Older code that passes options by position runs, with a
    FutureWarning that names what to write instead; an option given both
    ways is refused as Python refuses it."""
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    want = tfmemopt.estimate_memory(model, 8, optimizer="sgd")
    with pytest.warns(FutureWarning, match=r"optimizer=\.\.\."):
        got = tfmemopt.estimate_memory(model, 8, "sgd")
    assert got.total == want.total
    with pytest.warns(FutureWarning, match=r"micro_batch_size=\.\.\."):
        wrapped = tfmemopt.Model.wrap(model, None, 4)
    assert wrapped.micro_batch_size == 4
    with pytest.raises(TypeError, match="multiple values for 'optimizer'"):
        tfmemopt.estimate_memory(model, 8, "sgd", optimizer="adam")
