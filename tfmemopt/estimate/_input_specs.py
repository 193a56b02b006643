"""The inputs of a traced training step: TensorSpecs for the model's inputs,
its targets and its loss at a batch size.

Shapes come from the model (`model.inputs`, or the shapes a subclassed
model was built with), from `input_shape=` where the user gives them, and
`sequence_length=` for variable-length dimensions (keras-hub text models);
a dimension that none of these fixes is a ValueError that says how.
"""

from __future__ import annotations

import keras
import tensorflow as tf


def _as_call_arg(x):
    """The specs `input_specs` gives, as the model's call takes them."""
    if isinstance(x, dict):
        return x
    return x[0] if len(x) == 1 else x


def input_specs(model, batch_size: int, input_shape=None, sequence_length=None):
    """TensorSpecs for the model's inputs at `batch_size`, or ValueError.

    A list, or a dict for a model whose inputs are a dict (keras-hub's
    `{"token_ids": ..., "padding_mask": ...}`): a list would be matched to
    the dict's keys in sorted order, not in the order of `model.inputs`.
    `input_shape` and `sequence_length` are `estimate_memory`'s.
    """
    inputs = None
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        inputs = None
    inner = getattr(model, "inner", None)
    if not inputs and isinstance(inner, keras.Model) and inner is not model:
        # `tfmemopt.Model.wrap(model)`: built when the wrapped model is,
        # with no inputs or build shapes of its own.
        return input_specs(inner, batch_size, input_shape, sequence_length)
    keys = None
    if inputs:
        shapes = [(tuple(i.shape), i.dtype) for i in inputs]
        try:
            structure = model.input
        except (AttributeError, ValueError):
            structure = None
        if isinstance(structure, dict):
            by_id = {id(t): k for k, t in structure.items()}
            keys = [by_id.get(id(i)) for i in inputs]
            if None in keys:
                keys = None
        if input_shape is not None:
            names = keys or [getattr(i, "name", None) for i in inputs]
            shapes = _given_shapes(input_shape, shapes, names, model.name)
    else:
        shapes = None
        build = getattr(model, "_build_shapes_dict", None)
        if model.built and build and len(build) == 1:
            shape = next(iter(build.values()))
            if isinstance(shape, dict) and all(
                isinstance(v, (list, tuple)) for v in shape.values()
            ):
                keys = list(shape)
                shapes = [(tuple(shape[k]), "float32") for k in keys]
            elif shape is not None and not isinstance(shape, dict):
                shapes = [(tuple(shape), "float32")]
        if shapes is None and input_shape is not None:
            shapes, keys = _shapes_without_model(input_shape)
        if shapes is None:
            raise ValueError(
                f"Cannot estimate the memory of model {model.name!r}: it is "
                "not built and has no known input shape. Fix: pass "
                "`input_shape=` (one sample's shape, e.g. `(32,)`), build it "
                "first, e.g. `model.build((None, 32))`, call it once on a "
                "batch, or start it with `keras.Input(shape=...)`."
            )
    specs = []
    for shape, dtype in shapes:
        if sequence_length is not None:
            shape = shape[:1] + tuple(
                sequence_length if d is None else d for d in shape[1:]
            )
        if any(d is None for d in shape[1:]):
            raise ValueError(
                f"Model {model.name!r} has an input of shape {shape} with an "
                "unknown dimension besides the batch (a variable-length "
                "input); the estimator needs every other dimension. Fix: "
                "pass `sequence_length=128` (fills every unknown dimension) "
                "or `input_shape=(128,)` (one sample's shape; a list or a "
                "dict for several inputs) to estimate_memory/plan, or "
                "--seq-len / --input-shape to the tfmemopt command."
            )
        specs.append(tf.TensorSpec((batch_size,) + tuple(shape[1:]), dtype))
    if keys is not None:
        return dict(zip(keys, specs))
    return specs


def _one_shape(value, what) -> tuple | None:
    """`value` as one sample's shape (a tuple of ints), or None when it is
    not a flat sequence (a list of shapes)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (tuple, list, tf.TensorShape)):
        raise TypeError(
            f"`input_shape` must be one sample's shape (a tuple of ints, "
            f"without the batch), a list of them or a dict of them. "
            f"Received: {what}={value!r} (of type {type(value).__name__})."
        )
    value = tuple(value)
    if all(
        d is None or (isinstance(d, int) and not isinstance(d, bool) and d > 0)
        for d in value
    ):
        return value
    if value and all(isinstance(d, (tuple, list)) for d in value):
        return None
    raise ValueError(
        f"`input_shape` must hold positive ints (one sample's shape, without "
        f"the batch). Received: {what}={value!r}."
    )


def _shapes_without_model(input_shape):
    """`(shapes, keys)` from `input_shape` alone (an unbuilt model: float32
    inputs of those shapes)."""
    if isinstance(input_shape, dict):
        keys = list(input_shape)
        shapes = [
            (
                (None,) + _one_shape(input_shape[k], f"input_shape[{k!r}]"),
                "float32",
            )
            for k in keys
        ]
        return shapes, keys
    one = _one_shape(input_shape, "input_shape")
    if one is not None:
        return [((None,) + one, "float32")], None
    return [
        ((None,) + _one_shape(v, "input_shape[i]"), "float32")
        for v in input_shape
    ], None


def _given_shapes(input_shape, shapes, names, model_name):
    """The model's `(shape, dtype)` per input with `input_shape` put in:
    one shape (a one-input model), a list (one per input, in order) or a
    dict by input name (or dict key). Known dimensions must agree."""
    n = len(shapes)
    if isinstance(input_shape, dict):
        unknown = [k for k in input_shape if k not in names]
        if unknown:
            raise ValueError(
                f"`input_shape` names inputs {unknown} that model "
                f"{model_name!r} does not have. Its inputs: {names}."
            )
        given = [input_shape.get(k) for k in names]
    else:
        one = _one_shape(input_shape, "input_shape")
        given = [one] if one is not None else list(input_shape)
        if len(given) != n:
            raise ValueError(
                f"Model {model_name!r} has {n} inputs ({names}); "
                f"`input_shape` gives {len(given)}. Fix: pass a list of {n} "
                "shapes, a dict by input name, or `sequence_length=` to fill "
                "every unknown dimension."
            )
    out = []
    for (shape, dtype), new, name in zip(shapes, given, names):
        if new is None:
            out.append((shape, dtype))
            continue
        new = _one_shape(new, f"input_shape for {name!r}") or ()
        old = tuple(shape[1:])
        if len(new) != len(old) or any(
            a is not None and b is not None and a != b for a, b in zip(old, new)
        ):
            raise ValueError(
                f"`input_shape` {new} does not match input {name!r} of "
                f"model {model_name!r}, of shape {old} (None: any size). "
                "Pass one sample's shape, without the batch dimension."
            )
        out.append(((shape[0],) + new, dtype))
    return out


def _output_shapes(model, in_specs):
    try:
        outputs = model.outputs
    except (AttributeError, ValueError):
        outputs = None
    if outputs and all(
        d is not None for o in outputs for d in tuple(o.shape)[1:]
    ):
        return [tuple(o.shape[1:]) for o in outputs]
    # Subclassed model, or outputs as long as a variable-length input:
    # trace the forward pass once to learn their shapes at these inputs.
    forward = tf.function(
        lambda x: model(_as_call_arg(x), training=False)
    ).get_concrete_function(in_specs)
    return [
        tuple(t.shape[1:]) for t in tf.nest.flatten(forward.structured_outputs)
    ]


def _loss_and_target_specs(
    model, batch_size, in_specs, loss=None, output_shapes=None
):
    # `loss`: the caller's (`_step_trace` falls back to the owner's and the
    # model's compiled loss); mean squared error without one.
    try:
        loss_fn = keras.losses.get(loss) if loss is not None else None
    except (ValueError, TypeError):
        loss_fn = None
    if not callable(loss_fn):
        loss_fn = keras.losses.MeanSquaredError()
    name = getattr(loss_fn, "name", None) or getattr(loss_fn, "__name__", "")
    sparse = "sparse" in str(name).lower()
    specs = []
    if output_shapes is None:
        output_shapes = _output_shapes(model, in_specs)
    for out_shape in output_shapes:
        shape = (batch_size,) + out_shape
        if sparse:
            specs.append(tf.TensorSpec(shape[:-1], "int32"))
        else:
            specs.append(tf.TensorSpec(shape, "float32"))
    return loss_fn, specs
