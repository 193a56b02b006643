"""`shard_parameters=True` under `mixed_float16`: the `LossScaleOptimizer`'s
saved state comes back on every replica.

Keras saves a `LossScaleOptimizer`'s variables (its own and its inner
optimizer's) and then the inner optimizer again as its child. The inner
copy held the first replica's parts of each slot, and loading it after the
wrapper's whole state wrote them into every replica's: training resumed
from `load_model` or `load_weights` was 1.38x an epoch's update away from
the uninterrupted run (found by a fresh-user trial). Building the compiled
optimizer again, as docs/sharding.md says to before `load_weights`, added
a second set of the wrapper's variables, and `load_weights` then skipped
the whole state.
"""

from conftest import run_in_subprocess

SCRIPT = """
import os
import numpy as np, keras, tfmemopt

D = {workdir!r}
S = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
keras.config.set_dtype_policy("mixed_float16")
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 20)).astype("float32")
y = rng.integers(0, 3, size=(64,))
fit = dict(batch_size=16, shuffle=False, verbose=0)


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((20,))
    h = keras.layers.Dense(33, activation="relu")(inputs)  # 660 + 33: odd
    outputs = keras.layers.Dense(3, dtype="float32")(h)
    m = tfmemopt.Model(inputs, outputs, shard_parameters=True)
    m.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return m


def weights(m):
    return [np.array(w) for w in m.get_weights()]


with S.scope():
    m = build()
m.fit(x, y, epochs=2, **fit)
w2 = weights(m)
whole = m._shards.state.whole_values()
m.save(os.path.join(D, "new.keras"))
m.save_weights(os.path.join(D, "new.weights.h5"))
# What a file written before the fix holds: the inner optimizer's own
# save, its first replica's parts.
inner = m.optimizer.inner_optimizer
patched = inner.save_own_variables
object.__setattr__(
    inner, "save_own_variables", type(inner).save_own_variables.__get__(inner)
)
m.save(os.path.join(D, "old.keras"))
object.__setattr__(inner, "save_own_variables", patched)
m.fit(x, y, epochs=1, **fit)
w3 = weights(m)
update = max(float(np.abs(a - b).max()) for a, b in zip(w3, w2))


def resume_gap(restored):
    restored.fit(x, y, epochs=1, **fit)
    return max(
        float(np.abs(a - b).max()) for a, b in zip(weights(restored), w3)
    ) / update


out = {{"variables": len(m.optimizer.variables)}}
for name in ("new", "old"):
    with S.scope():
        loaded = keras.saving.load_model(os.path.join(D, name + ".keras"))
    out[name] = resume_gap(loaded)
with S.scope():
    fresh = build()
    fresh.optimizer.build(fresh.trainable_variables)
    out["rebuilt"] = len(fresh.optimizer.variables)
    fresh.load_weights(os.path.join(D, "new.weights.h5"))
out["load_weights"] = resume_gap(fresh)
# One device, no strategy: the inner optimizer's entry is read as saved
# (whole, as an unsharded model's; the first replica's parts before).
one = keras.saving.load_model(os.path.join(D, "new.keras"))
out["one_device_state"] = max(
    float(np.abs(np.asarray(v.numpy(), "float64") - w).max())
    for v, w in zip(one.optimizer.variables, whole)
)
out["one_device_inner"] = [
    list(v.shape) for v in one.optimizer.inner_optimizer.variables
] == [list(np.shape(w)) for w in whole[-len(inner.variables):]]
emit(out)
"""


def test_loss_scaled_sharded_state_round_trips(tmp_path):
    out = run_in_subprocess(SCRIPT.format(workdir=str(tmp_path)), n_cpus=2)
    # The wrapper's 4 (iteration, learning rate, step counter, scale), the
    # inner Adam's 2 and its 2 slots for each of the 4 weights.
    assert out["variables"] == 14, out
    assert out["rebuilt"] == 14, out  # `build` again adds nothing
    for way in ("new", "old", "load_weights"):
        assert out[way] <= 1e-6, (way, out)
    assert out["one_device_state"] == 0.0, out
    assert out["one_device_inner"], out
