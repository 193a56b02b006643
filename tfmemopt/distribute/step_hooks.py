"""The calls `tfmemopt.Model` makes into `tfmemopt.distribute`.

Kept in one place so that the model holds only one-line hooks and everything
that knows about replicas lives here.

- `FitFixes`: base mixin of `tfmemopt.Model` (the multi-worker `fit` fixes).
- `on_compile()`: refuses `keras.distribution` on the TensorFlow backend.
- `before_apply(grads_and_vars, optimizer)`: the cross-replica finite check
  and clipping after the all-reduce.
- `gradient_dtype(variable)`: the dtype a gradient is handed to the
  optimizer in (float32 for bfloat16 weights under several replicas).
- `step_logs(logs, model)`: scalar logs that multi-worker reduction
  accepts.
- `shard_parameters(model, optimizer, strategy)`: FSDP (`_fsdp`).
"""

from __future__ import annotations

from tfmemopt.distribute._fsdp import clip_shards
from tfmemopt.distribute._fsdp import shard_model as shard_parameters
from tfmemopt.distribute._gradients import exchange_dtype as gradient_dtype
from tfmemopt.distribute._gradients import prepare_gradients
from tfmemopt.distribute._keras_distribution import check_keras_distribution
from tfmemopt.distribute._keras_fixes import MultiWorkerFitFixes as FitFixes
from tfmemopt.distribute._keras_fixes import expand_logs


def step_logs(logs, model):
    """`logs` as `train_step` returns them: scalars given a leading axis
    under a multi-worker strategy (`expand_logs`), decided once per train
    function (`FitFixes.make_train_function`); unchanged elsewhere."""
    if not getattr(model, "_multi_worker_logs", False):
        return logs
    return expand_logs(logs)


def on_compile() -> None:
    """Raises ValueError when a `keras.distribution` is set (TF backend)."""
    check_keras_distribution()


def before_apply(grads_and_vars, optimizer, sharded: bool):
    """Returns `(grad, var)` pairs that make the update equal one device's
    (`sharded`: the model's weights are FSDP shards, `shard_parameters`)."""
    grads_and_vars = list(grads_and_vars)
    if not grads_and_vars:
        return grads_and_vars
    grads = [g for g, _ in grads_and_vars]
    if sharded:  # every trainable weight is a shard (`Model._shards`)
        grads = clip_shards(grads, optimizer)
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
