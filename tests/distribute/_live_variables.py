"""`Made`: the bytes of the variables made inside it that are still alive,
by device (imported by the sharding tests' subprocess scripts)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import tensorflow as tf


class Made:
    """Every variable created inside (weak references): the bytes of the
    local components of those still alive, by device, count everything
    the model, its optimizer and the implementation keep (a leaked whole
    weight would count)."""

    def __init__(self):
        self.refs = []

    def __enter__(self):
        def creator(next_creator, **kwargs):
            v = next_creator(**kwargs)
            self.refs.append(weakref.ref(v))
            return v

        self.scope = tf.variable_creator_scope(creator)
        self.scope.__enter__()
        return self

    def __exit__(self, *args):
        self.scope.__exit__(*args)

    def live_bytes(self):
        gc.collect()
        out = {}
        for ref in self.refs:
            v = ref()
            for c in getattr(v, "values", [v]) if v is not None else []:
                d = c.device[c.device.find("device:") :]
                out[d] = out.get(d, 0) + int(np.prod(c.shape)) * c.dtype.size
        return out
