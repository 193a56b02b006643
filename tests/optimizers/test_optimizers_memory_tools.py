"""The memory tools know the small-state optimizers: estimate_memory counts
their true state, plan() and the OOM report name them."""

import keras
import numpy as np
import pytest

import tfmemopt
from tfmemopt.optimizers import Adafactor
from tfmemopt.optimizers import Adam8bit
from tfmemopt.optimizers import AdamW8bit
from tfmemopt.tuning._planner import MARGIN


def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential(
        [
            keras.Input((300,)),
            keras.layers.Dense(513, activation="relu"),
            keras.layers.Dense(70),
            keras.layers.Dense(10),
        ]
    )
    return m


def built_state_bytes(opt, variables):
    opt.build(variables)
    skip = {id(opt.iterations)}
    lr = getattr(opt, "_learning_rate", None)
    if isinstance(lr, keras.Variable):
        skip.add(id(lr))
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        for v in opt.variables
        if id(v) not in skip
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: AdamW8bit(),
        lambda: Adam8bit(block_size=100, min_8bit_size=0, amsgrad=True),
        lambda: Adafactor(),
        lambda: Adafactor(beta_1=0.9),
    ],
)
def test_estimate_memory_counts_the_true_state(make):
    m = model()
    est = tfmemopt.estimate_memory(m, 16, optimizer=make())
    assert est.optimizer_state == built_state_bytes(
        make(), m.trainable_variables
    )


def test_plan_names_small_state_optimizers_when_state_does_not_fit():
    m = model()
    m.compile(keras.optimizers.AdamW(), "mse")
    est = tfmemopt.estimate_memory(m, 16)
    state = est.parameters + est.gradients + est.optimizer_state
    with pytest.raises(ValueError, match="AdamW8bit keeps about") as info:
        tfmemopt.plan(m, 16, int(state * 0.8), allow=("accumulation",))
    assert "Adafactor" in str(info.value)
    # with AdamW8bit the same model's state is about a third
    est8 = tfmemopt.estimate_memory(m, 16, optimizer=AdamW8bit())
    assert est8.optimizer_state < 0.27 * est.optimizer_state


def test_oom_report_names_them():
    from tfmemopt.tuning._oom import build_report

    # Six 512x512 kernels: the 8-bit state saves more than its update's
    # temporaries cost (on model()'s 190k parameters it does not: the 8-bit
    # step is estimated, and measured, above Adam's state budget here).
    keras.utils.set_random_seed(0)
    m = keras.Sequential(
        [keras.Input((300,))]
        + [keras.layers.Dense(512) for _ in range(6)]
        + [keras.layers.Dense(10)]
    )
    m.compile(keras.optimizers.Adam(), "mse")
    est = tfmemopt.estimate_memory(m, 16)
    est8 = tfmemopt.estimate_memory(m, 16, optimizer=Adam8bit())
    # A budget the 8-bit step fits with the planner's margin and Adam's
    # step (whose activations are tiny: accumulation cannot help) does not.
    budget = int(est8.total / (1 - MARGIN) * 1.05)
    assert est.total > (1 - MARGIN) * budget, (est.total, budget)
    report = build_report(
        RuntimeError("OOM when allocating tensor"), m, 16, budget, "CPU:0"
    )
    # The plan in the report switches Adam to its 8-bit twin (one replica:
    # no sharding).
    assert report.plan is not None, report.plan_error
    assert report.plan.optimizer == "Adam8bit"
    assert "tfmemopt.optimizers.Adam8bit" in str(report)
    assert "Sharded" not in str(report)
