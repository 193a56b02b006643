"""auto_strategy / describe / keras.distribution refusal (in process).

Each branch of `auto_strategy` is tested by injecting an `Environment`;
builders that would need hardware (TPU, GPUs, a cluster) are replaced, so no
test here touches a network address.
"""

import json

import keras
import pytest
import tensorflow as tf
from conftest import run_in_subprocess

import tfmemopt
from tfmemopt.distribute import Environment
from tfmemopt.distribute import _auto_strategy
from tfmemopt.distribute._auto_strategy import plan_strategy
from tfmemopt.distribute._environment import parse_tf_config
from tfmemopt.distribute._keras_distribution import check_keras_distribution

TWO_WORKERS = {
    "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
    "task": {"type": "worker", "index": 0},
}


@pytest.fixture
def built(monkeypatch):
    """Replaces the hardware builders; records what they were asked for."""
    calls = []

    def fake(kind):
        def build(plan, cross_device_ops):
            calls.append((kind, plan, cross_device_ops))
            return tf.distribute.get_strategy()

        return build

    for kind in ("tpu", "multi_worker", "mirrored"):
        monkeypatch.setitem(_auto_strategy.BUILDERS, kind, fake(kind))
    return calls


@pytest.mark.parametrize(
    "env, tpu, kind, tpu_arg",
    [
        (Environment(), "my-tpu", "tpu", "my-tpu"),
        (Environment(tpu_name="grpc://10.0.0.2:8470"), None, "tpu", None),
        (Environment(tpu_devices=4), None, "tpu", "local"),
        (Environment(tf_config=TWO_WORKERS), None, "multi_worker", None),
        (Environment(gpus=("GPU:0", "GPU:1")), None, "mirrored", None),
    ],
    ids=["tpu-arg", "tpu-env", "tpu-devices", "tf-config", "gpus"],
)
def test_each_branch_builds_what_was_detected(built, env, tpu, kind, tpu_arg):
    ops = object()
    tfmemopt.distribute.auto_strategy(
        tpu=tpu, cross_device_ops=ops, environment=env
    )
    assert len(built) == 1
    got_kind, plan, got_ops = built[0]
    assert got_kind == kind
    assert got_ops is ops
    if kind == "tpu":
        assert plan.tpu == (tpu_arg or env.tpu_name)
    if kind == "mirrored":
        assert plan.devices == ("GPU:0", "GPU:1")


def test_priority_order():
    everything = Environment(
        tpu_name="t", tpu_devices=8, tf_config=TWO_WORKERS, gpus=("a", "b")
    )
    assert plan_strategy(everything).kind == "tpu"
    assert plan_strategy(everything, tpu="explicit").tpu == "explicit"
    no_tpu = Environment(tf_config=TWO_WORKERS, gpus=("a", "b"))
    assert plan_strategy(no_tpu).kind == "multi_worker"
    one_worker = dict(TWO_WORKERS, cluster={"worker": ["127.0.0.1:1"]})
    assert plan_strategy(Environment(tf_config=one_worker)).kind == "default"
    assert plan_strategy(Environment(gpus=("GPU:0",))).kind == "default"


def test_active_strategy_wins_over_everything(built):
    strategy = tf.distribute.OneDeviceStrategy("CPU:0")
    env = Environment(
        active_strategy=strategy, tpu_devices=8, tf_config=TWO_WORKERS
    )
    got = tfmemopt.distribute.auto_strategy(tpu="x", environment=env)
    assert got is strategy
    assert built == []


def test_active_strategy_is_detected_for_real():
    strategy = tf.distribute.OneDeviceStrategy("CPU:0")
    with strategy.scope():
        assert tfmemopt.distribute.auto_strategy() is strategy


def test_default_on_this_machine_and_it_logs_why(caplog, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TPU_NAME", raising=False)
    env = tfmemopt.distribute.detect_environment()
    assert env.active_strategy is None and env.tpu_devices == 0
    with caplog.at_level("INFO", logger="tfmemopt.distribute"):
        strategy = tfmemopt.distribute.auto_strategy()
    assert strategy is tf.distribute.get_strategy()
    assert strategy.num_replicas_in_sync == 1
    assert "default strategy: 1 replica" in caplog.text
    assert "fewer than two GPUs" in caplog.text


def test_tf_config_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(TWO_WORKERS))
    monkeypatch.setenv("TPU_NAME", "")
    env = tfmemopt.distribute.detect_environment()
    assert env.cluster_workers == 2
    assert plan_strategy(env).kind == "multi_worker"


def test_bad_input_messages():
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_tf_config("{worker: [")
    with pytest.raises(ValueError, match="must be a JSON object"):
        parse_tf_config("[1, 2]")
    ps = {"cluster": {"worker": ["a:1"], "ps": ["b:2"]}}
    with pytest.raises(ValueError, match="parameter-server cluster"):
        plan_strategy(Environment(tf_config=ps))
    with pytest.raises(TypeError, match="`tpu` must be a string"):
        plan_strategy(Environment(), tpu=8470)
    with pytest.raises(TypeError, match="expects a `tf.distribute.Strategy`"):
        tfmemopt.distribute.describe("mirrored")
    with pytest.raises(TypeError, match="Received: environment='x'"):
        tfmemopt.distribute.auto_strategy(environment="x")


def test_describe_mirrored_names_replicas_devices_and_ops():
    strategy = tf.distribute.MirroredStrategy(
        ["CPU:0"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    text = tfmemopt.distribute.describe(strategy)
    assert text.startswith("MirroredStrategy: 1 replica on 1 worker")
    assert "CPU:0" in text
    assert "cross-device ops: ReductionToOneDevice" in text
    assert tfmemopt.distribute.describe().startswith("default strategy")


def test_keras_distribution_is_refused_on_tensorflow():
    dist = keras.distribution.DataParallel(devices=["cpu:0"])
    keras.distribution.set_distribution(dist)
    try:
        with pytest.raises(ValueError, match="Use `tf.distribute` instead"):
            check_keras_distribution()
        with pytest.raises(ValueError, match="set_distribution\\(None\\)"):
            tfmemopt.distribute.auto_strategy(environment=Environment())
    finally:
        keras.distribution.set_distribution(None)
    check_keras_distribution()  # unset again: no error


@pytest.mark.slow
def test_tpu_local_without_a_tpu_says_what_to_do():
    # A real local probe (no network): fails at once on a CPU machine.
    out = run_in_subprocess(
        """
        import tfmemopt
        try:
            tfmemopt.distribute.auto_strategy(tpu="local")
            emit({"raised": None})
        except RuntimeError as e:
            emit({"raised": str(e)})
        """,
        n_cpus=1,
        timeout=120,
    )
    assert out["raised"] is not None
    assert "No TPU was found for tpu='local'" in out["raised"]
