"""Builds an unbuilt model from the data `fit` is given.

The options `tfmemopt.Model` applies once the model is built
(`checkpointing=`, `chunked_loss=` / `attention=`) were never applied to a
subclassed model that `fit` built itself: Keras builds it while tracing
the first step, after the options are looked at, and the model trained
without them and without a word (`checkpointing="auto"` on a model of
blocks: no segment, the plain step's memory). The model is called here
symbolically on inputs shaped like the data (no step runs, no data is
read: an array's shape, a dataset's `element_spec`).
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import tensorflow as tf


def _spec_of(x):
    """A `tf.TensorSpec` with an unknown batch, or `None`."""
    if isinstance(x, (np.ndarray, tf.Tensor)) or hasattr(x, "__array__"):
        shape = tuple(np.shape(x))
        dtype = tf.as_dtype(getattr(x, "dtype", np.asarray(x).dtype))
        return tf.TensorSpec((None,) + shape[1:], dtype) if shape else None
    if isinstance(x, tf.TensorSpec):
        return x
    return None


def _input_specs(x):
    """The model inputs' specs from `fit`'s `x`, or `None` (a generator,
    a `PyDataset`: nothing to read without consuming data)."""
    if isinstance(x, tf.data.Dataset):
        spec = x.element_spec
        if isinstance(spec, tuple):
            spec = spec[0]  # (x, y[, sample_weight])
        x = spec
    if isinstance(x, (list, tuple, dict)):
        specs = keras.tree.map_structure(_spec_of, x)
        if any(s is None for s in keras.tree.flatten(specs)):
            return None
        return specs
    return _spec_of(x)


def build_from_data(model, x) -> bool:
    """Calls `model` on symbolic inputs shaped like `x`; whether it is
    built afterwards."""
    specs = _input_specs(x)
    if specs is None:
        return False
    inputs = keras.tree.map_structure(
        lambda s: keras.Input(shape=tuple(s.shape[1:]), dtype=s.dtype.name),
        specs,
    )
    try:
        model(inputs)
    except Exception:  # noqa: BLE001 - the caller warns
        return False
    return model.built


def build_for_options(model, x) -> None:
    """Builds an unbuilt `tfmemopt.Model` from `fit`'s `x` when options
    wait for it to be built; warns where it cannot."""
    waiting = model._checkpointing_policy is not None or any(
        model._long_sequences
    )
    if model.built or not waiting:
        return
    if not build_from_data(model, x):
        warnings.warn(
            f"{type(model).__name__} is not built and could not be "
            "built from the data given to fit, so checkpointing= / "
            "chunked_loss= / attention= are not applied to it. Build "
            "it first: call it on a batch, or model.build(shape).",
            stacklevel=3,
        )
