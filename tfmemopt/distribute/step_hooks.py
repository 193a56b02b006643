"""The calls `tfmemopt.Model` makes into `tfmemopt.distribute`.

Kept in one place so that the model holds only one-line hooks and everything
that knows about replicas lives here.

- `FitFixes`: base mixin of `tfmemopt.Model` (the multi-worker `fit` fixes).
- `on_compile()`: refuses `keras.distribution` on the TensorFlow backend.
- `before_apply(grads_and_vars, optimizer)`: the cross-replica finite check
  and clipping after the all-reduce.
- `gradient_dtype(variable)`: the dtype a gradient is handed to the
  optimizer in (float32 for bfloat16 weights under several replicas).
- `step_logs(logs)`: scalar logs that multi-worker reduction accepts.
- `shard_parameters(model, optimizer, strategy)`: FSDP (`_fsdp`).
"""

from __future__ import annotations

from tfmemopt.distribute._fsdp import clip_shards
from tfmemopt.distribute._fsdp import is_shard
from tfmemopt.distribute._fsdp import shard_model as shard_parameters
from tfmemopt.distribute._gradients import exchange_dtype as gradient_dtype
from tfmemopt.distribute._gradients import prepare_gradients
from tfmemopt.distribute._keras_distribution import check_keras_distribution
from tfmemopt.distribute._keras_fixes import MultiWorkerFitFixes as FitFixes
from tfmemopt.distribute._keras_fixes import expand_logs as step_logs


def on_compile() -> None:
    """Raises ValueError when a `keras.distribution` is set (TF backend)."""
    check_keras_distribution()


def before_apply(grads_and_vars, optimizer):
    """Returns `(grad, var)` pairs that make the update equal one device's."""
    grads_and_vars = list(grads_and_vars)
    if not grads_and_vars:
        return grads_and_vars
    grads = [g for g, _ in grads_and_vars]
    if any(is_shard(v) for _, v in grads_and_vars):
        grads = clip_shards(grads, optimizer)  # shard_parameters=True
    else:
        grads = prepare_gradients(grads, optimizer)
    return list(zip(grads, [v for _, v in grads_and_vars]))


__all__ = [
    "FitFixes",
    "before_apply",
    "gradient_dtype",
    "on_compile",
    "shard_parameters",
    "step_logs",
]
