"""`CheckpointBlock`: a Keras layer whose inner activations are recomputed."""

from __future__ import annotations

import inspect
from typing import Sequence

import keras
import tensorflow as tf

from tfmemopt.checkpointing._recompute import checkpoint_call
from tfmemopt.checkpointing._safety import check_replayable


def _accepts(layer, name: str) -> bool:
    params = inspect.signature(layer.call).parameters
    return name in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


def _is_shape(x) -> bool:
    return isinstance(x, (list, tuple)) and all(
        d is None or isinstance(d, int) for d in x
    )


@keras.saving.register_keras_serializable(package="tfmemopt")
class CheckpointBlock(keras.layers.Layer):
    """Recomputes the activations of the wrapped layers in the backward pass.

    Only the block's inputs are kept for the backward pass; everything the
    wrapped layers compute inside is dropped after the forward pass and
    computed again when the gradient reaches the block. Memory for the
    block's inner activations drops to about one layer's worth; the cost is
    one more forward pass of the block per training step (about +33% step
    time when every block is wrapped).

    Gradients are the same as without the block, including with dropout
    (the same masks are drawn again), `BatchNormalization` (moving
    statistics are updated once), keyword arguments such as `training`,
    `mask` or `attention_mask` in graph mode, mixed precision, XLA,
    `tf.distribute` and inside `tf.while_loop` (the micro-batch loop of
    `tfmemopt.Model`). When `training=False` the block is a plain call.

    Args:
        layers: A `keras.layers.Layer` or a non-empty sequence of them. A
            single layer is called with the block's arguments; a sequence
            is applied in order, each layer's output feeding the next (the
            keyword arguments go to the first one, `training` to all).
        **kwargs: Base layer arguments (`name`, `dtype`, ...). The dtype
            policy defaults to the first wrapped layer's.

    Raises:
        ValueError: `layers` is empty, or holds a layer that cannot be
            replayed safely (a stateful RNN).
        TypeError: `layers` holds something that is not a Keras layer.

    Example:

    >>> import keras, tfmemopt
    >>> block = tfmemopt.CheckpointBlock(
    ...     [keras.layers.Dense(64, activation="gelu"),
    ...      keras.layers.Dropout(0.1),
    ...      keras.layers.Dense(16)])
    >>> model = keras.Sequential([keras.Input((16,)), block])
    >>> model.compile("adam", "mse")
    """

    def __init__(
        self,
        layers: keras.layers.Layer | Sequence[keras.layers.Layer],
        **kwargs,
    ):
        single = isinstance(layers, keras.layers.Layer)
        items = [layers] if single else layers
        if not isinstance(items, (list, tuple)):
            raise TypeError(
                "`layers` must be a Keras layer or a list of Keras layers. "
                f"Received: layers={layers!r} (of type "
                f"{type(layers).__name__})."
            )
        if not items:
            raise ValueError(
                "`layers` must hold at least one layer: an empty segment "
                "has nothing to recompute. Received: layers=[]. Pass the "
                "layers whose activations should be recomputed."
            )
        for layer in items:
            if not isinstance(layer, keras.layers.Layer):
                raise TypeError(
                    "Every element of `layers` must be a Keras layer. "
                    f"Received: {layer!r} (of type {type(layer).__name__})."
                )
            check_replayable(layer)
        if "dtype" not in kwargs:
            kwargs["dtype"] = items[0].dtype_policy
        super().__init__(**kwargs)
        self._single = single
        self.wrapped_layers = list(items)
        self.supports_masking = all(x.supports_masking for x in items)

    # -- building ---------------------------------------------------------
    def build(self, input_shape=None, **shapes):
        # Keras calls this with the first input's shape (and, on loading, from
        # `get_build_config`); a symbolic pass builds the wrapped layers.
        if input_shape is not None and not all(
            x.built for x in self.wrapped_layers
        ):
            if not _is_shape(input_shape):
                # Several inputs: the next call builds the layers.
                self.built = True
                return
            spec = keras.KerasTensor(input_shape)
            self._forward(spec, training=None)
        self.built = True

    def compute_output_spec(self, *args, **kwargs):
        return self._forward(*args, **kwargs)

    # -- calling ----------------------------------------------------------
    def _forward(self, *args, training=None, **kwargs):
        first, *rest = self.wrapped_layers
        if _accepts(first, "training"):
            kwargs["training"] = training
        out = first(*args, **kwargs)
        for layer in rest:
            extra = (
                {"training": training} if _accepts(layer, "training") else {}
            )
            out = layer(out, **extra)
        return out

    def call(self, *args, training=None, **kwargs):
        if training is False or not all(x.built for x in self.wrapped_layers):
            return self._forward(*args, training=training, **kwargs)
        if kwargs.get("mask") is None:
            kwargs.pop("mask", None)

        masks = []

        def forward(*a, **k):
            out = self._forward(*a, training=training, **k)
            masks.append(
                [getattr(t, "_keras_mask", None) for t in tf.nest.flatten(out)]
            )
            return out

        # A block that `enable_checkpointing` made for a model's segment is
        # not one of the model's tracked layers: the losses of the layers
        # inside it go to the model, which clears and collects them.
        owner_ref = self.__dict__.get("_tfmemopt_loss_owner")
        owner = (owner_ref() if owner_ref is not None else None) or self
        out = checkpoint_call(forward, args, kwargs, self._state(), owner=owner)
        flat = tf.nest.flatten(out)
        for t, m in zip(flat, masks[0] if masks else []):
            if m is not None:
                try:
                    t._keras_mask = m
                except AttributeError:  # pragma: no cover - eager constants
                    pass
        return out

    def _state(self) -> list:
        state = []
        for layer in self.wrapped_layers:
            state.extend(layer.variables)
        return state

    def compute_mask(self, inputs, mask=None):
        if self._single:
            return self.wrapped_layers[0].compute_mask(inputs, mask)
        return None

    # -- serialization ----------------------------------------------------
    def get_config(self) -> dict:
        config = super().get_config()
        config.pop("dtype", None)
        inner = [
            keras.saving.serialize_keras_object(x) for x in self.wrapped_layers
        ]
        config["layers"] = inner[0] if self._single else inner
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        inner = config.pop("layers")
        if isinstance(inner, dict):
            layers = keras.saving.deserialize_keras_object(inner)
        else:
            layers = [keras.saving.deserialize_keras_object(x) for x in inner]
        return cls(layers, **config)
