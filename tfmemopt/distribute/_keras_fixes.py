"""Fixes for Keras 3 `fit` under collective all-reduce strategies.

Keras 3.x `fit` fails twice with two or more workers (keras-team/keras#20585,
tensorflow/tensorflow#72388):

1. `_maybe_symbolic_build` takes the first batch from the distributed iterator
   and calls `strategy.reduce("MEAN", batch, axis=None)` on it; under
   MultiWorkerMirroredStrategy that reduce cannot take a `PerReplica` batch
   ("Attempt to convert a value (PerReplica...)"). Building only needs the
   shapes and dtypes of one replica's batch, so we take the first local one.
2. The step's logs are reduced with `strategy.reduce("MEAN", v, axis=0)`,
   which fails on scalar logs ("Invalid reduction dimension 0"). We give each
   log a leading axis of length 1 inside the replica; the reduce then returns
   the mean over replicas as a scalar, which is what Keras meant.
3. `steps_per_execution > 1` fails under collective all-reduce, on one host
   or several (keras-team/keras#19246). The mixin then runs its own
   multi-step loop (`_multi_step.py`).

`MultiWorkerFitFixes` is a mixin for `keras.Model` subclasses; `expand_logs`
is the hook a custom `train_step` calls on what it returns.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tfmemopt import _compat
from tfmemopt.distribute._multi_step import make_multi_step_function


def in_multi_worker_mode(strategy=None) -> bool:
    """True under a MultiWorkerMirroredStrategy that spans several workers."""
    strategy = strategy or tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    probe = _compat.extended_multi_worker_mode(strategy)
    if probe is not None:
        return probe
    return strategy.cluster_resolver.cluster_spec().num_tasks("worker") > 1


def expand_logs(logs):
    """Gives scalar logs a leading axis of 1 under multi-worker strategies.

    Called inside the replica on what `train_step`/`test_step` return. Keras
    then reduces each value with `strategy.reduce("MEAN", v, axis=0)`, which
    yields the mean over replicas as a scalar. Outside multi-worker mode the
    logs are returned unchanged.

    Args:
        logs: Dict (or nest) of tensors returned by a train or test step.

    Returns:
        The same structure, scalars reshaped to `[1]` where needed.
    """
    if not in_multi_worker_mode():
        return logs

    def _expand(v):
        if isinstance(v, (tf.Tensor, tf.Variable)) and v.shape.rank == 0:
            return tf.reshape(v, [1])
        return v

    return tf.nest.map_structure(_expand, logs)


def first_local_batch(batch, strategy):
    """One replica's part of a distributed batch, for symbolic building."""

    def _local(v):
        if isinstance(v, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(v)[0]
        return v

    return tf.nest.map_structure(_local, batch)


class MultiWorkerFitFixes:
    """Mixin for `keras.Model` subclasses: makes `fit` work multi-worker.

    Place it before `keras.Model` in the bases. It changes nothing outside a
    multi-worker `MultiWorkerMirroredStrategy`. A subclass that defines its
    own `train_step` must return `expand_logs(logs)`; `test_step` is handled
    here when the subclass does not override it.
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = _compat.model_strategy(self)
        if iterator is None or strategy is None:
            return super()._maybe_symbolic_build(
                iterator=iterator, data_batch=data_batch
            )
        if not in_multi_worker_mode(strategy):
            return super()._maybe_symbolic_build(
                iterator=iterator, data_batch=data_batch
            )
        for _, _, it in iterator:
            data_batch = first_local_batch(next(it), strategy)
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def test_step(self, data):
        return expand_logs(super().test_step(data))

    def make_train_function(self, force=False):
        if self.train_function is not None and not force:
            return self.train_function
        strategy = self.distribute_strategy
        # Read by `step_hooks.step_logs` in `train_step`.
        self._multi_worker_logs = in_multi_worker_mode(strategy)
        if runs_steps_inline(strategy, self):
            self.train_function = make_multi_step_function(
                self, self.train_step, in_multi_worker_mode(strategy)
            )
            return self.train_function
        check_jit_replicas(self)
        return super().make_train_function(force=force)


def uses_collective_ops(strategy) -> bool:
    """True when the strategy all-reduces with collective ops."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return False
    ops = _compat.cross_device_ops(strategy)
    return type(ops).__name__ == "CollectiveAllReduce"


def runs_steps_inline(strategy, model) -> bool:
    """True where the fixed multi-step loop replaces Keras's (#19246).

    That is `steps_per_execution > 1` with collective all-reduce, on one host
    or several (`tfmemopt.distribute._multi_step` says why Keras's loop fails
    there). Elsewhere Keras's own loop works and runs.
    """
    steps = getattr(model, "steps_per_execution", 1) or 1
    return steps > 1 and uses_collective_ops(strategy)


def fixed_keras_model_class(base=keras.Model):
    """A subclass of `base` with the multi-worker fixes (for tests, examples).

    Its `train_step` is Keras's own with `expand_logs` applied.
    """

    class _Fixed(MultiWorkerFitFixes, base):
        def train_step(self, data):
            return expand_logs(super().train_step(data))

    _Fixed.__name__ = f"MultiWorker{base.__name__}"
    return _Fixed


def cpu_only_replicas(devices) -> bool:
    """True for two or more replica devices that are all CPUs."""
    devices = list(devices)
    return len(devices) > 1 and all(
        tf.DeviceSpec.from_string(d).device_type == "CPU" for d in devices
    )


def check_jit_replicas(model) -> None:
    """Raises for a `jit_compile=True` model mirrored on CPU devices."""
    if getattr(model, "jit_compile", False) is True:
        refuse_jit_replicas(model.distribute_strategy)


def refuse_jit_replicas(strategy) -> None:
    """Raises for XLA-compiled steps under `strategy` on CPU devices.

    Keras compiles `strategy.run` over all replicas into one XLA
    computation; XLA runs it on one device, so replica 1's variables (on
    CPU:1) cannot be read from CPU:0 (plain TensorFlow fails the same way).
    """
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return
    if not cpu_only_replicas(strategy.extended.worker_devices):
        return
    raise ValueError(
        "`jit_compile=True` does not work under MirroredStrategy on CPU "
        "devices, with or without tfmemopt: Keras compiles "
        "`strategy.run` over all replicas into one XLA computation, XLA "
        "runs it on one device, and TensorFlow fails with 'Trying to "
        "access resource ... located in device CPU:1 from device CPU:0' "
        "(keras-team/keras#19005). Compile with `jit_compile=False` (the "
        "default under a strategy). For XLA on CPUs, per replica, use "
        "auto-clustering instead: set the environment variable "
        "TF_XLA_FLAGS=--tf_xla_cpu_global_jit before importing TensorFlow "
        "and call `tf.config.optimizer.set_jit('autoclustering')`. "
        "Replicas on GPUs are not refused (untested). Received: "
        f"devices={list(strategy.extended.worker_devices)}."
    )
