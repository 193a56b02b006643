"""The accumulators of one window (`_window._Window`'s base): their
structure, fixed by the first micro-batch, and each micro-batch's
gradients packed into them.

Dense gradients are summed in float32 loop variables. Gradients that
Keras receives as `tf.IndexedSlices` (embedding lookups) stay sparse:
their rows are collected and concatenated, so that the optimizer sees the
same rows as for the whole batch (Keras's Adam squares the rows of a
sparse gradient before duplicates are summed, so densifying would change
the update). This holds under XLA too: the loop's rows go through
TensorArrays of fixed element shape. Rows whose indices do not come from
the batch (position embeddings) are the same in every micro-batch and
appear once in the full batch's gradient: their values are summed like a
dense gradient ("shared", see _sparse_rows).
"""

from __future__ import annotations

import collections

import tensorflow as tf

from tfmemopt.accumulation._sparse_rows import reads_batch

# What the first trace of a micro-step revealed (static structure):
# `dynamic` holds the indices of the masked loss terms.
_Spec = collections.namedtuple("_Spec", "dynamic has_static generic")


def _as_dense_f32(grad):
    if isinstance(grad, tf.IndexedSlices):
        grad = tf.convert_to_tensor(grad)
    return tf.cast(grad, tf.float32)


class WindowAccumulators:
    """The accumulators' structure and packing; `_window._Window` runs the
    micro-batches and the update."""

    def _first(self, out):
        kinds = []
        self.shared_indices = {}
        for j, v in enumerate(self.variables):
            grads = [g[j] for g in out["grads"] if g[j] is not None]
            if not grads:
                kinds.append(None)
            elif all(isinstance(g, tf.IndexedSlices) for g in grads):
                kinds.append(self._sparse_kind(j, grads, out))
            else:
                kinds.append("dense")
        self.spec = _Spec(
            out["dynamic_idx"],
            out["static"] is not None,
            out["generic"],
        )
        self.kinds = kinds
        return self._pack(out)

    def _sparse_kind(self, j, grads, out):
        """`"shared"` when every group's rows are the same batch-free rows."""
        shape = grads[0].values.shape
        if (
            len(grads) != len(out["grads"])
            or not shape.is_fully_defined()
            or any(g.values.shape != shape for g in grads)
            or any(reads_batch(g.indices, out["x"]) is not False for g in grads)
        ):
            return "sparse"
        self.shared_indices[j] = tf.cast(grads[0].indices, tf.int32)
        return "shared"

    def _shared_values(self, g, j):
        expected = self.shared_indices[j].shape + self.variables[j].shape[1:]
        if g is None or g.values.shape != expected:
            raise ValueError(
                "The sparse gradient of variable "
                f"{self.variables[j].path!r} has rows of shape "
                f"{None if g is None else g.values.shape} in one micro-batch "
                f"and {expected} in the first, although its indices do not "
                "come from the batch. tfmemopt cannot accumulate it exactly: "
                "please report this model at tfmemopt's issue tracker."
            )
        return tf.cast(g.values, tf.float32)

    def _pack(self, out):
        """Micro-step output -> (dense accumulators, sparse rows)."""
        dense, rows = [], []
        for group in out["grads"]:
            dense_g, rows_g = [], []
            for j, (g, v, kind) in enumerate(
                zip(group, self.variables, self.kinds)
            ):
                if kind == "shared":
                    dense_g.append(self._shared_values(g, j))
                elif kind == "dense":
                    dense_g.append(
                        _as_dense_f32(g)
                        if g is not None
                        else tf.zeros_like(v, tf.float32)
                    )
                elif kind == "sparse":
                    if g is None:
                        g = tf.IndexedSlices(
                            tf.zeros((0,) + tuple(v.shape[1:]), tf.float32),
                            tf.zeros((0,), tf.int32),
                        )
                    rows_g.append(
                        (
                            tf.cast(g.values, tf.float32),
                            tf.cast(g.indices, tf.int32),
                        )
                    )
            dense.append(dense_g)
            rows.append(rows_g)
        zero = tf.zeros((), tf.float32)
        static = out["static"] if out["static"] is not None else zero
        acc = {
            "grads": dense,
            "static": tf.cast(static, tf.float32),
            "dyn_num": [tf.cast(s, tf.float32) for s in out["dyn_num"]],
            "dyn_norm": [tf.cast(d, tf.float32) for d in out["dyn_norm"]],
            "terms": [tf.cast(t, tf.float32) for t in out["terms"]],
        }
        return acc, rows

    def _empty_rows(self):
        return [
            [
                (
                    tf.zeros((0,) + tuple(v.shape[1:]), tf.float32),
                    tf.zeros((0,), tf.int32),
                )
                for v, kind in zip(self.variables, self.kinds)
                if kind == "sparse"
            ]
            for _ in self._groups()
        ]

    def _groups(self):
        return range(int(self.spec.has_static) + len(self.spec.dynamic))

    def _concat_rows(self, pieces):
        """[piece][group][var] (values, indices) -> [group][var] slices."""
        out = []
        for g in self._groups():
            out_g = []
            for k in range(len(pieces[0][g])):
                values = tf.concat([p[g][k][0] for p in pieces], axis=0)
                indices = tf.concat([p[g][k][1] for p in pieces], axis=0)
                out_g.append((values, indices))
            out.append(out_g)
        return out
