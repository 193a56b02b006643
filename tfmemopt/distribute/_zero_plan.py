"""What `ShardedOptimizer.build` decides: the cut of every parameter and of
the inner optimizer's state (`Plan`), and the build that makes the state.

The inner optimizer builds its slots as usual, but on `ParamRef`s (one per
parameter, shaped like this replica's partition) and under a variable
creator that makes them per-replica (`ON_READ`); an optimizer whose state is
blockwise (tfmemopt's 8-bit Adam) says where a cut may fall
(`shard_alignment`) and how each of its variables is cut (`shard_state`).
"""

from __future__ import annotations

import tensorflow as tf

from tfmemopt._compat import delete_untracked
from tfmemopt._compat import set_untracked
from tfmemopt._protocols import CutsState
from tfmemopt._protocols import shard_alignment
from tfmemopt.distribute._shard_layout import Layout
from tfmemopt.distribute._shard_layout import ParamRef
from tfmemopt.distribute._shard_layout import StateCut


def _on_read(next_creator, **kwargs):
    kwargs["synchronization"] = tf.VariableSynchronization.ON_READ
    return next_creator(**kwargs)


class Plan:
    """What `build` decided: the cut of each parameter and the state."""

    def __init__(self, replicas, params, refs, partitioned, replicated):
        self.replicas = replicas
        self.params = params
        self.refs = refs
        self.partitioned = partitioned
        self.replicated = replicated
        self.slot_of = {id(v): (v, layout) for v, layout in partitioned}
        self.strategy = None


def build_sharded(inner, params, replicas):
    # An inner optimizer whose state is not elementwise but blockwise
    # (tfmemopt's 8-bit Adam) says where a cut may fall (`shard_alignment`)
    # and, once built, how each state variable is cut (`shard_state`).
    refs = [
        ParamRef(
            v,
            Layout(v.shape, replicas, shard_alignment(inner, v.shape)),
            i,
            f"tfmemopt_shard_{i}",
        )
        for i, v in enumerate(params)
    ]
    made = {}

    def from_reference(reference_variable, name=None, initializer="zeros"):
        ref = reference_variable
        if not isinstance(ref, ParamRef):
            raise ValueError(
                f"ShardedOptimizer cannot partition {type(inner).__name__}: "
                "its build asked for a slot shaped like something other than "
                f"a parameter ({ref!r})."
            )
        var = inner.add_variable(
            shape=ref.shape,
            initializer=initializer,
            dtype=ref.dtype,
            name=f"{ref.path.replace('/', '_')}_{name or 'var'}",
        )
        made[id(var)] = (var, ref.layout)
        return var

    before = {id(v) for v in inner.variables}
    set_untracked(inner, "add_variable_from_reference", from_reference)
    try:
        with tf.variable_creator_scope(_on_read):
            inner.build(refs)
    finally:
        delete_untracked(inner, "add_variable_from_reference")
    if isinstance(inner, CutsState):
        made.update(_described_state(inner, refs))
    partitioned, replicated = [], []
    for v in inner.variables:
        if id(v) in made:
            partitioned.append(made[id(v)])
        elif id(v) not in before:
            if len(v.shape) != 0:
                raise ValueError(
                    f"ShardedOptimizer cannot partition {type(inner).__name__}"
                    f": its build creates {v.path!r} of shape {v.shape}, not "
                    "a slot shaped like a parameter. Leave it unwrapped."
                )
            replicated.append(v)
    return Plan(replicas, params, refs, partitioned, replicated)


def _described_state(inner, refs):
    """`{id: (variable, Layout)}` for the state `inner.shard_state()` lists:
    entries per element are cut like their parameter, entries per block
    (scales) into each replica's blocks."""
    out = {}
    for item in inner.shard_state():
        var, index, shape, per_entry = StateCut(*item)
        layout = refs[index].layout
        if per_entry == 1:
            cut = layout.with_shape(shape)
        elif per_entry == layout.align:
            cut = layout.per_unit(int(shape[0]))
        else:
            raise ValueError(
                f"ShardedOptimizer cannot partition {type(inner).__name__}: "
                f"{var.path!r} has one entry per {per_entry} elements, but "
                f"the cut of its variable is aligned to {layout.align}."
            )
        if tuple(var.shape) != (cut.part_size,):
            raise ValueError(
                f"ShardedOptimizer cannot partition {type(inner).__name__}: "
                f"its build made {var.path!r} of shape {tuple(var.shape)} "
                f"for a partition that holds {cut.part_size} entries."
            )
        out[id(var)] = (var, cut)
    return out
