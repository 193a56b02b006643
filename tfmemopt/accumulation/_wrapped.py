"""`tfmemopt.Model.wrap`: exact accumulation for a model we did not write."""

from __future__ import annotations

import keras

from tfmemopt._compat import call_takes
from tfmemopt._utils import pop_keras_object
from tfmemopt.accumulation import _adapters as adapters
from tfmemopt.accumulation import _model_saving as saving
from tfmemopt.accumulation._model import Model


@keras.saving.register_keras_serializable(package="tfmemopt")
class WrappedModel(Model):
    """A `tfmemopt.Model` that calls another model (composition).

    Created by `tfmemopt.Model.wrap(model, ...)`. The wrapped model's
    variables are this model's variables; saving the wrapper saves it.

    Args:
        model: The `keras.Model` (or layer) to call.
        accumulation_steps, micro_batch_size, checkpointing, chunked_loss,
            attention: As for `tfmemopt.Model`.
        **kwargs: `name` and other `keras.Model` keyword arguments.
    """

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.model = model
        if getattr(model, "built", False):
            self.built = True
            self._ensure_long_sequences()
            if self._checkpointing_policy is not None:
                self._ensure_checkpointing()

    @property
    def output_names(self):
        """The wrapped model's output names (Keras compiles per-output
        losses and metrics by them, and names their logs after them)."""
        return getattr(self.model, "output_names", None)

    @property
    def inner(self) -> keras.layers.Layer:
        """The wrapped model."""
        return self.model

    def _checkpointing_target(self) -> keras.Model:
        # The wrapper's own graph is one call of the wrapped model: the
        # policy applies to the wrapped model's layers.
        if isinstance(self.model, keras.Model):
            return self.model
        return self

    def build(self, input_shape):
        if not self.model.built:
            self.model.build(input_shape)
        self.built = True

    def call(self, inputs, training=None, mask=None):
        kwargs = {}
        if call_takes(self.model, "training"):
            kwargs["training"] = training
        if mask is not None and call_takes(self.model, "mask"):
            kwargs["mask"] = mask
        return self.model(inputs, **kwargs)

    def compute_output_spec(self, inputs, training=None, mask=None):
        return self.model.compute_output_spec(inputs)

    def get_config(self):
        config = super().get_config()
        inner = keras.saving.serialize_keras_object(self.model)
        # The wrapper compiles and trains; the inner model's own compile
        # state (keras-hub tasks compile themselves) is not needed, and
        # loading it makes Keras warn that `compile()` was not called.
        inner.pop("compile_config", None)
        config["model"] = inner
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        inner = (config.get("model") or {}).get("config")
        # Copied: deserializing the wrapped model consumes its layers.
        layers = (
            list(inner.get("layers") or []) if isinstance(inner, dict) else []
        )
        model, config = pop_keras_object(config, "model", custom_objects)
        saving.restore_nested_policies(model, layers)
        lora = config.pop("adapters", None)
        wrapper = cls(model, **config)
        adapters.restore_when_built(wrapper, lora)
        return wrapper
