"""`tfmemopt doctor` names ShardedOptimizer with several accelerators, with
the estimator's bytes per parameter, and not with one device."""

from __future__ import annotations

import json

import pytest

from tfmemopt.cli import _main as cli
from tfmemopt.tuning._state_options import sharding_per_parameter


def _report(sharding):
    return {
        "tensorflow": "2.x",
        "keras": "3.x",
        "python": "3.11",
        "TF_ENABLE_ONEDNN_OPTS": "1",
        "devices": [],
        "missing": {},
        "auto_policy": None,
        "sharding": sharding,
    }


@pytest.mark.parametrize(
    "optimizer, replicas, state, stage_1, stage_2",
    [
        # Adam: 16 -> 4 + 4 + 8/R; stage 2 on paper 4 + 12/R
        ("adam", 4, 8.0, 10.0, 7.0),
        ("adam", 8, 8.0, 9.0, 5.5),
        # SGD with momentum: 12 -> 4 + 4 + 4/R; 4 + 8/R
        ("sgd_momentum", 2, 4.0, 10.0, 8.0),
    ],
)
def test_sharding_bytes_per_parameter_come_from_the_estimator(
    optimizer, replicas, state, stage_1, stage_2
):
    import keras

    opt = (
        keras.optimizers.SGD(momentum=0.9)
        if optimizer == "sgd_momentum"
        else optimizer
    )
    s = sharding_per_parameter(opt, replicas)
    assert s["optimizer_state"] == pytest.approx(state)
    assert s["unwrapped"] == pytest.approx(8.0 + state)
    assert s["stage_1"] == pytest.approx(stage_1)
    assert s["stage_2"] == pytest.approx(stage_2)
    # shard_parameters: weights, gradients and state, all 1/R
    assert s["shard_parameters"] == pytest.approx((8.0 + state) / replicas)


def test_doctor_text_names_sharding_with_four_accelerators():
    text = cli._doctor_text(_report(sharding_per_parameter("adam", 4)))
    assert "4 accelerators" in text
    assert "tfmemopt.ShardedOptimizer keeps 1/4" in text
    assert "16.00 -> 10.00 bytes per parameter" in text
    assert "4.00 + 4.00 + 8.00/4" in text and "4.00 + 12.00/4 = 7.00" in text
    assert "tfmemopt.plan" in text
    assert "shard_parameters=True) shards the weights" in text
    assert "16.00 -> 4.00 bytes per parameter (16.00/4)" in text


def test_doctor_on_one_device_does_not_name_sharding(capsys):
    assert "Sharded" not in cli._doctor_text(_report(None))
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    accelerators = [
        d for d in report["devices"] if not d["device"].startswith("CPU")
    ]
    if len(accelerators) > 1:
        pytest.skip("this machine has several accelerators")
    assert report["sharding"] is None
    assert cli.main(["doctor"]) == 0
    assert "Sharded" not in capsys.readouterr().out
