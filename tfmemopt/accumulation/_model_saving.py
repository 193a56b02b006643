"""What `tfmemopt.Model` saves beyond Keras: its `SeedGenerator` states
beside its variables, and its checkpointing policy as a config value.

Keras saves a layer's weights but not its `SeedGenerator` states (a
Dropout's random stream), so a run resumed from a checkpoint drew other
masks than the uninterrupted run (0.38-0.50 of an epoch's update on a
small MLP). The model saves them beside its own variables, under
`seed_<i>` keys, in `model.variables` order; files without them load as
before (the streams restart from their seeds, as in Keras).
"""

from __future__ import annotations

import warnings

import keras

SEED_KEY = "seed_"


def random_states(model) -> list:
    """The model's `SeedGenerator` states: `variables` that are no weight."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def save_random_states(model, store) -> None:
    """Writes `model`'s random states into `store` (`seed_<i>`)."""
    for i, state in enumerate(random_states(model)):
        store[f"{SEED_KEY}{i}"] = state


def split_keys(store, prefix: str) -> tuple[dict, list]:
    """`(store without the `<prefix><i>` keys, those keys in order of i)`:
    what the model writes beside its own variables (`seed_`, `lora_`)."""
    keys = list(store.keys())
    own = sorted(
        (k for k in keys if k.startswith(prefix)),
        key=lambda k: int(k[len(prefix) :]),
    )
    rest = {k: store[k] for k in keys if not k.startswith(prefix)}
    return rest, own


def without_seeds(store) -> tuple[dict, list]:
    """`(store without the seed keys, the seed keys in order)`."""
    return split_keys(store, SEED_KEY)


def load_random_states(model, store, seeds) -> None:
    """Restores `model`'s random states from `store`'s `seeds` keys (a
    warning, and nothing restored, when their number differs)."""
    if not seeds:
        return
    states = random_states(model)
    if len(seeds) != len(states):
        # stacklevel 3: the caller of `load_own_variables`.
        warnings.warn(
            f"Model {model.name!r}: the saved file holds {len(seeds)} "
            f"random-generator states and the model has {len(states)}; "
            "they are not restored (dropout masks after the resume "
            "will differ from the uninterrupted run's).",
            stacklevel=3,
        )
        return
    for state, key in zip(states, seeds):
        state.assign(store[key])


def serializable_policy(policy):
    """The checkpointing policy as a config value: a name, layer names."""
    if policy is None or isinstance(policy, str):
        return policy
    if isinstance(policy, (list, tuple)):
        # A list of layers is saved as their names (a loaded model's layers
        # keep them); it used to be dropped, so a loaded model lost it.
        return [p if isinstance(p, str) else p.name for p in policy]
    warnings.warn(
        f"tfmemopt.Model's checkpointing policy {policy!r} is a predicate: "
        "code, which a config cannot hold. The saved model will load "
        "without checkpointing. Pass 'auto', 'blocks' or a list of layer "
        "names to have it saved, or call tfmemopt.enable_checkpointing("
        "model, predicate) after loading.",
        stacklevel=3,
    )
    return None


def restore_nested_policies(model, layer_configs) -> None:
    """Gives the models nested in `model` the dtype policies they were saved
    with (`layer_configs`: the `"layers"` of `model`'s saved config, copied
    before Keras's functional `from_config` consumes them).

    Keras 3.15 saves a `Sequential`'s or functional model's `dtype` but does
    not pass it back when it loads: the model takes the global policy at
    load time, and one built under `mixed_float16` casts at its boundaries
    to `float32` after loading (a tfmemopt.Model of three nested blocks with
    checkpointing="blocks" resumed 6.3e-4 from the uninterrupted run; 0.0
    with the policies restored). A layer's own `dtype` is passed back.
    """
    for entry in layer_configs:
        inner = entry.get("config") or {}
        if not isinstance(inner, dict) or "layers" not in inner:
            continue  # not a model
        try:
            layer = model.get_layer(inner.get("name"))
        except ValueError:
            continue
        saved = inner.get("dtype")
        if saved is not None:
            policy = keras.dtype_policies.deserialize(saved)
            if layer.dtype_policy.name != policy.name:
                layer.dtype_policy = policy
        restore_nested_policies(layer, inner["layers"])
