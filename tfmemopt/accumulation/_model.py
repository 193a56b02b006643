"""`tfmemopt.Model`: exact gradient accumulation inside one train step.

Each `fit` step is one optimizer update on the whole batch. The batch is cut
into micro-batches (`tfmemopt.micro_batching`) that run strictly one after
another, so only one micro-batch's activations are alive at a time; their
gradients are summed in float32 and applied once. Every compiled loss is
normalised over the whole window (`tfmemopt.loss_normalization`), so the
update equals the full-batch update, also with masks, sample weights,
several outputs and short batches.
"""

from __future__ import annotations

import keras

from tfmemopt import longseq
from tfmemopt._compat import functional_class
from tfmemopt._utils import check_int
from tfmemopt._utils import keyword_options
from tfmemopt.accumulation import _adapters as adapters
from tfmemopt.accumulation import _fit_hooks
from tfmemopt.accumulation import _loss_normalization as ln
from tfmemopt.accumulation import _model_saving as saving
from tfmemopt.accumulation import _window
from tfmemopt.accumulation._build_from_data import build_for_options
from tfmemopt.accumulation._micro_batching import plan_micro_batches
from tfmemopt.accumulation._micro_batching import static_batch_size
from tfmemopt.accumulation._model_compile import loss_scaled
from tfmemopt.accumulation._model_compile import refuse_keras_accumulation
from tfmemopt.distribute import step_hooks as _dist

_CONFIG_KEYS = (
    "accumulation_steps",
    "micro_batch_size",
    "checkpointing",
    "shard_parameters",
)


def _functional_arguments(args, kwargs) -> bool:
    """`Model(inputs, outputs)`: the inputs are Keras symbolic tensors.

    A subclass's own positional arguments (`VAE(encoder, decoder)`) are
    layers or values, not `keras.KerasTensor`s: those build a subclassed
    model, whatever their number.
    """
    if len(args) == 2:
        inputs = args[0]
    elif len(args) == 1 and "outputs" in kwargs:
        inputs = args[0]
    elif not args and "inputs" in kwargs and "outputs" in kwargs:
        inputs = kwargs["inputs"]
    else:
        return False
    leaves = keras.tree.flatten(inputs)
    return bool(leaves) and all(
        isinstance(t, keras.KerasTensor) for t in leaves
    )


@keras.saving.register_keras_serializable(package="tfmemopt")
class Model(_dist.FitFixes, keras.Model):
    """A `keras.Model` whose every step is exact gradient accumulation.

    Each batch given to `fit` is split into micro-batches that run one after
    another inside a single train step (a `tf.while_loop` with
    `parallel_iterations=1`); their gradients are summed in float32 and the
    optimizer applies them once. Peak activation memory is that of one
    micro-batch; the cost is N smaller matmuls instead of one large one, and
    one float32 gradient buffer the size of the trainable weights.

    The update is exactly that of the whole batch: every compiled loss is
    normalised over the whole window (valid entries of masked losses, weight
    sums of `"mean_with_sample_weight"`, entries of a short last batch), the
    optimizer, its learning-rate schedule, EMA and weight decay step once,
    regularisation losses count once, and metrics and the logged loss count
    every sample once. Under `mixed_float16` each micro-batch's loss is
    scaled and Keras's `LossScaleOptimizer` checks the window's summed
    gradients once: one non-finite micro-batch skips the whole update and
    lowers the scale once.

    BatchNormalization cannot be exact: each micro-batch is normalised with
    its own statistics and updates the moving statistics once (N momentum
    updates per step), as if the micro-batches were batches of their own.

    Three ways in, all this class:

    - functional: `tfmemopt.Model(inputs, outputs, accumulation_steps=8)`;
    - subclassing: `class Net(tfmemopt.Model)` calling
      `super().__init__(accumulation_steps=8)`;
    - wrapping any built model: `tfmemopt.Model.wrap(model, 8)`.

    Args:
        accumulation_steps: Int or `None`. The batch is cut into at most this
            many micro-batches of `ceil(batch / accumulation_steps)` samples.
            Defaults to `1` when `micro_batch_size` is not given either.
        micro_batch_size: Int or `None`, defaults to `None`. Alternatively,
            the most samples per micro-batch. Pass one of the two, not both.
        checkpointing: `None` (default) or an activation checkpointing policy
            (`"auto"`, `"blocks"`, a list of layers or layer names, or a
            predicate) applied with `tfmemopt.enable_checkpointing` once
            the model is built. The config (and so `.keras` files) keeps a
            name or the list as layer names; a predicate is code and is not
            saved: `get_config` warns, and a loaded model has no
            checkpointing until `enable_checkpointing` is called again.
        chunked_loss: Bool, defaults to `False`. Compute the language-model
            head (a linear `Dense`, or a `ReversibleEmbedding` called with
            `reverse=True`) and `SparseCategoricalCrossentropy(from_logits=
            True)` together in chunks of tokens in the training step, never
            holding all logits (`tfmemopt.longseq`). Predict and evaluate
            still return full logits.
        attention: `None` (default) or `"chunked"`: every
            `MultiHeadAttention` (and keras-hub subclass) computes exact
            attention in query and key blocks, recomputed in the backward pass
            (attention dropout must be 0).
        shard_parameters: Bool, defaults to `False`. Under a strategy with
            R > 1 replicas, each replica stores 1/R of every trainable
            weight, of its gradient and of the optimizer state (FSDP,
            ZeRO stage 3; see docs/sharding.md). Applied by `compile`,
            which must run inside the strategy's scope on a built model.
            With one replica nothing changes.
        *args, **kwargs: As for `keras.Model` (`inputs`, `outputs`, `name`).

    Example:

    ```python
    inputs = keras.Input((784,))
    h = keras.layers.Dense(256, activation="relu")(inputs)
    outputs = keras.layers.Dense(10)(h)
    model = tfmemopt.Model(inputs, outputs, accumulation_steps=8)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(True))
    model.fit(x, y, batch_size=64)  # 8 micro-batches of 8, one update of 64
    ```
    """

    def __new__(cls, *args, **kwargs):
        # `tfmemopt.Model(inputs, outputs)` builds a functional model. Keras
        # would graft `Functional` into this class's bases for good (which
        # then breaks subclassing it); a dedicated subclass keeps them apart.
        if _functional_arguments(args, kwargs):
            cls = _functional_variant(cls)
        return super().__new__(cls, *args, **kwargs)

    def __init__(
        self,
        *args,
        accumulation_steps: int | None = None,
        micro_batch_size: int | None = None,
        checkpointing=None,
        shard_parameters: bool = False,
        chunked_loss: bool = False,
        attention: str | None = None,
        **kwargs,
    ):
        longseq.check_options(chunked_loss, attention)
        if accumulation_steps is not None and micro_batch_size is not None:
            raise ValueError(
                "Pass either `accumulation_steps` or `micro_batch_size`, not "
                f"both. Received: accumulation_steps={accumulation_steps}, "
                f"micro_batch_size={micro_batch_size}. Use "
                "`accumulation_steps` for a fixed number of micro-batches "
                "per batch, `micro_batch_size` for a fixed micro-batch size."
            )
        if micro_batch_size is None and accumulation_steps is None:
            accumulation_steps = 1
        if accumulation_steps is not None:
            check_int("accumulation_steps", accumulation_steps)
        if micro_batch_size is not None:
            check_int("micro_batch_size", micro_batch_size)
        if not isinstance(shard_parameters, bool):
            raise TypeError(
                "`shard_parameters` must be True or False. Received: "
                f"shard_parameters={shard_parameters!r} (of type "
                f"{type(shard_parameters).__name__})."
            )
        if _functional_arguments(args, kwargs):
            functional_class().__init__(self, *args, **kwargs)
        else:
            keras.Model.__init__(self, *args, **kwargs)
        self._accumulation_steps = accumulation_steps
        self._micro_batch_size = micro_batch_size
        self._checkpointing_policy = checkpointing
        self._checkpointing_report = None
        self._long_sequences = (chunked_loss, attention)
        if self.built:
            self._ensure_long_sequences()
        self._shard_parameters = shard_parameters
        self._shards = None
        if checkpointing is not None and self.built:
            self._ensure_checkpointing()

    @property
    def accumulation_steps(self) -> int | None:
        """The most micro-batches per batch (`None` with micro_batch_size)."""
        return self._accumulation_steps

    @property
    def micro_batch_size(self) -> int | None:
        """The most samples per micro-batch (`None` with accumulation_steps)."""
        return self._micro_batch_size

    @property
    def checkpointing(self):
        """The checkpointing policy passed at construction, or `None`."""
        return self._checkpointing_policy

    @property
    def shard_parameters(self) -> bool:
        """Whether the weights are sharded across replicas (FSDP)."""
        return self._shard_parameters

    @property
    def trainable_variables(self):
        # Under shard_parameters the optimizer and the gradients see the
        # shards; `trainable_weights` stays the model's whole weights.
        if getattr(self, "_shards", None) is not None:
            return list(self._shards.shards)
        return super().trainable_variables

    @property
    def long_sequences(self):
        """What `chunked_loss` / `attention` took over (`LongSequenceReport`).

        `None` when both are off or the model is not built yet.
        """
        return longseq.report_of(self)

    @classmethod
    @keyword_options
    def wrap(
        cls,
        model: keras.Model,
        accumulation_steps: int | None = None,
        *,
        micro_batch_size: int | None = None,
        checkpointing=None,
        name: str | None = None,
        shard_parameters: bool = False,
        chunked_loss: bool = False,
        attention: str | None = None,
    ) -> "Model":
        """Wraps any built Keras model (functional, subclassed, keras-hub).

        The wrapper calls `model` and trains it with exact accumulation; the
        wrapped model's weights are the wrapper's weights, so training the
        wrapper trains `model`.

        Args:
            model: A `keras.Model` (or layer), built or buildable on call.
            accumulation_steps: Int or `None`, as for `tfmemopt.Model`.
            micro_batch_size: Int or `None`, as for `tfmemopt.Model`.
            checkpointing: As for `tfmemopt.Model`.
            name: String or `None`, the wrapper's name.
            chunked_loss: Bool, as for `tfmemopt.Model`.
            attention: `None` or `"chunked"`, as for `tfmemopt.Model`.
            shard_parameters: Bool, as for `tfmemopt.Model`.

        Returns:
            A `tfmemopt.Model` to compile and fit.
        """
        # `WrappedModel` subclasses this class, so this module cannot import
        # it: it is found by the name it registers with Keras
        # (tfmemopt/accumulation/_wrapped.py, imported by the package).
        WrappedModel = keras.saving.get_registered_object(
            "tfmemopt>WrappedModel"
        )
        if not isinstance(model, keras.layers.Layer):
            raise TypeError(
                "`Model.wrap` expects a keras.Model or keras.layers.Layer. "
                f"Received: model={model!r} (of type {type(model).__name__})."
            )
        return WrappedModel(
            model,
            accumulation_steps=accumulation_steps,
            micro_batch_size=micro_batch_size,
            checkpointing=checkpointing,
            name=name,
            chunked_loss=chunked_loss,
            attention=attention,
            shard_parameters=shard_parameters,
        )

    def compile(self, *args, **kwargs):
        _dist.on_compile()
        if kwargs.get("auto_scale_loss", True) is False:
            pass  # asked for no loss scaling: as Keras does, none is added
        elif args:
            args = (loss_scaled(self, args[0]), *args[1:])
        elif "optimizer" in kwargs:
            kwargs["optimizer"] = loss_scaled(self, kwargs["optimizer"])
        super().compile(*args, **kwargs)
        refuse_keras_accumulation(self)
        if self._shard_parameters:
            self._shards = _dist.shard_parameters(self, self.optimizer)

    def compile_from_config(self, config):
        # Keras skips this for models that override `compile`; ours only adds
        # a check, so the saved compile arguments are restored as usual.
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        optimizer = getattr(self, "optimizer", None)
        if optimizer is not None and self.built and not optimizer.built:
            self.optimizer.build(self.trainable_variables)

    def _ensure_checkpointing(self):
        """Applies the checkpointing policy once the model is built."""
        if self._checkpointing_policy is None or self._checkpointing_report:
            return
        from tfmemopt.checkpointing import enable_checkpointing

        self._checkpointing_report = enable_checkpointing(
            self._checkpointing_target(), self._checkpointing_policy
        )

    def _ensure_long_sequences(self):
        """Applies `chunked_loss` / `attention` once the model is built."""
        chunked_loss, attention = self._long_sequences
        if (chunked_loss or attention) and longseq.report_of(self) is None:
            longseq.enable_long_sequences(
                self._checkpointing_target(),
                chunked_loss=chunked_loss,
                attention=attention,
                owner=self,
            )

    def _checkpointing_target(self) -> keras.Model:
        """The model whose forward pass `checkpointing` reorganises."""
        return self

    def _check_own_train_step(self):
        """Refuses a subclass whose `train_step` would skip accumulation."""
        accumulates = (
            self._micro_batch_size is not None
            or (self._accumulation_steps or 1) > 1
        )
        if not accumulates or type(self).train_step is Model.train_step:
            return
        setting = (
            f"accumulation_steps={self._accumulation_steps}"
            if self._micro_batch_size is None
            else f"micro_batch_size={self._micro_batch_size}"
        )
        raise ValueError(
            f"{type(self).__name__} overrides `train_step`, so tfmemopt's "
            f"micro-batch loop never runs and {setting} would be ignored "
            "(each step would apply the whole batch at once). Either drop "
            "the `train_step` override and put the loss in `compute_loss` "
            "or `self.add_loss(...)` (accumulated exactly), or keep it, "
            "construct the model without accumulation_steps / "
            "micro_batch_size, and accumulate across steps with "
            "`compile(optimizer=tfmemopt.AccumulatingOptimizer(optimizer, "
            "accumulation_steps=N))` (one update per N `fit` batches)."
        )

    def fit(self, *args, **kwargs):
        self._check_own_train_step()
        build_for_options(self, args[0] if args else kwargs.get("x"))
        if self.built:
            self._ensure_long_sequences()
        longseq.check_compiled(self, self._long_sequences[0])
        if self._checkpointing_policy is not None and self.built:
            self._ensure_checkpointing()
        self._choose_loss()
        # The OOM report (tfmemopt.tuning) registers here: see _fit_hooks.
        with _fit_hooks.around_fit(self, args, kwargs):
            return super().fit(*args, **kwargs)

    def train_on_batch(self, *args, **kwargs):
        self._check_own_train_step()
        self._choose_loss()
        return super().train_on_batch(*args, **kwargs)

    def _choose_loss(self) -> ln.WindowLoss:
        """The loss the micro-steps compute, chosen when `fit` starts:
        Keras's compiled loss split into window-exact terms, the model's
        own `compute_loss`, or the chunked head's (`chunked_loss`)."""
        report = longseq.report_of(self)
        loss = ln.window_loss(self, report is not None and report.chunked_loss)
        self._window_loss = loss
        return loss

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        plan = plan_micro_batches(
            static_batch_size(x), self._accumulation_steps,
            self._micro_batch_size,
        )  # fmt: skip
        # `train_step` called on its own (not from `fit`) chooses here.
        loss = getattr(self, "_window_loss", None) or self._choose_loss()
        logs = _window.run_window(self, x, y, sample_weight, plan, loss)
        return _dist.step_logs(logs, self)

    # -- saving (the SeedGenerator states and LoRA factors too:
    # _model_saving, _adapters) -------------------------------------------
    def save_own_variables(self, store):
        super().save_own_variables(store)
        saving.save_random_states(self, store)
        adapters.save_factors(self, store)

    def load_own_variables(self, store):
        rest, factors = adapters.without_factors(store)
        rest, seeds = saving.without_seeds(rest)
        super().load_own_variables(rest)
        saving.load_random_states(self, store, seeds)
        adapters.load_factors(self, store, factors)

    def build_from_config(self, config):
        super().build_from_config(config)
        adapters.restore_pending(self)  # a subclassed model's LoRA layers

    def get_config(self):
        config = super().get_config()
        lora = adapters.adapter_config(self)
        if lora is not None:
            config["adapters"] = lora
        config.update(
            {
                "chunked_loss": self._long_sequences[0],
                "attention": self._long_sequences[1],
                "accumulation_steps": self._accumulation_steps,
                "micro_batch_size": self._micro_batch_size,
                "checkpointing": saving.serializable_policy(
                    self._checkpointing_policy
                ),
                "shard_parameters": self._shard_parameters,
            }
        )
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        chunked_loss = bool(config.pop("chunked_loss", False))
        attention = config.pop("attention", None)
        settings = {k: config.pop(k, None) for k in _CONFIG_KEYS}
        lora = config.pop("adapters", None)
        if "layers" in config and "input_layers" in config:
            layers = list(config["layers"])  # `from_config` consumes them
            model = super().from_config(config, custom_objects=custom_objects)
            saving.restore_nested_policies(model, layers)
            model._accumulation_steps = settings["accumulation_steps"]
            model._micro_batch_size = settings["micro_batch_size"]
            model._checkpointing_policy = settings["checkpointing"]
            model._long_sequences = (chunked_loss, attention)
            model._ensure_long_sequences()
            model._shard_parameters = bool(settings["shard_parameters"])
            if settings["checkpointing"] is not None:
                model._ensure_checkpointing()
            adapters.restore_adapters(model, lora)
            return model
        settings["shard_parameters"] = bool(settings["shard_parameters"])
        model = cls(
            **config,
            **settings,
            chunked_loss=chunked_loss,
            attention=attention,
        )
        adapters.restore_when_built(model, lora)
        return model


_FUNCTIONAL_VARIANTS = {}


def _functional_variant(cls):
    """`cls` combined with Keras's `Functional` (made once per class)."""
    functional = functional_class()
    if issubclass(cls, functional):
        return cls
    if cls not in _FUNCTIONAL_VARIANTS:
        variant = type(
            cls.__name__,
            (cls, functional),
            {
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
                "__doc__": cls.__doc__,
            },
        )
        if cls is Model:
            # Saved functional tfmemopt.Models load back as this class.
            variant = keras.saving.register_keras_serializable(
                package="tfmemopt", name="Model"
            )(variant)
        _FUNCTIONAL_VARIANTS[cls] = variant
    return _FUNCTIONAL_VARIANTS[cls]
