"""`tfmemopt.Model(shard_parameters=True)`: FSDP under MirroredStrategy.

One subprocess on 2 logical CPUs trains the same small model (sizes that
are not multiples of R, a one-element weight smaller than R) three ways
per optimizer: sharded under the strategy, unsharded under the strategy
(Keras's own optimizer), and on one device; the sharded run must be as
close to one device as Keras's own run under the strategy is (the floor,
measured in the same run). It also counts the bytes of every live
variable on each device, checks whole weights through get/set_weights,
and that with no strategy nothing changes, bit for bit.
"""

import math

import pytest
from conftest import run_in_subprocess

import tfmemopt

COMMON = """
import gc, numpy as np, keras, tfmemopt
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


def make_model(shard, wrap=False):
    inp = keras.Input((37,))
    h = keras.layers.Dense(61, activation="tanh")(inp)
    h = keras.layers.Dense(130, activation="tanh")(h)
    out = Scale()(keras.layers.Dense(5)(h))
    if wrap:
        return tfmemopt.Model.wrap(
            keras.Model(inp, out), shard_parameters=shard)
    return tfmemopt.Model(inp, out, shard_parameters=shard)


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
    "adamw8bit": lambda m: AdamW8bit(
        3e-3, weight_decay=0.05, block_size=64, min_8bit_size=256),
}


def live_bytes():
    # Every live TensorFlow variable, by device (components of distributed
    # variables are variables of their own).
    gc.collect()
    out = {}
    for o in gc.get_objects():
        if isinstance(o, tf.Variable) and not hasattr(o, "values"):
            try:
                d = o.device
            except Exception:
                continue
            d = d[d.find("device:"):] if "device:" in d else d
            out[d] = out.get(d, 0) + int(np.prod(o.shape)) * o.dtype.size
    return out


def train(strategy, name, shard, epochs=2, wrap=False, measure=False):
    # Bytes: what this model, its optimizer and anything kept for them add
    # to the live variables (earlier runs' leftovers are in the baseline).
    before = live_bytes() if measure else None
    keras.utils.set_random_seed(0)
    with strategy.scope():
        m = make_model(shard, wrap)
        m.compile(optimizer=OPTS[name](m.inner if wrap else m), loss="mse")
    w0 = [np.array(w) for w in m.get_weights()]
    m.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0)
    w = [np.array(v) for v in m.get_weights()]
    nbytes = None
    if measure:
        after = live_bytes()
        nbytes = {d: n - before.get(d, 0) for d, n in after.items()}
    return w0, w, nbytes, m


def rel(a, b, w0):
    change = max(float(np.max(np.abs(q - p))) for p, q in zip(w0, b))
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b)) / change
"""

ITEM1 = """
out = {}
for name in OPTS:
    wrap = name == "sgd_global_clipnorm"
    w0, a, bytes_sharded, ms = train(STRATEGY, name, True, wrap=wrap,
                                     measure=True)
    shapes = [list(x.shape) for x in a]
    shard_shapes = [list(v.shape) for v in ms.trainable_variables]
    whole_shapes = [list(v.shape) for v in ms.trainable_weights]
    # set_weights takes whole arrays; get_weights gives them back.
    ms.set_weights([x + 1.0 for x in a])
    set_ok = all(np.array_equal(x + 1.0, y)
                 for x, y in zip(a, ms.get_weights()))
    del ms
    _, b, bytes_plain, mp = train(STRATEGY, name, False, wrap=wrap,
                                  measure=True)
    del mp
    _, c, _, _ = train(ONE, name, False, wrap=wrap)
    out[name] = {
        "vs_one": rel(a, c, w0), "keras_floor": rel(b, c, w0),
        "bytes_sharded": bytes_sharded, "bytes_plain": bytes_plain,
        "shapes": shapes, "shard_shapes": shard_shapes,
        "whole_shapes": whole_shapes, "set_ok": set_ok,
    }
# No strategy: shard_parameters=True changes nothing, bit for bit.
_, a, _, m1 = train(ONE, "adamw", True)
_, b, _, _ = train(ONE, "adamw", False)
out["one_device"] = {
    "equal": all(np.array_equal(x, y) for x, y in zip(a, b)),
    "same_variables": [id(v) for v in m1.trainable_variables]
    == [id(v) for v in m1.trainable_weights],
}
emit(out)
"""


def _device_bytes(table):
    return {d: n for d, n in table.items() if "CPU" in d}


def test_shard_parameters_two_replicas():
    out = run_in_subprocess(COMMON + ITEM1, n_cpus=2)
    one = out.pop("one_device")
    assert one["equal"] and one["same_variables"], one
    for name, r in out.items():
        # As close to one device as Keras's own optimizer under the
        # strategy (floor measured here; all-reduce order).
        assert r["vs_one"] <= max(2 * r["keras_floor"], 1e-6), (name, r)
        assert r["shapes"] == r["whole_shapes"], (name, r)
        assert r["set_ok"], name
        # Each replica stores ceil(n / 2) elements of every weight (8-bit:
        # the cut is in whole blocks of 64).
        align = 64 if name == "adamw8bit" else 1
        for cut, whole in zip(r["shard_shapes"], r["shapes"]):
            half = -(-math.prod(whole) // 2)
            assert half <= cut[0] < half + align, (name, r)
        sharded = _device_bytes(r["bytes_sharded"])
        plain = _device_bytes(r["bytes_plain"])
        assert len(sharded) == 2, r
        for device, nbytes in sharded.items():
            assert nbytes <= plain[device] * (0.5 + 0.02), (name, device, r)


def test_shard_parameters_keyword_checked():
    with pytest.raises(TypeError, match="must be True or False"):
        tfmemopt.Model(shard_parameters="yes")
