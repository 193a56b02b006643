"""plan() shrinks the model state itself when it leaves too little memory:
ShardedOptimizer across replicas, 8-bit or factored optimizer states; the
OOM report says so (estimator only: no multi-device run needed)."""

from __future__ import annotations

import inspect

import keras
import numpy as np
import pytest

import tfmemopt
from tfmemopt.optimizers import Adafactor
from tfmemopt.optimizers import Adam8bit
from tfmemopt.optimizers import AdamW8bit
from tfmemopt.tuning._oom import build_report

MARGIN = inspect.signature(tfmemopt.plan).parameters["margin"].default


def mlp(optimizer):
    # 1,351,690 parameters, mostly five 512x512 matrices; tiny activations.
    # (With two, an 8-bit step's update temporaries, now estimated, cost
    # more than the state it saves: Adam8bit measured 6.0 MiB, Adam 5.0.)
    model = keras.Sequential(
        [keras.Input((64,))]
        + [keras.layers.Dense(512) for _ in range(6)]
        + [keras.layers.Dense(10)]
    )
    model.compile(optimizer=optimizer, loss="mse")
    return model


def state(est) -> int:
    return est.parameters + est.gradients + est.optimizer_state


def budget_for(peak) -> int:
    """A budget in which `peak` just fits (2% above, after the margin)."""
    return int(peak * 1.02 / (1 - MARGIN))


@pytest.mark.parametrize(
    "make, twin, cls",
    [
        (
            lambda: keras.optimizers.AdamW(
                2e-3, weight_decay=0.01, beta_1=0.8, epsilon=1e-6, clipnorm=1.0
            ),
            "AdamW8bit",
            AdamW8bit,
        ),
        (
            lambda: keras.optimizers.Adam(2e-3, beta_2=0.99, epsilon=1e-6),
            "Adam8bit",
            Adam8bit,
        ),
    ],
)
def test_plan_switches_to_8bit_when_the_adam_state_does_not_fit(
    make, twin, cls
):
    model = mlp(make())
    adam = tfmemopt.estimate_memory(model, 8)
    eight = tfmemopt.estimate_memory(model, 8, optimizer=cls())
    budget = budget_for(eight.total)
    # Adam's state alone does not fit in what the margin leaves: no split
    # of the batch can help.
    assert state(adam) > budget * (1 - MARGIN)
    p = tfmemopt.plan(model, 8, budget, replicas=1)
    assert p.optimizer == twin and p.sharding is None
    assert p.estimated_peak <= budget * (1 - MARGIN)
    assert f"tfmemopt.optimizers.{twin}" in str(p)
    # 16 bytes per parameter with Adam -> 8 + its ~2.05 bytes of state.
    assert "16.00 bytes per parameter" in p.why
    per = 8 + eight.optimizer_state / (eight.gradients / 4)
    assert f"{per:.2f} bytes per parameter" in p.why
    # Applied, the model trains with the twin, the same arguments, and the
    # estimate of what is applied fits.
    applied = p.apply(model)
    assert isinstance(applied.optimizer, cls)
    old, new = model.optimizer.get_config(), applied.optimizer.get_config()
    keys = ("learning_rate", "weight_decay", "beta_1", "beta_2", "epsilon")
    for key in keys + ("clipnorm",):
        assert new[key] == pytest.approx(old[key]), key
    under = tfmemopt.estimate_memory(applied, 8)
    assert under.total <= budget * (1 - MARGIN)
    x = np.zeros((16, 64), "float32")
    applied.fit(x, np.zeros((16, 10), "float32"), batch_size=8, verbose=0)
    assert int(applied.optimizer.iterations) == 2


def test_plan_switches_to_adafactor_when_8bit_does_not_fit_either():
    model = mlp(keras.optimizers.AdamW())
    eight = tfmemopt.estimate_memory(model, 8, optimizer=AdamW8bit())
    factored = tfmemopt.estimate_memory(model, 8, optimizer=Adafactor())
    budget = budget_for(factored.total)
    assert eight.total > budget * (1 - MARGIN)
    p = tfmemopt.plan(model, 8, budget, replicas=1)
    assert p.optimizer == "Adafactor" and p.sharding is None
    assert isinstance(p.apply(model).optimizer, Adafactor)
    # Not with optimizer_state left out: then nothing fits, and the error
    # still names the small-state optimizers.
    with pytest.raises(ValueError, match="AdamW8bit keeps about"):
        tfmemopt.plan(model, 8, budget, allow=("accumulation",))


def test_plan_shards_the_state_over_four_replicas():
    model = mlp(keras.optimizers.AdamW())
    whole = tfmemopt.estimate_memory(model, 8, replicas=4)
    sharded = tfmemopt.estimate_memory(
        model,
        8,
        optimizer=tfmemopt.ShardedOptimizer(keras.optimizers.AdamW()),
        replicas=4,
    )
    assert sharded.optimizer_state <= whole.optimizer_state / 4 + 64
    budget = budget_for(sharded.total)
    assert whole.total > budget * (1 - MARGIN)
    p = tfmemopt.plan(model, 8, budget, replicas=4)
    assert p.sharding == 1 and p.optimizer is None and p.replicas == 4
    assert p.estimated_peak == sharded.total  # the estimate under the plan
    assert p.estimated_peak <= budget * (1 - MARGIN)
    assert "tfmemopt.ShardedOptimizer(AdamW, stage=1)" in str(p)
    # 16 -> 4 + 4 + 8/4 = 10 bytes per parameter per replica (stage 1),
    # 4 + 12/4 = 7 on paper for stage 2, from the estimates.
    assert "16.00 bytes per parameter" in p.why
    assert "(8.00/4, 1/4 per replica): 10.00 bytes per parameter" in p.why
    assert "4.00 + 12.00/4 = 7.00" in p.why
    # ShardedOptimizer must be created in the strategy's scope.
    with pytest.raises(ValueError, match="inside `strategy.scope\\(\\)`"):
        p.apply(model)
    # Without "sharding" allowed: the 8-bit twin instead.
    p8 = tfmemopt.plan(
        model, 8, budget, replicas=4, allow=("accumulation", "optimizer_state")
    )
    assert p8.optimizer == "AdamW8bit" and p8.sharding is None
    # One replica: sharding is never proposed.
    p1 = tfmemopt.plan(model, 8, budget, replicas=1)
    assert p1.sharding is None


def test_plan_keeps_the_optimizer_when_the_state_fits():
    model = mlp(keras.optimizers.AdamW())
    p = tfmemopt.plan(model, 8, "1GiB", replicas=4)
    assert p.optimizer is None and p.sharding is None
    assert all(c["optimizer"] is None for c in p.considered)
    assert "optimizer=" not in str(p)


def test_plan_takes_replicas_from_the_active_strategy():
    model = mlp(keras.optimizers.AdamW())
    p = tfmemopt.plan(model, 8, "1GiB")  # no strategy: one replica
    assert p.replicas == 1


@pytest.mark.parametrize("replicas", [1, 4])
def test_oom_report_names_sharding_only_with_several_replicas(replicas):
    model = mlp(keras.optimizers.AdamW())
    sharded = tfmemopt.estimate_memory(
        model,
        8,
        optimizer=tfmemopt.ShardedOptimizer(keras.optimizers.AdamW()),
        replicas=4,
    )
    budget = budget_for(sharded.total)
    report = build_report(
        RuntimeError("OOM when allocating tensor"),
        model,
        8,
        budget,
        "CPU:0",
        replicas=replicas,
    )
    text = str(report)
    assert report.plan is not None, report.plan_error
    if replicas == 4:
        assert report.plan.sharding == 1
        assert "ShardedOptimizer(AdamW, stage=1)" in text
        assert "1/4 per replica" in text
    else:
        assert "Sharded" not in text
        assert report.plan.optimizer == "AdamW8bit"
        assert "tfmemopt.optimizers.AdamW8bit" in text


def test_cli_plan_allows_sharding_and_optimizer_state(tmp_path, capsys):
    import json

    from tfmemopt.cli import _main as cli

    model = mlp(keras.optimizers.AdamW())
    path = str(tmp_path / "m.keras")
    model.save(path)
    sharded = tfmemopt.estimate_memory(
        model,
        8,
        optimizer=tfmemopt.ShardedOptimizer(keras.optimizers.AdamW()),
        replicas=4,
    )
    memory = str(budget_for(sharded.total))
    args = ["plan", path, "--batch-size", "8", "--memory", memory, "--json"]
    assert cli.main(args + ["--replicas", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sharding"] == 1 and out["optimizer"] is None
    allow = ["--allow", "accumulation,optimizer_state", "--replicas", "4"]
    assert cli.main(args + allow) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["optimizer"] == "AdamW8bit" and out["sharding"] is None
    # Only shrinking activations: nothing fits, the error names them.
    assert cli.main(args + ["--allow", "accumulation"]) == 2
    assert "AdamW8bit keeps about" in capsys.readouterr().err


_MIRRORED = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)
import keras, numpy as np, tfmemopt
strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
with strategy.scope():
    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512),
                          keras.layers.Dense(512), keras.layers.Dense(10)])
    m.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="mse")
sharded = tfmemopt.ShardedOptimizer(keras.optimizers.AdamW())
est = tfmemopt.estimate_memory(m, 8, optimizer=sharded, replicas=2)
p = tfmemopt.plan(m, 8, int(est.total * 1.02 / 0.75))  # outside the scope
assert p.replicas == 2 and p.sharding == 1, p
with strategy.scope():
    a = p.apply(m)
assert type(a.optimizer.inner_optimizer).__name__ == "AdamW"
before = [w.copy() for w in a.get_weights()]
a.fit(np.ones((16, 64), "float32"), np.ones((16, 10), "float32"),
      batch_size=8, verbose=0)
assert any(np.abs(b - w).max() > 0 for b, w in zip(before, a.get_weights()))
print("OK", p.estimated_peak)
"""


@pytest.mark.slow
def test_sharded_plan_applies_and_trains_under_mirrored_strategy():
    # Two logical CPUs must be set before TensorFlow starts: a subprocess.
    import os
    import subprocess
    import sys

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-c", _MIRRORED],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK" in proc.stdout


def test_long_sequence_options_that_do_not_fit_are_not_kept():
    # An MLP's 10 KiB of logits: chunked_loss=True did not make it fit, and
    # came back beside the 8-bit state and checkpointing "auto", which this
    # model's first fit refuses (fresh-user trial).
    inputs = keras.Input((512,))
    h = inputs
    for _ in range(4):
        h = keras.layers.Dense(1024, activation="relu")(h)
    model = keras.Model(inputs, keras.layers.Dense(10)(h))
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    p = tfmemopt.plan(model, global_batch_size=256, memory_budget="56MiB")
    assert p.optimizer is not None, str(p)  # the state had to shrink
    assert not p.model_kwargs.get("chunked_loss"), p.model_kwargs
    assert not p.model_kwargs.get("attention"), p.model_kwargs
