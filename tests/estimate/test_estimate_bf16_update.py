"""The estimate of a bfloat16 weight's update by tfmemopt's optimizers: the
compiled write returns the new weight, and with `bf16_update="kahan"` the
new compensation beside it (docs/estimator.md: measured on an MLP)."""

import keras

import tfmemopt
from tfmemopt.estimate._update import weight_update
from tfmemopt.optimizers import AdamW8bit


def test_kahan_write_adds_the_new_compensation():
    n = 2048 * 2048
    temps = {
        mode: weight_update(AdamW8bit(bf16_update=mode), n, 2).temporaries
        for mode in ("stochastic", "kahan", "plain")
    }
    f32 = weight_update(AdamW8bit(), n, 4).temporaries
    # float32 weights: no write temporary; bfloat16: the new weight (2n),
    # and with Kahan the new compensation too.
    assert sorted(temps["stochastic"]) == sorted(f32 + [2 * n])
    assert sorted(temps["plain"]) == sorted(temps["stochastic"])
    assert sorted(temps["kahan"]) == sorted(temps["stochastic"] + [2 * n])
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512)])
    est = {
        mode: tfmemopt.estimate_memory(
            model, 8, optimizer=AdamW8bit(bf16_update=mode), policy="bfloat16"
        )
        for mode in ("stochastic", "kahan")
    }
    # Kahan: a bfloat16 compensation buffer per weight in the state.
    kernel = 64 * 512
    assert (
        est["kahan"].optimizer_state - est["stochastic"].optimizer_state
        >= 2 * kernel
    )
    assert est["kahan"].total > est["stochastic"].total


def test_ema_of_bfloat16_weights_counted_as_float32():
    # tfmemopt's optimizers keep float32 averages of 16-bit weights: the
    # estimate's state equals the bytes of the built optimizer's variables.
    keras.config.set_dtype_policy("bfloat16")
    try:
        model = keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(512), keras.layers.Dense(8)]
        )
        opt = AdamW8bit(use_ema=True)
        opt.build(model.trainable_variables)
        held = sum(v.numpy().nbytes for v in opt.variables)
        est = tfmemopt.estimate_memory(
            model, 8, optimizer=AdamW8bit(use_ema=True), policy="bfloat16"
        )
    finally:
        keras.config.set_dtype_policy("float32")
    averages = sum(4 * w.numpy().size for w in model.trainable_weights)
    assert abs(est.optimizer_state - held) <= 64, (est.optimizer_state, held)
    assert held > averages
