"""The compiled metrics in the traced step, as Keras's step computes them.

Keras's `train_step` (and `tfmemopt.Model`'s micro-step) updates the
compiled metrics from the model's output after the gradient: the output
stays alive through the backward pass, and a metric's own temporaries are
output-sized (Keras's TensorFlow `argmax` makes five, for its fix of
flush-to-zero). On a language model's logits that nearly doubled a step:
keras-hub Llama, 2 layers of 128, vocabulary 32000, 1 x 1024 tokens,
measured 671.9 MiB with keras-hub's default `SparseCategoricalAccuracy`
and 374.4 without (weights and AdamW state in).

The step is traced with fresh copies of the metrics (made before the
trace, so their variables are not the model's and nothing the user
compiled changes); their updates are stateful, so the simulated step runs
them, where TensorFlow's executor would.
"""

from __future__ import annotations

import keras

from tfmemopt._compat import compiled_metrics

# Keras's names that it resolves by the shapes (CompileMetrics.get_metric).
_BY_SHAPE = {
    "accuracy": (
        "binary_accuracy",
        "sparse_categorical_accuracy",
        "categorical_accuracy",
    ),
    "acc": (
        "binary_accuracy",
        "sparse_categorical_accuracy",
        "categorical_accuracy",
    ),
    "crossentropy": (
        "binary_crossentropy",
        "sparse_categorical_crossentropy",
        "categorical_crossentropy",
    ),
    "ce": (
        "binary_crossentropy",
        "sparse_categorical_crossentropy",
        "categorical_crossentropy",
    ),
}


def has_metrics(model) -> bool:
    """Whether `model`'s step updates compiled metrics."""
    return any(compiled_metrics(model).values())


def metric_updates(model, output_shapes, target_shapes, notes=None):
    """`[(output index, fresh metric)]` for the metrics `model`'s step
    computes; `[]` where it computes none. Shapes are per output, without
    the batch. A metric that cannot be copied is named in `notes`."""
    config = compiled_metrics(model)
    names = list(getattr(model, "output_names", None) or [])
    out = []
    for key in ("metrics", "weighted_metrics"):
        for index, item in _per_output(config.get(key), names, output_shapes):
            metric = _fresh(
                item, output_shapes[index], target_shapes[index], notes
            )
            if metric is not None:
                out.append((index, metric))
    return out


def _per_output(config, names, output_shapes):
    """`(output index, one metric's config)` pairs: a dict by output name,
    a list per output, or one list for every output, as Keras takes them."""
    n = len(output_shapes)
    if not config:
        return []
    if isinstance(config, dict) and "class_name" not in config:
        pairs = []
        for name, items in config.items():
            if name in names:
                pairs += [(names.index(name), m) for m in _listed(items)]
        return pairs
    items = _listed(config)
    if (
        n > 1
        and len(items) == n
        and all(isinstance(m, (list, tuple)) or m is None for m in items)
    ):
        return [(i, m) for i, ms in enumerate(items) for m in _listed(ms)]
    return [(i, m) for i in range(n) for m in items]


def _listed(items) -> list:
    if items is None:
        return []
    if isinstance(items, (list, tuple)):
        return [m for m in items if m is not None]
    return [items]


def _fresh(item, output_shape, target_shape, notes):
    try:
        if isinstance(item, str):
            item = _by_shape(item.lower(), output_shape, target_shape) or item
            made = keras.metrics.get(item)
        else:
            made = keras.saving.deserialize_keras_object(item)
        if not isinstance(made, keras.metrics.Metric):
            made = keras.metrics.MeanMetricWrapper(made)
        return made
    except Exception as e:  # noqa: BLE001 - a metric the trace cannot copy
        if notes is not None:
            notes.append(
                f"compiled metric {item!r} not traced ({type(e).__name__}: "
                f"{e}); its memory is not in the estimate"
            )
        return None


def _by_shape(name, output_shape, target_shape):
    choices = _BY_SHAPE.get(name)
    if choices is None:
        return None
    binary, sparse, dense = choices
    if output_shape and output_shape[-1] == 1:
        return binary
    if target_shape is not None and len(target_shape) < len(output_shape):
        return sparse
    if target_shape and target_shape[-1] == 1 and output_shape[-1] != 1:
        return sparse
    return dense
