"""A sharded model's optimizer state as whole tensors (`shard_parameters`).

The user's optimizer is built on the shards (`_fsdp.py`), so each of
its slots holds one part per replica. Saved, it writes what an unsharded
build holds: one whole array per variable, in the same order and shapes
(tfmemopt's 8-bit optimizers add their layout), so a checkpoint loads at
another replica count, with no strategy, or without sharding; loaded, each
replica keeps its part.
"""

from __future__ import annotations

import weakref

import numpy as np
import tensorflow as tf

from tfmemopt._compat import delete_untracked
from tfmemopt._compat import set_untracked
from tfmemopt._protocols import CutsState
from tfmemopt._protocols import load_state
from tfmemopt._protocols import save_state
from tfmemopt.distribute._shard_state import read_whole
from tfmemopt.distribute._zero_plan import _described_state


def build_whole_state(optimizer, inner, shard_set) -> None:
    """Builds `optimizer` on the shards and makes it save and load its
    state as an unsharded build's (whole tensors, same order and shapes).

    Slots made from a shard (`add_variable_from_reference`) are cut like
    it; an optimizer with blockwise state lists its cut (`shard_state`,
    tfmemopt's 8-bit optimizers); the rest (step count, learning rate,
    loss scale) is the same on every replica.
    """
    index_of = {id(s): i for i, s in enumerate(shard_set.shards)}
    layouts = [w._value.layout for w in shard_set.originals]
    made = {}
    from_reference = inner.add_variable_from_reference

    def recording(reference_variable, name=None, initializer="zeros"):
        var = from_reference(
            reference_variable, name=name, initializer=initializer
        )
        i = index_of.get(id(reference_variable))
        if i is not None:
            whole = tuple(shard_set.originals[i].shape)
            made[id(var)] = (var, layouts[i].with_shape(whole))
        return var

    set_untracked(inner, "add_variable_from_reference", recording)
    try:
        optimizer.build(shard_set.shards)
    finally:
        delete_untracked(inner, "add_variable_from_reference")
    if isinstance(inner, CutsState):
        made.update(
            _described_state(inner, [w._value for w in shard_set.originals])
        )
    state = WholeState(optimizer, inner, shard_set.strategy, made)
    set_untracked(optimizer, "save_own_variables", state.save)
    set_untracked(optimizer, "load_own_variables", state.load)
    shard_set.state = state
    # A wrapper (`LossScaleOptimizer`) lists its inner optimizer's
    # variables among its own, and Keras saves and loads the inner one
    # again as its child (`inner_optimizer/vars`): that copy is written
    # whole too (an unsharded model reads it), and not read back, since the
    # wrapper's own load has restored every replica's part. Read back, the
    # first replica's parts (what files written before 0.1.0.dev0's fix
    # hold there) were written into every replica's.
    level = optimizer
    while level is not inner:
        level = level.inner_optimizer
        child = WholeState(level, inner, shard_set.strategy, made)
        set_untracked(level, "save_own_variables", child.save)
        set_untracked(level, "load_own_variables", _restored_by_wrapper)
    # Built on the shards: building again would add a second set of a
    # wrapper's own variables (Keras's `LossScaleOptimizer.build` does not
    # check `built`), and its state then no longer matches a checkpoint's.
    # docs/sharding.md says to call `build` before `load_weights`.
    set_untracked(optimizer, "build", _built_on_the_shards)


def _restored_by_wrapper(store) -> None:
    """An inner optimizer's `load_own_variables`: its wrapper's restores it."""
    del store


def _built_on_the_shards(var_list) -> None:
    """`build` of an optimizer `shard_parameters` built: nothing to do."""
    del var_list


class WholeState:
    """Saves and loads a sharded optimizer's state as whole tensors."""

    def __init__(self, optimizer, inner, strategy, partitioned):
        self.optimizer = optimizer
        self.inner = inner
        self.strategy = strategy
        self.partitioned = partitioned  # {id(variable): (variable, Layout)}

    def whole_values(self) -> list:
        """One whole numpy array per `optimizer.variables` entry."""
        cut = [
            self.partitioned[id(v)]
            for v in self.optimizer.variables
            if id(v) in self.partitioned
        ]
        local = [components(v) for v, _ in cut]
        if all(
            len(parts) == self.strategy.num_replicas_in_sync for parts in local
        ):
            whole = [
                layout.assemble(np.stack([np.asarray(p) for p in parts]))
                for (_, layout), parts in zip(cut, local)
            ]
        else:  # multi-worker: a collective every worker joins
            whole, _ = read_whole(self.strategy, cut, [])
        values = {id(v): w for (v, _), w in zip(cut, whole)}
        return [
            values[id(v)] if id(v) in values else np.asarray(v.numpy())
            for v in self.optimizer.variables
        ]

    def save(self, store):
        whole = self.whole_values()
        save_state(self.optimizer, store, whole)

    def load(self, store):
        variables = self.optimizer.variables
        whole = load_state(self.optimizer, store)
        if whole is None:
            return
        for v, value in zip(variables, whole):
            if id(v) not in self.partitioned:
                v.assign(value)
                continue
            _, layout = self.partitioned[id(v)]
            flat = np.reshape(np.asarray(value), [-1])
            write_parts(
                components(v), layout, flat, local_replica_ids(self.strategy)
            )


def write_parts(parts, layout, flat, replica_ids=None) -> None:
    """Writes each replica's part of the whole `flat` into its component.

    `parts` are the local components; `replica_ids` their replicas' global
    indices (`local_replica_ids`: under a multi-worker strategy a worker
    holds only its own replicas' components, so worker 1's first component
    is not replica 0's). The padding after a short part keeps what the
    component holds: zeros for weights and elementwise slots, and for 8-bit
    codes the code of zero their build wrote (a literal 0 code decodes to
    minus the block's maximum).
    """
    if replica_ids is None:
        replica_ids = range(len(parts))
    replica_ids = list(replica_ids)
    if len(replica_ids) != len(parts):
        raise ValueError(
            f"{len(parts)} local components but {len(replica_ids)} replica "
            "indices."
        )
    for r, part in zip(replica_ids, parts):
        current = np.asarray(part.numpy())
        start, size = layout.offsets[r], layout.sizes[r]
        current[:size] = flat[start : start + size].astype(current.dtype)
        part.assign(current)


_REPLICA_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def local_replica_ids(strategy) -> list:
    """The global index (`replica_id_in_sync_group`) of each of this
    worker's replicas, in the order of a distributed variable's local
    components. All replicas are local to one machine's strategy; under a
    multi-worker strategy they are asked once (no collective)."""
    ids = _REPLICA_IDS.get(strategy)
    if ids is not None:
        return ids
    local = strategy.extended.worker_devices
    if len(local) == strategy.num_replicas_in_sync:
        ids = list(range(len(local)))
    else:

        def replica_id():
            ctx = tf.distribute.get_replica_context()
            return tf.constant(ctx.replica_id_in_sync_group)

        with strategy.scope():
            out = strategy.run(replica_id)
        ids = [int(t) for t in strategy.experimental_local_results(out)]
    _REPLICA_IDS[strategy] = ids
    return ids


def components(variable) -> list:
    """The per-device components of a distributed `keras.Variable` (all of
    them here, whatever the current context; the local ones multi-worker)."""
    from tfmemopt import _compat

    # The stored variable: `variable.value` is cast to float16 inside a
    # mixed-precision layer's call.
    value = _compat.storage(variable)
    return list(getattr(value, "values", (value,)))
