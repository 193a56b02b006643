"""Trial training steps on the user's own model, with everything put back.

A trial trains `steps` steps at one batch size and measures the device's
peak memory. It runs on the model itself (a clone would double the weights
in memory, and TensorFlow keeps the variables captured by a traced function
alive after the function is dropped, so a throwaway optimizer leaks its
slots). Before the first trial the weights, optimizer variables (iteration
counter included), metric variables and the compiled train function are
saved; after every trial they are restored, so trials never change the
model. Cost: one host copy of the model and optimizer state.
"""

from __future__ import annotations

import gc
import logging

import keras
import numpy as np
import tensorflow as tf

from tfmemopt import memory
from tfmemopt.tuning._errors import first_line
from tfmemopt.tuning._errors import is_oom

_POOL = 256


class _NoRetracingWarning(logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warning.

    Every trial is a new batch size, so a new trace of the train function
    by design; after five TensorFlow warns that the user's code retraces
    too often, which it does not.
    """

    def filter(self, record):
        return "triggered tf.function retracing" not in record.getMessage()


def variable_bytes(variables) -> int:
    """Bytes held by `variables` (shape x dtype size)."""
    total = 0
    for v in variables:
        size = int(np.prod(v.shape)) if v.shape is not None else 0
        total += (
            size * np.dtype(keras.backend.standardize_dtype(v.dtype)).itemsize
        )
    return total


def counted_bytes(variables, device: str) -> int:
    """`variable_bytes` as `device`'s allocator statistics count them.

    oneDNN's CPU allocator keeps no statistics for allocations below
    256 KiB (tests/memory pins this): a trial's peak adds the state to the
    extra memory the steps needed, so the state is counted in the same
    units as that extra and as a fresh process's peak. (Counting a small
    model's biases and small kernels put a trial at batch 512 over a budget
    equal to a fresh process's peak at 512.)
    """
    if not device.upper().startswith("CPU"):
        return variable_bytes(variables)
    return sum(
        n for n in (variable_bytes([v]) for v in variables) if n >= 2**18
    )


def default_device() -> str:
    """The first accelerator TensorFlow sees here, else `"CPU:0"`."""
    for name in memory.local_devices():
        if not name.startswith("CPU"):
            return name
    return "CPU:0"


def _to_numpy(tree):
    return tf.nest.map_structure(
        lambda t: None if t is None else np.asarray(t), tree
    )


def sample_pool(data):
    """`(x, y, sample_weight)` of up to 256 samples (numpy) from `data`.

    `data` is x, `(x, y)` or `(x, y, sample_weight)` of arrays (x may be a
    dict or list), a batched `tf.data.Dataset`, or a `keras.utils.PyDataset`
    yielding any of these.
    """
    if isinstance(data, tf.data.Dataset):
        try:
            pool = list(data.unbatch().take(_POOL).batch(_POOL).take(1))
        except (tf.errors.InvalidArgumentError, ValueError) as e:
            raise ValueError(
                "`data` must be a batched tf.data.Dataset: its elements "
                "have no common leading (batch) dimension "
                f"(element_spec={data.element_spec}; {first_line(e)}). "
                "Pass dataset.batch(n)."
            ) from None
        if not pool:
            raise ValueError(
                "`data` is empty: the tf.data.Dataset yielded no samples. "
                "Pass a dataset with at least one batch."
            )
        data = pool[0]
    elif isinstance(data, keras.utils.PyDataset):
        if len(data) == 0:
            raise ValueError(
                "`data` is empty: the PyDataset has no batches. Pass one "
                "with at least one batch."
            )
        data = data[0]
    # As `fit`: x alone (an array, a dict or a tensor: a model trained on
    # `add_loss` terms has no y), `(x,)`, `(x, y)` or `(x, y, sw)`.
    if isinstance(data, list):
        data = tuple(data)
    if data is None or (isinstance(data, tuple) and len(data) not in (1, 2, 3)):
        raise TypeError(
            "`data` must be x, `(x, y)` or `(x, y, sample_weight)` of "
            "arrays, a batched tf.data.Dataset or a keras.utils.PyDataset "
            f"yielding them. Received: data of type {type(data).__name__}"
            + (f" with {len(data)} items" if hasattr(data, "__len__") else "")
            + "."
        )
    x, y, sw = keras.utils.unpack_x_y_sample_weight(data)
    x, y, sw = _to_numpy(x), _to_numpy(y), _to_numpy(sw)
    if x is None or any(
        a is not None and a.ndim == 0 for a in tf.nest.flatten((x, y, sw))
    ):
        raise TypeError(
            "`data` must be x, `(x, y)` or `(x, y, sample_weight)` of "
            "arrays with a batch dimension, a batched tf.data.Dataset or a "
            "keras.utils.PyDataset yielding them. Received: data of type "
            f"{type(data).__name__}."
        )
    sizes = {len(a) for a in tf.nest.flatten((x, y, sw)) if a is not None}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(
            "`data` is empty or its arrays disagree on the number of samples"
            f" (found sizes {sorted(sizes)}). Pass x and y with the same "
            "number (> 0) of samples."
        )
    n = sizes.pop()
    cut = slice(0, min(n, _POOL))
    pool = tf.nest.map_structure(
        lambda a: None if a is None else a[cut], (x, y, sw)
    )
    return pool, min(n, _POOL)


def _state_variables(model):
    seen, out = set(), []
    optimizer_vars = model.optimizer.variables if model.optimizer else []
    for v in (
        list(model.variables)
        + list(optimizer_vars)
        + list(model.metrics_variables)
    ):
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _assign_in_place(variable, value) -> None:
    """Copies `value` into the buffer `variable` already has.

    `variable.assign(array)` may instead adopt the buffer of the tensor
    made from `array` (TensorFlow forwards an input it holds the only
    reference to). On CPU that buffer can lie outside the allocator whose
    statistics are read: after a search, 132 MiB were counted for a
    144 MiB state. A slice assignment writes in place, so after the
    search the device memory in use is what it was before it.

    A slice assignment is a sparse access, which turns the variable into
    copy-on-read mode: every later read copies it. Each trial then counted
    the weights and slots again (a trial's peak 8 MiB above a fresh
    process's on a 13 MiB state, and the search returned 8 where 512
    fitted), and the user's model kept copying after the search.
    `read_value_no_copy` turns the variable back to copy-on-write.
    """
    target = getattr(variable, "value", variable)
    if isinstance(target, tf.Variable) and not isinstance(
        target, tf.distribute.DistributedValues
    ):
        target[...].assign(value)
        no_copy = getattr(target, "read_value_no_copy", None)
        if no_copy is not None:
            no_copy()
    else:
        variable.assign(value)


class TrialRunner:
    """Runs trial steps on `model` and restores it (a context manager).

    Args:
        model: A compiled `keras.Model`.
        data: What `sample_pool` accepts.
        steps: Int, training steps per trial (the peak is over all of them,
            the first one included: it allocates what training needs).
        device: Str or `None`, the device whose memory is measured.
    """

    def __init__(self, model, data, steps: int = 2, device: str | None = None):
        if not isinstance(model, keras.Model):
            raise TypeError(
                "`model` must be a keras.Model. Received: model of type "
                f"{type(model).__name__}."
            )
        if not getattr(model, "compiled", False) or model.optimizer is None:
            raise ValueError(
                "`model` must be compiled with an optimizer and a loss before "
                "its memory can be measured: call `model.compile(optimizer="
                "..., loss=...)` first."
            )
        self.model = model
        self.steps = steps
        self.device = device or default_device()
        self.pool, self.n = sample_pool(data)
        self.stats = memory.stats_available(self.device)
        self._saved = None
        self._quiet = _NoRetracingWarning()

    def __enter__(self):
        model = self.model
        x = self.pool[0]
        if not model.built:
            model(tf.nest.map_structure(lambda a: a[:1], x))
        if not model.optimizer.built:
            # Zeros, as the first training step would create them.
            with model.distribute_strategy.scope():
                model.optimizer.build(model.trainable_variables)
        self._variables = _state_variables(model)
        self._saved = [np.array(v.numpy()) for v in self._variables]
        self._train_function = model.train_function
        self.resident_bytes = counted_bytes(
            list(model.variables) + list(model.optimizer.variables),
            self.device,
        )
        logging.getLogger("tensorflow").addFilter(self._quiet)
        return self

    def restore(self):
        for v, value in zip(self._variables, self._saved):
            _assign_in_place(v, value)

    def __exit__(self, *exc):
        logging.getLogger("tensorflow").removeFilter(self._quiet)
        self.restore()
        self.model.train_function = self._train_function
        gc.collect()
        return False

    def batch(self, batch_size: int):
        index = np.arange(batch_size) % self.n
        return tf.nest.map_structure(
            lambda a: None if a is None else np.take(a, index, axis=0),
            self.pool,
        )

    def run(self, batch_size: int):
        """Returns `(peak_bytes or None, oom_message or "")` for one trial.

        `peak_bytes` counts the model and optimizer state plus the most
        that the trial steps needed above what was allocated before them.
        """
        model = self.model
        x, y, sw = self.batch(batch_size)
        model.train_function = None

        def steps():
            for _ in range(self.steps):
                if y is None and sw is None:
                    # x alone reaches `train_step` as `fit` gives it (a
                    # model with its own train_step, keras-io's VAE, reads
                    # `data` as x; `train_on_batch` gives `(x, None, None)`).
                    model.fit(x, batch_size=batch_size, epochs=1, verbose=0)
                else:
                    model.train_on_batch(x, y, sample_weight=sw)

        try:
            if self.stats:
                extra, _ = memory.measure_peak(steps, self.device)
                peak = self.resident_bytes + extra
            else:
                steps()
                peak = None
            return peak, ""
        except Exception as e:  # noqa: BLE001 - only OOMs are handled
            if not is_oom(e):
                raise
            return None, first_line(e, 200)
        finally:
            model.train_function = None
            self.restore()
            gc.collect()
