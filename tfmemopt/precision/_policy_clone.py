"""A model's graph under another dtype policy, for the estimator.

Keras's mixed policies do not make every activation 16-bit: layers cast
back to float32 where 16 bits would lose too much (BatchNormalization and
LayerNormalization compute in float32, Embedding gathers from its float32
table before casting, losses run in float32), and the gradient of each cast
is a cast again. Scaling a float32 graph's activations to 2 bytes misses
these float32 copies (measured on CPU: a BatchNorm CNN's mixed_bfloat16 step
needs 0.89x of its float32 step, not the 0.5x of its activations). So the
estimator traces the model rebuilt under the policy, when it can be rebuilt
from its config (functional and Sequential models); weights are not copied.
"""

from __future__ import annotations

import keras


def swap_policy(config, old: str, new: str, keep=frozenset()):
    """Replaces dtype policy `old` by `new` throughout a config tree.

    Layers whose name is in `keep` (e.g. output layers, which should keep
    float32 outputs) are left as they are.
    """
    if isinstance(config, list):
        return [swap_policy(c, old, new, keep) for c in config]
    if not isinstance(config, dict):
        return config
    inner = config.get("config")
    if keep and isinstance(inner, dict) and inner.get("name") in keep:
        return config
    out = {}
    for key, value in config.items():
        if (
            key == "dtype"
            and isinstance(value, dict)
            and value.get("class_name") == "DTypePolicy"
            and value.get("config", {}).get("name") == old
        ):
            value = dict(value, config=dict(value["config"], name=new))
        out[key] = swap_policy(value, old, new, keep)
    return out


def rebuilt_under(model: keras.Model, policy: str):
    """`model` rebuilt with its layers under `policy`, or None.

    Layers that kept their own policy (e.g. a float32 output layer) keep
    it; subclassed models, which have no layer config, return None.
    """
    old = model.dtype_policy.name
    if old == policy:
        return model
    try:
        config = model.get_config()
    except (NotImplementedError, TypeError, ValueError):
        return None
    if not isinstance(config, dict) or "layers" not in config:
        return None
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        copy = type(model).from_config(swap_policy(config, old, policy))
    except Exception:  # noqa: BLE001 - any failure: the scaling rule
        return None
    finally:
        keras.config.set_dtype_policy(previous)
    return copy
