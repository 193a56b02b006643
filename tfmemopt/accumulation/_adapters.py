"""What a LoRA fine-tune holds that Keras does not save: which layers have
LoRA, which are frozen, and the factors themselves.

Keras 3's `Dense`, `EinsumDense` and `Embedding` save a LoRA layer's kernel
with the factors folded in (`W + (alpha / rank) * A @ B`) and zero both
factors when they load. keras-hub's `backbone.enable_lora(rank)` is not in
the backbone's config either: a loaded task has no LoRA layers and every
layer trainable, so its optimizer state no longer matches (`AdamW8bit`:
"A total of 1 objects could not be loaded"), and a resumed run trains the
whole model. Even where the LoRA layers come back (a functional model's
`Dense(lora_rank=...)`), a resumed run starts from zero factors: both
factors' gradients are then zero, and it ended 0.84 of an update away from
the uninterrupted run (a trial, keras-hub Llama, rank 4).

`tfmemopt.Model` and `Model.wrap` keep both:

- `adapter_config(model)`: in the config, `(index, name, rank, alpha)` of
  every LoRA layer among the model's layers (depth first, as
  `_compat.sublayers` lists them), every layer's `trainable` flag, and
  every weight's. `restore_adapters` enables LoRA on those layers again
  and sets the flags, before the optimizer is built.
- `save_factors` / `load_factors`: beside the model's own variables, every
  LoRA layer's weights as they are (the kernel without the factors, and
  the factors), under `lora_<i>` keys. The layer itself still saves the
  folded kernel (what plain Keras and keras-hub load). Keras loads a
  model's own variables before its layers', so `load_factors` writes the
  values now and again right after the layer's own load.
"""

from __future__ import annotations

import warnings

from tfmemopt._compat import set_untracked
from tfmemopt._compat import sublayers
from tfmemopt.accumulation._model_saving import split_keys

FACTOR_KEY = "lora_"
_PENDING = "_pending_adapters"


def lora_layers(model) -> list:
    """The layers inside `model` with LoRA enabled, depth first."""
    return [
        layer
        for layer in sublayers(model)
        if getattr(layer, "lora_enabled", False)
    ]


def adapter_config(model) -> dict | None:
    """The LoRA layers and trainable flags of `model`, as a config value;
    None when no layer inside has LoRA."""
    layers = sublayers(model, include_self=True)
    lora = [
        [i, layer.name, int(layer.lora_rank), float(layer.lora_alpha)]
        for i, layer in enumerate(layers)
        if getattr(layer, "lora_enabled", False)
    ]
    if not lora:
        return None
    return {
        "lora": lora,
        "layers_trainable": [bool(layer.trainable) for layer in layers],
        "weights_trainable": [bool(w.trainable) for w in model.weights],
    }


def restore_adapters(model, config) -> None:
    """Enables LoRA and sets the trainable flags `adapter_config` saved
    (a warning, and nothing changed, where the layers differ)."""
    if not config:
        return
    layers = sublayers(model, include_self=True)
    names = [layer.name for layer in layers]
    if len(layers) != len(config["layers_trainable"]) or any(
        i >= len(names) or names[i] != name for i, name, _, _ in config["lora"]
    ):
        warnings.warn(
            f"Model {model.name!r}: its layers differ from the saved "
            "model's, so its LoRA layers are not enabled again; call "
            "`enable_lora` on them before training.",
            stacklevel=3,
        )
        return
    for i, _, rank, alpha in config["lora"]:
        if not getattr(layers[i], "lora_enabled", False):
            layers[i].enable_lora(rank, lora_alpha=alpha)
    # Parents before children (Keras sets a layer's flag on its children),
    # then each weight (a LoRA layer freezes its kernel alone).
    for layer, flag in zip(layers, config["layers_trainable"]):
        layer.trainable = flag
    weights = model.weights
    if len(weights) == len(config["weights_trainable"]):
        for weight, flag in zip(weights, config["weights_trainable"]):
            weight.trainable = flag


def restore_when_built(model, config) -> None:
    """`restore_adapters` now if `model` is built, else when it is built
    (`restore_pending`, from `build_from_config`: a subclassed model is
    built after `from_config`)."""
    if not config:
        return
    if model.built:
        restore_adapters(model, config)
    else:
        model.__dict__[_PENDING] = config


def restore_pending(model) -> None:
    """Restores what `restore_when_built` left for the model's build."""
    pending = model.__dict__.pop(_PENDING, None)
    if pending is not None:
        restore_adapters(model, pending)


def save_factors(model, store) -> None:
    """Writes every LoRA layer's weights, unfolded, into `store`."""
    i = 0
    for layer in lora_layers(model):
        for weight in layer.weights:
            store[f"{FACTOR_KEY}{i}"] = weight.numpy()
            i += 1


def without_factors(store) -> tuple[dict, list]:
    """`(store without the LoRA keys, the LoRA keys in order)`."""
    return split_keys(store, FACTOR_KEY)


def load_factors(model, store, keys) -> None:
    """Restores the LoRA layers' weights `save_factors` wrote.

    Assigned now and again right after each layer's own
    `load_own_variables` (which Keras calls after the model's, and which
    writes the folded kernel and zeroes the factors).
    """
    if not keys:
        return
    layers = lora_layers(model)
    counts = [len(layer.weights) for layer in layers]
    if sum(counts) != len(keys):
        warnings.warn(
            f"Model {model.name!r}: the saved file holds {len(keys)} LoRA "
            f"weights and the model's LoRA layers have {sum(counts)}; the "
            "layers keep the kernels Keras folded the factors into, with "
            "zero factors.",
            stacklevel=3,
        )
        return
    values = iter([store[k] for k in keys])
    for layer, count in zip(layers, counts):
        saved = [next(values) for _ in range(count)]
        _assign(layer, saved)
        _after_own_load(layer, saved)


def _assign(layer, values) -> None:
    for weight, value in zip(layer.weights, values):
        weight.assign(value)


def _after_own_load(layer, values) -> None:
    """Makes `layer`'s next `load_own_variables` write `values` after its
    own (once; the method is the class's again afterwards)."""
    own = type(layer).load_own_variables

    def load_own_variables(store):
        try:
            own(layer, store)
            _assign(layer, values)
        finally:
            layer.__dict__.pop("load_own_variables", None)

    set_untracked(layer, "load_own_variables", load_own_variables)
