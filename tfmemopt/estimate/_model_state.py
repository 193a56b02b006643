"""What one replica keeps of the model between steps: its weights, their
gradients and the optimizer's state, in bytes under the estimate's
settings (`shard_parameters`: each replica's shards, `_param_sharding`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import keras

from tfmemopt.distribute import ShardedOptimizer
from tfmemopt.estimate._optimizer_state import _itemsize
from tfmemopt.estimate._optimizer_state import optimizer_state_bytes
from tfmemopt.estimate._param_sharding import sharded_state
from tfmemopt.estimate._param_sharding import state_per_replica
from tfmemopt.estimate._settings import Settings
from tfmemopt.estimate._settings import counted


class ModelState(NamedTuple):
    """Bytes per replica; `whole_gradients`: the gradients unsharded."""

    parameters: int
    gradients: int
    whole_gradients: int
    optimizer_state: int
    optimizer_how: str
    shard_sizes: list | None  # elements of each trainable shard, or None


def model_state(model, s: Settings) -> ModelState:
    """The weights, gradients and optimizer state of `model` (traced first:
    a subclassed model may create its weights on first call)."""
    trainable = model.trainable_weights
    params = sum(counted(weight_bytes(v, s), s) for v in model.weights)
    grads = sum(counted(weight_bytes(v, s), s) for v in trainable)
    whole_grads, sizes = grads, None
    if s.shard_parameters:
        sharded = sharded_state(model, s, lambda n: counted(n, s))
        params, grads = sharded.parameters, sharded.gradients
        opt_bytes, opt_how = sharded.optimizer_state, sharded.optimizer_how
        sizes = sharded.shard_sizes
    else:
        opt_bytes, opt_how = optimizer_bytes(trainable, s)
    return ModelState(params, grads, whole_grads, opt_bytes, opt_how, sizes)


def weight_bytes(v, s: Settings) -> int:
    """Bytes of weight `v` under the policy (float weights in its
    variable dtype)."""
    n = math.prod(v.shape)
    if keras.backend.is_float_dtype(v.dtype):
        return n * s.variable
    return n * _itemsize(v.dtype)


def optimizer_bytes(trainable, s: Settings):
    """`(bytes, how)` of the optimizer's slots for the trainable weights."""
    # Below the floor: the slots of a weight that is itself not counted
    # (every slot is at most the weight's size).
    shapes = [
        (
            tuple(v.shape),
            s.policy.variable_dtype
            if keras.backend.is_float_dtype(v.dtype)
            else v.dtype,
        )
        for v in trainable
        if counted(weight_bytes(v, s), s)
    ]
    if isinstance(s.optimizer, ShardedOptimizer) and s.replicas > 1:
        return state_per_replica(s.optimizer.inner_optimizer, shapes, s)
    return optimizer_state_bytes(s.optimizer, shapes)
