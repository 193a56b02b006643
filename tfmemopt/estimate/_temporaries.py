"""The temporaries term of the estimate: what the step holds at its peak
beyond the weights, state, gradients, activations and inputs.

The backward pass's own temporaries (from the simulated step), the
all-reduce's packed copy of the gradients, the optimizer update's
temporaries (`_update`), the gradients the update frees as the backward
pass makes them (`freed`), the same under `shard_parameters`, and, with
`min_counted_bytes` (a CPU), what the allocator's whole chunks and
Grappler's rewrite of large gradient sums add.
"""

from __future__ import annotations

import math

from tfmemopt._utils import format_bytes
from tfmemopt.distribute import ShardedOptimizer
from tfmemopt.estimate._kernels import rewritten_sum_zeros
from tfmemopt.estimate._model_state import weight_bytes
from tfmemopt.estimate._settings import Settings
from tfmemopt.estimate._settings import counted
from tfmemopt.estimate._update import chunks
from tfmemopt.estimate._update import update_temporaries


def step_temporaries(trainable, step, s: Settings, grads, activations):
    """`(temporaries, freed, update)`: what the step holds beyond the
    weights, state, gradients, activations and inputs at its peak.

    The backward pass's own temporaries (the simulated peak less what is
    counted elsewhere), the all-reduce's packed copy of the gradients, the
    optimizer update's temporaries once the activations are freed, and,
    where the update starts during the backward pass, the gradients it
    frees (`freed`), with what it keeps from the first step on.
    """
    # The simulated peak holds the gradients that exist at that point, as
    # the step makes them (an embedding's as its gathered rows); what is
    # above the activations, the inputs and the dense gradients counted
    # in `gradients` is a temporary.
    temporaries = max(0, step.peak - step.saved - grads - step.inputs)
    if s.replicas > 1:  # the all-reduce's packed copy of the gradients
        temporaries += grads
    # After the backward pass (and the all-reduce) the optimizer updates
    # each weight with temporaries of the weight's size; the activations
    # are freed by then.
    shards = s.replicas if isinstance(s.optimizer, ShardedOptimizer) else 1
    # A sparse gradient is updated as the whole batch's rows (under
    # accumulation, every micro-batch's concatenated).
    n_micro = s.per_replica // s.micro
    update = update_temporaries(
        [(math.prod(v.shape), weight_bytes(v, s)) for v in trainable],
        s.optimizer,
        lambda n: counted(n, s),
        shards,
        {i: n * n_micro for i, n in step.sparse_values.items()},
    )
    after = step.gradients + update.peak - grads - activations
    temporaries = max(temporaries, after)
    freed = 0
    if step.updating_peak is not None:
        # Each gradient is consumed as it is made: by its weight's update,
        # or added into its accumulator (then the window's update comes
        # after the last micro-batch, with every gradient).
        during = max(0, step.updating_peak - step.saved - step.inputs)
        end = after + grads + activations if s.accumulation_steps > 1 else 0
        x = max(activations + during, end) - grads - activations
        temporaries, freed = max(0, x), max(0, -x)
    temporaries += update.resident  # allocated from the first step on
    return temporaries, freed, update


def sharded_temporaries(trainable, step, s: Settings, whole_grads):
    """`(temporaries, freed, update)` under `shard_parameters`.

    Each weight's gradient is made whole by the backward pass, all-reduced
    (a whole-size result) and sliced to this replica's shard as soon as
    it is made (the all-gather's gradient): the step is simulated with
    each gradient consumed by one whole-size temporary (`consumers`), so
    the backward pass holds the transient whole gradients of the weights
    whose backward is running, not all of them. The optimizer then updates
    the shards (its temporaries are of the shard's size); the activations
    and gathered weights are freed by then.
    """
    weights = [(math.prod(v.shape), weight_bytes(v, s)) for v in trainable]
    update = update_temporaries(
        weights, s.optimizer, lambda n: counted(n, s), s.replicas
    )
    peak = step.updating_peak
    if peak is None:  # not simulated: every whole gradient alive at once
        peak = step.peak
    during = max(0, peak - step.saved - step.inputs)
    return max(during, update.peak) + update.resident, 0, update


def cpu_allocator(model, trainable, step, s: Settings, update, notes):
    """What the CPU statistics' allocator adds (with `min_counted_bytes`):
    its whole chunks, and the zeros of Grappler's rewrite of large gradient
    sums (docs/estimator.md: both model the CPU, not a GPU)."""
    extra = chunks(
        [counted(weight_bytes(v, s), s) for v in model.weights],
        [counted(weight_bytes(v, s), s) for v in trainable],
        s.optimizer,
        s.accumulation_steps > 1,
        step,
        s.per_replica // s.micro,
        update,
    )
    zeros = rewritten_sum_zeros(step)
    if zeros:
        notes.append(
            "Grappler rewrites gradient sums alive at the peak into "
            "accumulations; their zeros stay allocated "
            f"({format_bytes(zeros)}; the CPU device's 256 MiB)"
        )
    return extra + zeros
