"""plan() proposes `shard_parameters=True` (FSDP) when the model state does
not fit even with the optimizer state sharded, and the strategy has
replicas; the plan says what it keeps and what it costs (estimator only)."""

from __future__ import annotations

import inspect
import math

import keras
import numpy as np
import pytest

import tfmemopt
from tfmemopt.distribute import ShardedOptimizer
from tfmemopt.tuning._planner import ALLOW as ALL
from tfmemopt.tuning._state_options import alternatives

MARGIN = inspect.signature(tfmemopt.plan).parameters["margin"].default


def mlp():
    # 1,351,690 parameters, mostly five 512x512 matrices; tiny activations.
    model = keras.Sequential(
        [keras.Input((64,))]
        + [keras.layers.Dense(512) for _ in range(6)]
        + [keras.layers.Dense(10)]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return model


def test_plan_shards_the_parameters_when_sharded_state_does_not_fit():
    model = mlp()
    stage1 = tfmemopt.estimate_memory(
        model,
        8,
        optimizer=ShardedOptimizer(keras.optimizers.Adam()),
        replicas=4,
    )
    fsdp = tfmemopt.estimate_memory(model, 8, replicas=4, shard_parameters=True)
    budget = int(fsdp.total * 1.02 / (1 - MARGIN))
    assert stage1.total > budget * (1 - MARGIN)  # stage 1 does not fit
    p = tfmemopt.plan(
        model,
        8,
        budget,
        replicas=4,
        allow=("accumulation", "checkpointing", "sharding"),
    )
    assert p.shard_parameters and p.sharding is None and p.optimizer is None
    assert p.accumulation_steps == 1 and p.replicas == 4
    assert p.estimated_peak <= budget * (1 - MARGIN)
    assert p.model_kwargs["shard_parameters"] is True
    assert "shard_parameters=True keeps 1/4" in p.why
    assert "16.00 bytes per parameter" in p.why  # Adam, whole weights
    assert "4.00 bytes per parameter per replica" in p.why  # 16 / 4
    assert "shard_parameters=True" in str(p)
    # Applied (no strategy here: nothing is sharded, the flag is set).
    applied = p.apply(model)
    assert applied.shard_parameters is True
    x = np.zeros((8, 64), "float32")
    assert applied.predict(x, verbose=0).shape == (8, 10)
    # One replica, or sharding not allowed: never tried.

    adam = keras.optimizers.Adam()
    assert any(a.shard_parameters for a in alternatives(adam, ALL, 4))
    assert not any(a.shard_parameters for a in alternatives(adam, ALL, 1))
    no_sharding = tuple(a for a in ALL if a != "sharding")
    assert not any(
        a.shard_parameters for a in alternatives(adam, no_sharding, 4)
    )


def test_plan_shards_the_parameters_with_accumulation_when_needed():
    # At 512 samples per replica the sharded step does not fit, with 2
    # micro-batches it does (the accumulators hold the shards, float32):
    # the plan takes both, fewest micro-batches first.
    model = mlp()

    def fsdp(steps):
        return tfmemopt.estimate_memory(
            model,
            2048,
            replicas=4,
            shard_parameters=True,
            accumulation_steps=steps,
        )

    one, two = fsdp(1), fsdp(2)
    shards = sum(-(-math.prod(v.shape) // 4) for v in model.trainable_weights)
    assert two.accumulation == 4 * shards  # float32, 1/4 of each weight
    assert one.accumulation == 0 and two.total < one.total
    budget = int((one.total + two.total) / 2 / (1 - MARGIN))
    p = tfmemopt.plan(
        model, 2048, budget, replicas=4, allow=("accumulation", "sharding")
    )
    assert p.shard_parameters and p.accumulation_steps == 2, str(p)
    assert p.estimated_peak == two.total
    # The sharded step without accumulation was tried first and did not fit.
    sharded_one = [
        c
        for c in p.considered
        if c.get("shard_parameters")
        and c["accumulation_steps"] == 1
        and c["checkpointing"] is None
    ]
    assert [c["peak"] for c in sharded_one] == [one.total]
    kwargs = p.model_kwargs
    assert kwargs["accumulation_steps"] == 2 and kwargs["shard_parameters"]


def test_plan_proposes_bfloat16_weights_when_no_float32_state_fits():
    from tfmemopt.optimizers import Adafactor
    from tfmemopt.optimizers import AdamW8bit

    model = mlp()
    factored = tfmemopt.estimate_memory(model, 8, optimizer=Adafactor())
    bf16 = tfmemopt.estimate_memory(
        model, 8, optimizer=AdamW8bit(), policy="bfloat16"
    )
    # bfloat16 weights + 8-bit moments hold less than float32 weights and
    # gradients alone (8 bytes per parameter).
    assert bf16.parameters + bf16.gradients == model.count_params() * 4
    budget = int(bf16.total * 1.02 / (1 - MARGIN))
    assert factored.total > budget * (1 - MARGIN)
    p = tfmemopt.plan(model, 8, budget, replicas=1)
    assert p.policy == "bfloat16" and p.optimizer == "Adam8bit"
    assert p.estimated_peak <= budget * (1 - MARGIN)
    assert "bfloat16 weights (policy 'bfloat16')" in p.why
    assert "2-byte gradients" in p.why and "seed spread" in p.why
    applied = p.apply(model)
    assert any(w.dtype == "bfloat16" for w in applied.weights)
    assert applied.optimizer.bf16_update is None  # stochastic rounding
    # Without 'mixed_precision' allowed: not proposed (nothing fits).
    with pytest.raises(ValueError):
        tfmemopt.plan(
            model,
            8,
            budget,
            replicas=1,
            allow=("accumulation", "checkpointing", "optimizer_state"),
        )
