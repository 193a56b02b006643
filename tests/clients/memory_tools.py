"""The memory tools on each client: estimate, find_batch_size, plan.

`memory_tools(name)` measures, in the calling process (run the loop in a
fresh one, see tests/clients/test_memory_tools.py), for one client of
`models.CLIENTS` at its `peak_batch` (below it the tensors of these tiny
models are under the 256 KiB that oneDNN's CPU allocator statistics count):

1. the peak of a plain Keras training step (Adam, as `compile_kwargs`)
   above the memory in use before the model was built (median of 3 steps
   after a warm-up step), and `tfmemopt.estimate_memory` for the same model,
   batch and optimizer, with `min_counted_bytes=CPU_STATS_MIN_BYTES` (what
   the statistics can see);
2. `tfmemopt.find_batch_size` with a budget `FIND_SLACK` above that measured
   peak: every trial it calls fitting is within the budget, the batch that
   was measured fits;
3. `tfmemopt.plan(model, peak_batch, budget)` with a budget halfway between
   the estimated model state and the estimated plain step; `Plan.apply`,
   then the measured step peak of the applied plan.

Variable-length inputs (keras-hub's `token_ids`, the BiLSTM, the captcha
labels) are sized as a user would: `input_shape=` from the data.
"""

from __future__ import annotations

import gc
import statistics
import time

import keras
import tensorflow as tf

import tfmemopt
from tfmemopt.estimate import CPU_STATS_MIN_BYTES
from tfmemopt.memory import device_memory
from tfmemopt.memory import reset_peak

from .models import CLIENTS
from .models import compile_kwargs

FIND_SLACK = 1.2  # find_batch_size's budget over the measured peak
PLAN_FRACTION = 0.7  # plan's budget: state + this of the rest
ALLOW = ("accumulation",)
# The BiLSTM's per-time-step tensors are (batch, 8) float32: 64 KiB at its
# peak_batch of 2048, invisible to the statistics (the estimate counts its
# loop lists by element now: 6.0 MiB against 6.5 measured, where it counted
# them whole, 30.4); at 8192 each step's tensor is 256 KiB and counted.
BATCH = {"kio_bilstm_masked": 8192}


def _input_shape(x):
    """One sample's shape per input, as `estimate_memory` takes it."""
    return tf.nest.map_structure(lambda a: tuple(a.shape[1:]), x)


def _step_peaks(model, x, y, sw, base, steps=3):
    """Peaks of `steps` training steps above `base`, after a warm-up."""
    model.train_on_batch(x, y, sample_weight=sw)  # trace, build slots
    peaks = []
    for _ in range(steps):
        reset_peak("CPU:0")
        model.train_on_batch(x, y, sample_weight=sw)
        peaks.append(device_memory("CPU:0")["peak"] - base)
    return peaks


def memory_tools(name: str, find: bool = True, plan: bool = True) -> dict:
    client = CLIENTS[name]
    batch = BATCH.get(name, client.peak_batch)
    x, y, sw = keras.utils.unpack_x_y_sample_weight(client.fit_data(batch))
    shape = _input_shape(x)
    keras.backend.clear_session()
    gc.collect()
    t0 = time.perf_counter()
    base = device_memory("CPU:0")["current"]
    model = client.model()
    model.compile(**compile_kwargs(client))
    measured = int(statistics.median(_step_peaks(model, x, y, sw, base)))
    est = tfmemopt.estimate_memory(
        model,
        batch,
        input_shape=shape,
        min_counted_bytes=CPU_STATS_MIN_BYTES,
    )
    out = {
        "batch": batch,
        "measured": measured,
        "estimate": est.total,
        "error": est.total / measured - 1,
    }

    if find:
        budget = int(measured * FIND_SLACK)
        found = tfmemopt.find_batch_size(
            model,
            (x, y, sw) if y is not None else x,
            memory_budget=budget,
            max_batch_size=batch,
            multiple_of=batch,
            steps_per_trial=1,
            verbose=0,
        )
        out["find"] = {
            "budget": budget,
            "batch_size": found.batch_size,
            "largest_fitting": found.largest_fitting,
            "trials": [
                [t.batch_size, bool(t.fits), t.peak_bytes, t.reason]
                for t in found.trials
            ],
        }

    if plan:
        # Twice the batch, so that the plan's micro-batches are about
        # `batch` (their tensors visible to the statistics).
        big = 2 * batch
        x2, y2, sw2 = keras.utils.unpack_x_y_sample_weight(client.fit_data(big))
        full = tfmemopt.estimate_memory(model, big, input_shape=shape)
        state = full.parameters + full.gradients + full.optimizer_state
        budget = int(state + PLAN_FRACTION * (full.total - state))
        p = tfmemopt.plan(model, big, budget, allow=ALLOW, input_shape=shape)
        applied = p.apply(model)
        applied_peak = max(_step_peaks(applied, x2, y2, sw2, base, 1))
        out["plan"] = {
            "batch": big,
            "budget": budget,
            "plain_estimate": full.total,
            "state": state,
            "micro_batch_size": p.micro_batch_size,
            "accumulation_steps": p.accumulation_steps,
            "checkpointing": p.checkpointing,
            "estimated_peak": p.estimated_peak,
            "measured": applied_peak,
        }
    out["seconds"] = time.perf_counter() - t0
    del model
    keras.backend.clear_session()
    gc.collect()
    return out


def all_clients(names=None, **kwargs) -> dict:
    return {n: memory_tools(n, **kwargs) for n in names or CLIENTS}
