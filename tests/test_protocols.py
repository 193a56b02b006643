"""The optimizer contract (`tfmemopt/_protocols.py`, #50): every optimizer
the package ships implements the protocols it is listed with here, with the
protocols' signatures, and no other; Keras's own implement none; the
sharding stand-ins are what the optimizers read; docs/architecture.md's
table names every member; one state saver and loader."""

from __future__ import annotations

import inspect
import pathlib
import warnings

import keras
import numpy as np
import pytest
from conftest import ROOT

from tfmemopt import _protocols
from tfmemopt import optimizers
from tfmemopt.distribute._shard_layout import Layout
from tfmemopt.distribute._shard_layout import ParamRef
from tfmemopt.distribute._shard_layout import ParamView

OPTIMIZER_PROTOCOLS = [
    _protocols.CountsStateBytes,
    _protocols.AlignsShards,
    _protocols.CutsState,
    _protocols.StoresState,
    _protocols.FoldsWeightDecay,
]
# What each shipped optimizer implements (a new method is a new row in
# docs/architecture.md's table and here).
SHIPPED = {
    optimizers.Adam8bit: {
        "CountsStateBytes",
        "AlignsShards",
        "CutsState",
        "StoresState",
        "FoldsWeightDecay",
    },
    optimizers.AdamW8bit: {
        "CountsStateBytes",
        "AlignsShards",
        "CutsState",
        "StoresState",
        "FoldsWeightDecay",
    },
    optimizers.Adafactor: {"CountsStateBytes", "FoldsWeightDecay"},
}


def _members(protocol) -> list:
    return sorted(
        n
        for n in vars(protocol)
        if not n.startswith("_")
        or n in getattr(protocol, "__annotations__", {})
    ) + sorted(getattr(protocol, "__annotations__", {}))


def test_every_shipped_optimizer_is_listed():
    shipped = {
        getattr(optimizers, name)
        for name in optimizers.__all__
        if isinstance(getattr(optimizers, name), type)
    }
    assert shipped == set(SHIPPED)


@pytest.mark.parametrize("cls", list(SHIPPED), ids=lambda c: c.__name__)
def test_shipped_optimizers_implement_their_protocols(cls):
    optimizer = cls(learning_rate=1e-3)
    have = {p.__name__ for p in OPTIMIZER_PROTOCOLS if isinstance(optimizer, p)}
    assert have == SHIPPED[cls]
    for protocol in OPTIMIZER_PROTOCOLS:
        if protocol.__name__ not in have:
            continue
        for name in _members(protocol):
            want = inspect.signature(getattr(protocol, name))
            got = inspect.signature(getattr(cls, name))
            assert list(got.parameters) == list(want.parameters), (
                cls.__name__,
                name,
                str(got),
                str(want),
            )
            for param, expected in zip(
                got.parameters.values(), want.parameters.values()
            ):
                assert param.default == expected.default, (cls, name, param)


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.optimizers.Adam(),
        lambda: keras.optimizers.AdamW(),
        lambda: keras.optimizers.SGD(momentum=0.9),
        lambda: keras.optimizers.Adafactor(),
        lambda: keras.optimizers.Lion(),
    ],
)
def test_keras_optimizers_implement_none(make):
    optimizer = make()
    assert not [p for p in OPTIMIZER_PROTOCOLS if isinstance(optimizer, p)]
    assert _protocols.shard_alignment(optimizer, (130, 7)) == 1


def test_the_sharding_stand_ins_are_what_the_optimizers_read():
    w = keras.Variable(np.ones((5, 3), "float32"))
    ref = ParamRef(w, Layout((5, 3), 2), 0, "tfmemopt_shard_0")
    view = ParamView(ref, np.ones((8,), "float32"), element_offset=8)
    assert isinstance(ref, _protocols.PartOfParameter)
    assert isinstance(view, _protocols.OffsetInParameter)
    assert not isinstance(w, _protocols.PartOfParameter)
    assert not isinstance(w, _protocols.OffsetInParameter)
    from tfmemopt.optimizers._common import whole_shape

    assert ref.shape != (5, 3) and whole_shape(ref) == (5, 3)
    assert whole_shape(w) == (5, 3)


def test_docs_table_names_every_member():
    text = (pathlib.Path(ROOT) / "docs" / "architecture.md").read_text()
    section = text.split("## Optimizer contract", 1)[1].split("\n## ", 1)[0]
    listed = {
        line.split("`")[1].split("(")[0]
        for line in section.splitlines()
        if line.startswith("| `")
    }
    members = {
        name
        for protocol in OPTIMIZER_PROTOCOLS
        + [_protocols.PartOfParameter, _protocols.OffsetInParameter]
        for name in _members(protocol)
    }
    assert listed == members
    assert "tfmemopt/_protocols.py" in section


class _Store(dict):
    pass


def test_one_saver_and_loader_for_keras_and_tfmemopt_state():
    w = keras.Variable(np.arange(300.0, dtype="float32").reshape(100, 3))
    for optimizer in (
        keras.optimizers.Adam(),
        optimizers.AdamW8bit(min_8bit_size=0, block_size=64),
    ):
        optimizer.build([w])
        whole = [np.asarray(v.numpy()) + 1 for v in optimizer.variables]
        store = _Store()
        _protocols.save_state(optimizer, store, whole)
        back = _protocols.load_state(optimizer, store)
        assert len(back) == len(whole)
        for a, b in zip(back, whole):
            np.testing.assert_array_equal(np.asarray(a), b)
    # Keras's layout, a count that is not this optimizer's: skipped, said.
    store = _Store({"0": np.zeros(()), "1": np.zeros(())})
    adam = keras.optimizers.Adam(name="mine")
    adam.build([w])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _protocols.load_state(adam, store) is None
    assert any(
        "Skipping the state of optimizer 'mine'" in str(c.message)
        for c in caught
    )
