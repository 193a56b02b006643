"""The optimizer contract: what sharding, FSDP, saving and the estimator ask
of an optimizer and of the variables it is built for.

`ShardedOptimizer` (ZeRO), `shard_parameters=True` (FSDP), their saving and
the estimator meet an optimizer through these protocols. Each is a
`typing.Protocol` checked with `isinstance` (`runtime_checkable`), so an
optimizer takes part by having the methods, without subclassing anything:
Keras's own optimizers have none of them and are treated as elementwise,
with Keras's own layout and saving. `tests/test_protocols.py` checks every
optimizer the package ships against the protocols it implements, with the
signatures written here; docs/architecture.md ("Optimizer contract") says
who reads each.

`save_state` and `load_state` are the one state saver and loader that
`ShardedOptimizer` and FSDP use after gathering (before cutting) the
partitions: the optimizer's own layout where it has one (`StoresState`),
else Keras's `"0"`, `"1"`, ... in `variables` order.
"""

from __future__ import annotations

import warnings
from typing import Protocol
from typing import runtime_checkable


@runtime_checkable
class CountsStateBytes(Protocol):
    """Says how many bytes of state it keeps per variable (the estimator's
    `optimizer_state_bytes`; Keras's optimizers are counted by their slots)."""

    def variable_state_bytes(self, shape, dtype="float32") -> int:
        """Bytes of state for a variable of `shape` and `dtype`, EMA copies
        aside."""


@runtime_checkable
class AlignsShards(Protocol):
    """Keeps blockwise state: a replica's cut of a variable falls on a
    multiple of `shard_alignment(shape)` elements (an 8-bit block), read by
    the sharding layout (`distribute`) and the estimator's per-replica
    share."""

    def shard_alignment(self, shape) -> int:
        """Elements per unit of the cut (1 for elementwise state)."""


@runtime_checkable
class CutsState(Protocol):
    """Once built on the partitions, says how each state variable is cut
    (`ShardedOptimizer`, FSDP)."""

    def shard_state(self) -> list:
        """`StateCut(variable, index, whole_shape, per_entry)` per state
        variable (`distribute/_shard_layout.py`; a plain 4-tuple in that
        order is accepted)."""


@runtime_checkable
class StoresState(Protocol):
    """Saves its whole (gathered) state with its own layout, and loads it
    into an unsharded build's shapes, re-encoded if the layout differs."""

    def state_to_store(self, store, values) -> None:
        """Writes `values` (one whole array per `variables` entry) and the
        layout into `store`."""

    def state_from_store(self, store) -> list | None:
        """Whole arrays in an unsharded build's shapes, or `None` to skip
        (with a warning)."""


@runtime_checkable
class FoldsWeightDecay(Protocol):
    """Applies the weight decay inside its own float32 step where Keras
    would decay a 16-bit weight in 16 bits (the sharded update then skips
    Keras's decay for that partition)."""

    def folds_weight_decay(self, variable) -> bool:
        """True where the decay of `variable` is part of the update."""


@runtime_checkable
class PartOfParameter(Protocol):
    """The stand-in `ShardedOptimizer` builds its inner optimizer on
    (`ParamRef`): its `shape` is the partition's, `whole_shape` the
    parameter's, from which blockwise state decides 8-bit and its blocks."""

    whole_shape: tuple


@runtime_checkable
class OffsetInParameter(Protocol):
    """The variable a sharded `update_step` receives (`ParamView`): where its
    partition starts in the whole flat parameter, so that per-element
    random bits (stochastic rounding) equal the unsharded update's."""

    element_offset: int


def shard_alignment(optimizer, shape) -> int:
    """`optimizer`'s unit of a cut for a variable of `shape` (1 for
    elementwise state)."""
    if isinstance(optimizer, AlignsShards):
        return int(optimizer.shard_alignment(tuple(shape)))
    return 1


def save_state(optimizer, store, whole) -> None:
    """Writes `optimizer`'s whole state `whole` (one array per `variables`
    entry, unsharded shapes) into a Keras saving `store`."""
    if isinstance(optimizer, StoresState):
        optimizer.state_to_store(store, whole)
        return
    for i, value in enumerate(whole):
        store[str(i)] = value


def load_state(optimizer, store, name=None) -> list | None:
    """The whole arrays saved in `store` for `optimizer.variables`, or
    `None` (with a warning) where they cannot be its state; `name` names the
    optimizer in the warning (the wrapper's, where one saves it)."""
    if isinstance(optimizer, StoresState):
        return optimizer.state_from_store(store)
    variables = optimizer.variables
    if len(store.keys()) != len(variables):
        warnings.warn(
            f"Skipping the state of optimizer {name or optimizer.name!r}: "
            f"it has {len(variables)} variables, the checkpoint has "
            f"{len(store.keys())} (a different optimizer?).",
            stacklevel=3,
        )
        return None
    return [store[str(i)] for i in range(len(variables))]


__all__ = [
    "AlignsShards",
    "CountsStateBytes",
    "CutsState",
    "FoldsWeightDecay",
    "OffsetInParameter",
    "PartOfParameter",
    "StoresState",
    "load_state",
    "save_state",
    "shard_alignment",
]
