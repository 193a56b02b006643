"""The one module that reads Keras's private layer attributes.

Keras 3 has no public API to list the layers tracked inside a layer (only
models have `.layers`, and it is not recursive), to name its `Functional`
class, or to say whether a layer's `call` takes `training` / `mask`. These
helpers do it, each through one private attribute named in its docstring.
`caller_instance` is the one place that reads the call stack: Keras offers
no hook that tells an optimizer which `LossScaleOptimizer` wraps it, or
which model builds it.
tests/test_compat.py checks every private attribute tfmemopt reads on the
installed Keras, so a release that renames one fails there, by name.
"""

from __future__ import annotations

import sys

import keras


def sublayers(
    layer, recursive: bool = True, include_self: bool = False
) -> list:
    """The layers tracked inside `layer` (Keras's `_flatten_layers`).

    Depth first, each once; `recursive=False` gives the direct children.
    Anything without sub-layer tracking (a `keras.Operation` that is not a
    layer) has none.
    """
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is None:
        return [layer] if include_self else []
    return list(flatten(include_self=include_self, recursive=recursive))


def functional_class() -> type:
    """Keras's `Functional` class, found without importing `keras.src`."""
    for subclass in keras.Model.__subclasses__():
        if subclass.__name__ == "Functional":
            return subclass
    inputs = keras.Input((1,))
    return type(keras.Model(inputs, keras.layers.Identity()(inputs)))


def call_takes(layer, argument: str) -> bool:
    """Whether `layer.call` takes `argument` (`"training"` or `"mask"`).

    Keras records it when the layer is made (`_call_has_training_arg`,
    `_call_has_mask_arg`); a layer that did not record it is assumed to
    take `training` and not `mask`, as Keras's own call wrapper does.
    """
    attribute = {
        "training": "_call_has_training_arg",
        "mask": "_call_has_mask_arg",
    }
    return bool(getattr(layer, attribute[argument], argument == "training"))


def caller_instance(kind: type, depth: int = 1, skip: int = 0):
    """The first `self` of type `kind` among the functions up the stack.

    Looks at the `depth` functions above the one calling this (after
    skipping `skip` more), nearest first; None if none is a `kind`. Used
    where Keras calls tfmemopt without saying who calls: a
    `LossScaleOptimizer` wrapping an `AccumulatingOptimizer` (it sets
    `loss_scale_factor` from its `__init__`), and the model whose
    `jit_compile` decides whether building the optimizer is refused.
    CPython frames (`sys._getframe`).

    Why the stack (Keras 3.15, TF 2.21; looked for in #15):
    `LossScaleOptimizer.__init__` does `self.inner_optimizer = inner` (the
    trackable link goes from the wrapper down; the inner object is not told)
    and then `inner.loss_scale_factor = None`, the one thing it does to its
    inner optimizer, without saying who; its `build` and `apply` call the
    inner's without an argument naming it, and its non-finite branch never
    reaches the inner optimizer, so `AccumulatingOptimizer` cannot learn of
    it lazily either. A user may wrap it by hand in a custom loop (no model,
    no `compile`), so a hook in `tfmemopt.Model.compile` would miss cases
    the tests cover. Likewise `Trainer._symbolic_build`/`train_step` call
    `optimizer.build`/`apply` without the model, and a traced function
    does not say publicly that it is XLA-compiled. The other ways, each
    worse: `gc.get_referrers` (a heap scan, also interpreter
    introspection), or patching `LossScaleOptimizer`/`keras.Model` for
    every user of Keras.
    """
    frame = sys._getframe(2 + skip)
    for _ in range(depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, kind):
            return candidate
        frame = frame.f_back
    return None
