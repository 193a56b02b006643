"""`tfmemopt.Model(shard_parameters=True)`: FSDP under MirroredStrategy.

One subprocess on 2 logical CPUs trains the same small model (sizes that
are not multiples of R, a one-element weight smaller than R) three ways
per optimizer: sharded under the strategy, unsharded under the strategy
(Keras's own optimizer), and on one device; the sharded run must be as
close to one device as Keras's own run under the strategy is (the floor,
measured in the same run). It also counts the bytes of every live
variable on each device, checks whole weights through get/set_weights,
that with no strategy nothing changes, bit for bit, and the optimizers
and models that are refused. The same at 4 replicas (a checkpoint written
at 2 resumed there, 1/4 of the bytes per device) is an `extended` test.
"""

import math

import pytest
from conftest import run_in_subprocess

import tfmemopt

COMMON = """
import numpy as np, keras, tfmemopt
from tfmemopt.optimizers import AdamW8bit

R = len(tf.config.list_logical_devices("CPU"))
STRATEGY = tf.distribute.MirroredStrategy([f"CPU:{i}" for i in range(R)])
ONE = tf.distribute.get_strategy()
rng = np.random.default_rng(0)
X = rng.normal(size=(32, 37)).astype("float32")
Y = rng.normal(size=(32, 5)).astype("float32")


@keras.saving.register_keras_serializable(package="test_fsdp")
class Scale(keras.layers.Layer):
    # One weight of one element: smaller than R.
    def build(self, input_shape):
        self.w = self.add_weight(shape=(1,), initializer="ones", name="w")

    def call(self, x):
        return x * self.w


@keras.saving.register_keras_serializable(package="test_fsdp")
class Head(keras.layers.Layer):
    # A layer inside a layer: its weights' paths hold two '/'
    # (head/d3/kernel), which keras.name_scope refuses whole.
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(5, name="d3")

    def build(self, input_shape):
        self.dense.build(input_shape)

    def call(self, x):
        return self.dense(x)


def make_model(shard, wrap=False, checkpointing=None, steps=1):
    inp = keras.Input((37,))
    h = keras.layers.Dense(61, activation="tanh", name="d1")(inp)
    h = keras.layers.Dense(130, activation="tanh", name="d2")(h)
    out = Scale()(Head(name="head")(h))
    if wrap:
        return tfmemopt.Model.wrap(
            keras.Model(inp, out), shard_parameters=shard)
    return tfmemopt.Model(inp, out, shard_parameters=shard,
                          checkpointing=checkpointing,
                          accumulation_steps=steps)


def adamw(model):
    o = keras.optimizers.AdamW(
        keras.optimizers.schedules.ExponentialDecay(1e-2, 4, 0.7),
        weight_decay=0.1)
    o.exclude_from_weight_decay(
        var_list=[model.layers[-1].w], var_names=["bias"])
    return o


OPTS = {
    "adamw": adamw,
    "sgd_global_clipnorm": lambda m: keras.optimizers.SGD(
        0.05, momentum=0.9, global_clipnorm=0.05),
    "adam_ema": lambda m: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(1e-2, 1, 0.8),
        use_ema=True, ema_momentum=0.9),
    "adamw8bit": lambda m: AdamW8bit(
        3e-3, weight_decay=0.05, block_size=64, min_8bit_size=256),
}


from tests.distribute._live_variables import Made


def train(strategy, name, shard, epochs=2, wrap=False, steps=1, n=32,
          checkpointing=None, callbacks=()):
    # n=30: batches of 16 and 14, whose size is known only at run time.
    keras.utils.set_random_seed(0)
    with strategy.scope(), Made() as made:
        m = make_model(shard, wrap, checkpointing=checkpointing, steps=steps)
        m.compile(optimizer=OPTS[name](m.inner if wrap else m), loss="mse")
    w0 = [np.array(w) for w in m.get_weights()]
    with made:
        m.fit(X[:n], Y[:n], batch_size=16, epochs=epochs, shuffle=False,
              verbose=0, callbacks=list(callbacks))
    w = [np.array(v) for v in m.get_weights()]
    return w0, w, made.live_bytes(), m


def rel(a, b, w0):
    change = max(float(np.max(np.abs(q - p))) for p, q in zip(w0, b))
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b)) / change
"""

CHECKPOINTS = """
import os
D = os.environ["CKPT_DIR"]


def fit(m, epochs, **kwargs):
    m.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
          **kwargs)
    return [np.array(w) for w in m.get_weights()]


def backup():
    # Passed to the first 2 epochs of the AdamW8bit run that
    # save_and_continue continues: its backup (save_weights at the end of
    # epoch 1, kept) is where an interrupted run of the same 4 epochs
    # would restart from.
    return keras.callbacks.BackupAndRestore(
        f"{D}/backup", delete_checkpoint=False)


def save_and_continue(m, w2):
    # After 2 epochs of AdamW8bit (whole blocks per replica; Keras does not
    # save `exclude_from_weight_decay`, so not the AdamW case): the .keras
    # file, then 2 epochs more (the uninterrupted run to equal).
    m.save(f"{D}/m.keras")
    ref = fit(m, 2)
    np.savez(f"{D}/ref.npz", *ref, *w2)


def resume_gap(w, n=None):
    saved = np.load(f"{D}/ref.npz")
    arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    ref, w2 = arrays[: len(arrays) // 2], arrays[len(arrays) // 2 :]
    update = max(float(np.max(np.abs(a - b))) for a, b in zip(ref, w2))
    return max(float(np.max(np.abs(a - b))) for a, b in zip(w, ref)) / update


def resumed_runs(strategy):
    # The .keras file; BackupAndRestore covers save_weights at R=2.
    out = {}
    with strategy.scope():
        m = keras.saving.load_model(f"{D}/m.keras")
    out["keras"] = resume_gap(fit(m, 2))
    out["keras_sharded"] = m._shards is not None
    return out


def backup_and_restore(strategy):
    # A new model asked for 4 epochs restores the backup() of epoch 1 and
    # runs epochs 2 and 3 only (a run from scratch would equal too).
    keras.utils.set_random_seed(0)
    with strategy.scope():
        m = make_model(True)
        m.compile(optimizer=OPTS["adamw8bit"](m), loss="mse")
    hist = m.fit(X, Y, batch_size=16, epochs=4, shuffle=False, verbose=0,
                 callbacks=[keras.callbacks.BackupAndRestore(f"{D}/backup")])
    w = [np.array(v) for v in m.get_weights()]
    return {"gap": resume_gap(w), "epochs": hist.epoch}
"""

ITEM1 = """
def built_bytes(name, shard):
    # The unsharded model's bytes once its optimizer is built (no fit).
    with STRATEGY.scope(), Made() as made:
        m = make_model(shard)
        m.compile(optimizer=OPTS[name](m), loss="mse")
        if not m.optimizer.built:
            m.optimizer.build(m.trainable_variables)
    return made.live_bytes()


from tfmemopt.distribute import _fsdp
_gather = _fsdp.ShardedValue.whole_from_part
# Activation checkpointing (the AdamW run checkpoints d2): the recompute
# in the backward pass gathers the checkpointed layer's weights again
# (counted while the step traces).
gathers = {}
def counting(self, part):
    gathers[self.name] = gathers.get(self.name, 0) + 1
    return _gather(self, part)


out = {}
for name in ("adamw", "sgd_global_clipnorm", "adamw8bit"):
    wrap = name == "sgd_global_clipnorm"
    if name == "adamw":
        _fsdp.ShardedValue.whole_from_part = counting
    w0, a, bytes_sharded, ms = train(
        STRATEGY, name, True, wrap=wrap,
        checkpointing=["d2"] if name == "adamw" else None,
        callbacks=[backup()] if name == "adamw8bit" else ())
    _fsdp.ShardedValue.whole_from_part = _gather
    row = {
        "bytes_sharded": bytes_sharded,
        "shapes": [list(x.shape) for x in a],
        "shard_shapes": [list(v.shape) for v in ms.trainable_variables],
        "whole_shapes": [list(v.shape) for v in ms.trainable_weights],
    }
    if name == "adamw8bit":
        save_and_continue(ms, a)
    if name == "adamw":
        # predict and evaluate gather too: the same outputs and loss as a
        # model with these whole weights on one device.
        plain = make_model(False)
        plain.compile(loss="mse")
        plain.set_weights(a)
        row["predict"] = float(np.max(np.abs(
            ms.predict(X, verbose=0) - plain.predict(X, verbose=0))))
        row["evaluate"] = abs(
            ms.evaluate(X, Y, verbose=0) - plain.evaluate(X, Y, verbose=0))
    # set_weights takes whole arrays; get_weights gives them back.
    ms.set_weights([x + 1.0 for x in a])
    row["set_ok"] = all(
        np.array_equal(x + 1.0, y) for x, y in zip(a, ms.get_weights()))
    del ms
    _, c, _, _ = train(ONE, name, False, wrap=wrap)
    row["vs_one"] = rel(a, c, w0)
    if name == "adamw":
        # The floor: Keras's own optimizer under the strategy (and no
        # checkpointing: recomputing d2 must not change the update).
        _, b, row["bytes_plain"], _ = train(STRATEGY, name, False)
        row["keras_floor"] = rel(b, c, w0)
        out["checkpointing"] = {"gathers": gathers,
                                "vs_unsharded": rel(a, b, w0)}
        # No strategy: shard_parameters=True changes nothing, bit for bit.
        _, d, _, m1 = train(ONE, "adamw", True)
        out["one_device"] = {
            "equal": all(np.array_equal(x, y) for x, y in zip(c, d)),
            "same_variables": [id(v) for v in m1.trainable_variables]
            == [id(v) for v in m1.trainable_weights],
        }
    elif name == "adamw8bit":
        row["bytes_plain"] = built_bytes(name, False)
    out[name] = row


class Last(keras.callbacks.Callback):
    # The weights as the last epoch ends: fit replaces them by their
    # moving averages only after that (finalize_variable_values).
    def on_epoch_end(self, epoch, logs=None):
        self.weights = [np.array(w) for w in self.model.get_weights()]


# Accumulation (2 micro-batches per replica, traced one by one) against
# the full batch on one device, with EMA and a schedule (one step per
# window), on batches of run-time size (16 and 14). Each replica
# accumulates its part of the summed gradient (shard-sized accumulators);
# the averages (1/R) replace the weights when fit ends, as on one device.
# The floor is the same accumulation unsharded under the strategy: Adam
# amplifies the order of the sums (measured: 2.6e-4 of the change there,
# 1.5e-4 sharded, 6.7e-5 for Keras's own without accumulation).
last = Last()
w0, c, _, _ = train(ONE, "adam_ema", False, n=30, callbacks=[last])
_, b, _, _ = train(STRATEGY, "adam_ema", False, steps=2, n=30)
# Each micro-batch's gathers wait for the previous one's accumulation
# (counted while the step traces).
_ordered, waits = _fsdp.ordered, []
def recording_order(part):
    out = _ordered(part)
    waits.append(out is not part)
    return out
_fsdp.ordered = recording_order
_, e, _, me = train(STRATEGY, "adam_ema", True, steps=2, n=30)
_fsdp.ordered = _ordered
out["ema"] = {"vs_one": rel(e, c, w0), "floor": rel(b, c, w0),
              "ema_vs_none": rel(last.weights, c, w0),
              "iterations": int(me.optimizer.iterations.numpy()),
              "gathers_waiting": sum(waits),
              "accumulated": [list(v.shape) for v in me.trainable_variables]}
# mixed_float16: each weight is gathered in its layer's compute dtype; the
# update is as close to one device as Keras's own under the strategy.
dtypes = {}
def recording(self, part):
    dtypes[self.name] = part.dtype.name
    return _gather(self, part)
_fsdp.ShardedValue.whole_from_part = recording
w = {}
for strategy, shard in ((STRATEGY, True), (STRATEGY, False), (ONE, False)):
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        m = make_model(shard)
        m.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    keras.config.set_dtype_policy("float32")
    w[(strategy is ONE, shard)] = fit(m, 2)
_fsdp.ShardedValue.whole_from_part = _gather
out["mixed_float16"] = {
    "dtypes": dtypes,
    "vs_one": rel(w[(False, True)], w[(True, False)], w0),
    "keras_floor": rel(w[(False, False)], w[(True, False)], w0),
}
# The checkpoint written at R=2 after 2 epochs, resumed for 2 more: at R=2
# by BackupAndRestore (save_weights / load_weights), with no strategy
# from the .keras file (at R=4 in the extended test).
out["resume"] = {"backup_and_restore": backup_and_restore(STRATEGY)}
out["resume_one_device"] = resumed_runs(ONE)
# Refusals, each with what to do instead (compile refuses before any
# step: they need a strategy, not its 4 replicas).
refused = {}
cases = {
    "adafactor": lambda: (make_model(True), keras.optimizers.Adafactor()),
    "lamb": lambda: (make_model(True), keras.optimizers.Lamb()),
    "tfmemopt_adafactor": lambda: (
        make_model(True), tfmemopt.optimizers.Adafactor()),
    "micro_batch_size": lambda: (
        tfmemopt.Model.wrap(make_model(False), micro_batch_size=4,
                            shard_parameters=True),
        keras.optimizers.Adam()),
    "ema_overwrite_frequency": lambda: (
        make_model(True),
        keras.optimizers.Adam(use_ema=True, ema_overwrite_frequency=2)),
    "sharded_optimizer": lambda: (
        make_model(True),
        tfmemopt.ShardedOptimizer(keras.optimizers.AdamW(), stage=2)),
    "unbuilt": lambda: (
        tfmemopt.Model.wrap(keras.Sequential([keras.layers.Dense(2)]),
                            shard_parameters=True),
        keras.optimizers.Adam()),
}
for case, make in cases.items():
    with STRATEGY.scope():
        m, opt = make()
        try:
            m.compile(optimizer=opt, loss="mse")
            refused[case] = None
        except ValueError as e:
            refused[case] = str(e)
out["refused"] = refused
emit(out)
"""

WRITE_AT_TWO = """
# The checkpoint that AT_FOUR resumes: ITEM1's AdamW8bit run again.
w0, a, _, ms = train(STRATEGY, "adamw8bit", True)
save_and_continue(ms, a)
emit({})
"""

AT_FOUR = """
out = {}
# The R=2 checkpoint resumed at R=4.
out["resume"] = resumed_runs(STRATEGY)
# Bytes of every live variable once built, Adam and AdamW8bit.
for name, make_opt in (("adam", lambda m: keras.optimizers.Adam(1e-3)),
                       ("adamw8bit", OPTS["adamw8bit"])):
    row = {}
    for shard in (True, False):
        with STRATEGY.scope(), Made() as made:
            m = make_model(shard)
            m.compile(optimizer=make_opt(m), loss="mse")
            if not shard:
                m.optimizer.build(m.trainable_variables)
        row[str(shard)] = made.live_bytes()
        del m
    out[name] = row
emit(out)
"""


def _device_bytes(table):
    return {d: n for d, n in table.items() if "CPU" in d}


@pytest.mark.slow
def test_shard_parameters_two_replicas(tmp_path):
    env = {"CKPT_DIR": str(tmp_path)}
    out = run_in_subprocess(COMMON + CHECKPOINTS + ITEM1, n_cpus=2, env=env)
    one = out.pop("one_device")
    assert one["equal"] and one["same_variables"], one
    # Whole weights and state in the unwrapped order: resumed at R=2
    # exactly, and with no strategy (unsharded) within the all-reduce floor.
    resume = out.pop("resume")["backup_and_restore"]
    assert resume["epochs"] == [2, 3], resume  # restored, not rerun
    assert resume["gap"] <= 1e-6, resume
    alone = out.pop("resume_one_device")
    assert alone.pop("keras_sharded") is False
    for way, gap in alone.items():
        assert gap <= 1e-5, (way, alone)
    ckpt = out.pop("checkpointing")
    gathers = ckpt["gathers"]
    # The AdamW run checkpoints d2: gathered in the forward pass and in the
    # recompute; d3 is not: gathered once (per replica). Its update equals
    # Keras's own unsharded, uncheckpointed one under the strategy.
    assert gathers["d2/kernel"] == 2 * gathers["head/d3/kernel"] == 4, ckpt
    assert gathers["d2/bias"] == 2 * gathers["head/d3/bias"] == 4, ckpt
    assert ckpt["vs_unsharded"] <= 1e-6, ckpt
    ema = out.pop("ema")
    # The averaged weights, not the last ones: on one device they are far
    # from that run's own last weights, so a sharded run that kept its
    # last weights fails vs_one.
    assert ema["ema_vs_none"] > 0.05, ema
    assert ema["vs_one"] <= max(1.2 * ema["floor"], 1e-6), ema
    assert ema["iterations"] == 4, ema  # one update per batch, 2 epochs
    # 7 weights, 2 micro-batches, 2 replicas: every forward gather waits.
    assert ema["gathers_waiting"] == 7 * 2 * 2, ema
    assert ema["accumulated"] == out["adamw"]["shard_shapes"], ema
    mixed = out.pop("mixed_float16")
    assert set(mixed["dtypes"].values()) == {"float16"}, mixed
    assert mixed["vs_one"] <= 1.2 * mixed["keras_floor"], mixed
    refused = out.pop("refused")
    for case, hint in (
        ("adafactor", "Use an elementwise optimizer"),
        ("lamb", "trust ratio"),
        ("tfmemopt_adafactor", "tfmemopt.ShardedOptimizer"),
        ("micro_batch_size", "Use accumulation_steps=N instead"),
        ("ema_overwrite_frequency", "keras.callbacks.SwapEMAWeights"),
        ("sharded_optimizer", "pass the inner optimizer"),
        ("unbuilt", "Build it first"),
    ):
        assert refused[case] and hint in refused[case], (case, refused)
    floor = out["adamw"]["keras_floor"]
    assert out["adamw"]["predict"] <= 1e-5, out["adamw"]
    assert out["adamw"]["evaluate"] <= 1e-5, out["adamw"]
    for name, r in out.items():
        # As close to one device as Keras's own optimizer under the
        # strategy (floor measured here; all-reduce order).
        assert r["vs_one"] <= max(2 * floor, 1e-6), (name, r, floor)
        assert r["shapes"] == r["whole_shapes"], (name, r)
        assert r["set_ok"], name
        # Each replica stores ceil(n / 2) elements of every weight (8-bit:
        # the cut is in whole blocks of 64).
        align = 64 if name == "adamw8bit" else 1
        for cut, whole in zip(r["shard_shapes"], r["shapes"]):
            half = -(-math.prod(whole) // 2)
            assert half <= cut[0] < half + align, (name, r)
        if "bytes_plain" not in r:
            continue  # SGD: the clipping case
        sharded = _device_bytes(r["bytes_sharded"])
        plain = _device_bytes(r["bytes_plain"])
        assert len(sharded) == 2, r
        for device, nbytes in sharded.items():
            assert nbytes <= plain[device] * (0.5 + 0.02), (name, device, r)


@pytest.mark.slow
@pytest.mark.extended(
    reason="the same sharding at 4 replicas; 2 replicas, and a checkpoint "
    "read without a strategy, run in make test"
)
def test_shard_parameters_four_replicas(tmp_path):
    # A checkpoint written at 2 replicas (its own run of ITEM1's AdamW8bit
    # case), resumed at 4; each device holds 1/4 of the bytes.
    env = {"CKPT_DIR": str(tmp_path)}
    run_in_subprocess(COMMON + CHECKPOINTS + WRITE_AT_TWO, n_cpus=2, env=env)
    four = run_in_subprocess(COMMON + CHECKPOINTS + AT_FOUR, n_cpus=4, env=env)
    resume = four.pop("resume")
    assert resume.pop("keras_sharded") is True
    for way, gap in resume.items():
        assert gap <= 1e-5, (way, resume)
    for name, row in four.items():
        sharded = _device_bytes(row["True"])
        plain = _device_bytes(row["False"])
        assert len(sharded) == 4, row
        for device, nbytes in sharded.items():
            assert nbytes <= plain[device] * (0.25 + 0.02), (name, row)


def test_shard_parameters_keyword_checked():
    with pytest.raises(TypeError, match="must be True or False"):
        tfmemopt.Model(shard_parameters="yes")
