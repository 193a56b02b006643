"""The optimizer `tfmemopt.Model.compile` takes: wrapped in Keras's
`LossScaleOptimizer` where the layers compute in float16, and refused
when it accumulates gradients itself (Keras's own accumulation)."""

from __future__ import annotations

import keras

from tfmemopt._compat import sublayers


def inner_optimizer(optimizer):
    """The optimizer under Keras's LossScaleOptimizer, if any."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def refuse_keras_accumulation(model) -> None:
    """Refuses an optimizer with Keras's `gradient_accumulation_steps`:
    the window would be accumulated twice."""
    inner = inner_optimizer(model.optimizer)
    steps = getattr(inner, "gradient_accumulation_steps", None)
    if steps:
        raise ValueError(
            "The optimizer has Keras's own gradient accumulation "
            f"(gradient_accumulation_steps={steps}) and this "
            "tfmemopt.Model accumulates too "
            f"(accumulation_steps={model._accumulation_steps}, "
            f"micro_batch_size={model._micro_batch_size}): the window "
            "would be accumulated twice. Remove "
            "`gradient_accumulation_steps` from the optimizer; "
            "tfmemopt.Model already gives the full-batch update."
        )


def loss_scaled(model, optimizer):
    """`optimizer` in a `LossScaleOptimizer` when `model` computes in float16.

    Keras wraps the optimizer only when the *model's* own policy is
    `mixed_float16`. A model rebuilt by `load_model` under a float32 global
    policy has float16 layers but a float32 policy of its own, so its saved
    compile arguments (the bare optimizer) came back unwrapped, and the
    optimizer state saved with the loss scale (two variables more) was
    skipped whole: Adam's moments and step count reset on resume. Deciding
    by the layers keeps a saved mixed_float16 model's optimizer as it was.
    """
    if optimizer is None or model.dtype_policy.name == "mixed_float16":
        return optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    if not any(
        layer.dtype_policy.name == "mixed_float16" for layer in sublayers(model)
    ):
        return optimizer
    return keras.optimizers.LossScaleOptimizer(keras.optimizers.get(optimizer))
