"""How `ShardedOptimizer` cuts each variable into R partitions (pure logic).

A variable of `n` elements is flattened and cut into R contiguous parts of
`n // R` or `n // R + 1` elements (the first `n % R` replicas take one more),
so the parts are balanced to within one element. Per-replica components of a
distributed variable must share one shape, so every replica stores
`part_size = ceil(n / R)` elements: a short part is padded with zeros at
its end.
The padding costs at most `R - 1` elements per variable and slot, whatever
the variable's size. A blockwise state (8-bit codes with one scale per block)
asks for a cut in whole blocks (`align`): then the parts are balanced to
within one block, and the padding is at most one block per variable and slot.

`ParamRef` stands for one partition when the inner optimizer is built: it
has the partition's shape and the parameter's dtype, name and path, so the
inner optimizer's `build` creates partition-shaped slots with the names an
unsharded build would give them. `ParamView` is what `update_step` receives
in place of the parameter: the replica's partition as a tensor, with
`assign`, `assign_add` and `assign_sub` that replace that tensor. No
persistent copy of the parameter partition is kept (that would cost as much
as one more slot).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import tensorflow as tf


class StateCut(NamedTuple):
    """One state variable of an optimizer, as `ShardedOptimizer` cuts it.

    What an optimizer's `shard_state()` lists (docs/architecture.md,
    "Optimizer contract"), one per state variable built on the partition
    stand-ins: `variable`, the `index` of its model variable in the
    optimizer's variable list, the `whole_shape` of the unsharded state,
    and `per_entry`, the elements of the model variable each entry stands
    for (1: codes or moments, one per element; the 8-bit block size: one
    scale per block). A plain 4-tuple in this order is accepted too.
    """

    variable: object
    index: int
    whole_shape: tuple
    per_entry: int


class Layout:
    """The cut of one flattened variable of `n` elements into `replicas`.

    With `align` > 1 the cut is made in units of `align` elements (the
    blocks of an 8-bit state): every part starts on a multiple of `align`,
    the parts are balanced to within one unit, and only the last non-empty
    part may end inside a unit.
    """

    def __init__(self, shape, replicas: int, align: int = 1):
        self.shape = tuple(int(d) for d in shape)
        self.n = int(math.prod(self.shape))
        self.replicas = int(replicas)
        self.align = int(align)
        units = -(-self.n // self.align)
        base, extra = divmod(units, self.replicas)
        counts = [base + (1 if r < extra else 0) for r in range(replicas)]
        starts = [sum(counts[:r]) * self.align for r in range(replicas)]
        self.offsets = [min(s, self.n) for s in starts]
        self.sizes = [
            max(0, min(cnt * self.align, self.n - s))
            for cnt, s in zip(counts, self.offsets)
        ]
        self.part_size = max(self.sizes) if self.n else 0

    def with_shape(self, shape) -> Layout:
        """The same cut of a state of `n` elements whose whole value has
        another shape (8-bit codes are flat)."""
        out = Layout(shape, self.replicas, self.align)
        if out.n != self.n:
            raise ValueError(f"shape {shape} does not hold {self.n} elements")
        return out

    def per_unit(self, entries: int) -> Layout:
        """The cut of a state with one entry per `align` elements (an 8-bit
        state's per-block scales): each replica holds its parts' units."""
        out = Layout((entries,), self.replicas)
        if self.align <= 1 or entries != -(-self.n // self.align):
            raise ValueError(
                f"{entries} entries are not one per unit of {self.align} "
                f"of {self.n} elements"
            )
        return out

    def local(self, flat, replica: int):
        """This replica's part of the flat `[n]` tensor, padded to
        `[part_size]`."""
        start, size = self.offsets[replica], self.sizes[replica]
        part = flat[start : start + size]
        if size < self.part_size:
            part = tf.pad(part, [[0, self.part_size - size]])
        return part

    def local_numpy(self, flat, replica: int):
        import numpy as np

        start, size = self.offsets[replica], self.sizes[replica]
        out = np.zeros((self.part_size,), dtype=flat.dtype)
        out[:size] = flat[start : start + size]
        return out

    def assemble(self, blocks):
        """The whole variable from `[R, part_size]` gathered parts (tensor
        or numpy)."""
        pieces = [blocks[r, : self.sizes[r]] for r in range(self.replicas)]
        if isinstance(blocks, tf.Tensor):
            return tf.reshape(tf.concat(pieces, 0), self.shape)
        import numpy as np

        return np.concatenate(pieces).reshape(self.shape)


class ParamRef:
    """A partition-shaped stand-in for a parameter during the inner build."""

    overwrite_with_gradient = False

    def __init__(self, variable, layout: Layout, index: int, key: str):
        self.variable = variable
        self.layout = layout
        self.index = index
        self.shape = (layout.part_size,)
        # The parameter's own shape: a state that is not elementwise (8-bit
        # blocks) decides its layout from it.
        self.whole_shape = tuple(variable.shape)
        self.dtype = variable.dtype
        self.name = variable.name
        self.path = getattr(variable, "path", variable.name)
        self._unique_id = key

    def __repr__(self):
        return f"<partition of {self.path}: {self.shape}>"


class ParamView:
    """A replica's partition of a parameter, as `update_step` sees it.

    Reads give the current tensor; `assign*` replace it. Enough of a
    variable for Keras's elementwise `update_step`s: `dtype`, `shape`,
    `name`, tensor conversion and arithmetic.
    """

    overwrite_with_gradient = False

    def __init__(self, ref: ParamRef, value, element_offset: int = 0):
        self._ref = ref
        # Where this partition starts in the whole flat parameter: a
        # bfloat16 weight's stochastic rounding draws its bits per element
        # of the whole parameter, so replicas and shards round alike.
        self.element_offset = int(element_offset)
        self._unique_id = ref._unique_id
        self.name = ref.name
        self.path = ref.path
        self.dtype = tf.as_dtype(value.dtype)
        self.shape = value.shape
        self.value = value

    def read_value(self):
        return self.value

    def assign(self, value, **kwargs):
        self.value = tf.cast(tf.convert_to_tensor(value), self.dtype)
        return self.value

    def assign_add(self, value, **kwargs):
        return self.assign(self.value + tf.cast(value, self.dtype))

    def assign_sub(self, value, **kwargs):
        return self.assign(self.value - tf.cast(value, self.dtype))

    def __tf_tensor__(self, dtype=None, name=None):
        return tf.convert_to_tensor(self.value, dtype=dtype, name=name)

    def __add__(self, o):
        return self.value + o

    def __radd__(self, o):
        return o + self.value

    def __sub__(self, o):
        return self.value - o

    def __rsub__(self, o):
        return o - self.value

    def __mul__(self, o):
        return self.value * o

    def __rmul__(self, o):
        return o * self.value

    def __truediv__(self, o):
        return self.value / o

    def __rtruediv__(self, o):
        return o / self.value

    def __neg__(self):
        return -self.value

    def __pow__(self, o):
        return self.value**o


def _convert_view(value, dtype=None, name=None, as_ref=False):
    return tf.convert_to_tensor(value.value, dtype=dtype, name=name)


tf.register_tensor_conversion_function(ParamView, _convert_view)
