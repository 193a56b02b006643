"""bfloat16 weights: `bf16_update` on Adam8bit, AdamW8bit and Adafactor."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfmemopt
from tfmemopt.optimizers import Adafactor
from tfmemopt.optimizers import Adam8bit
from tfmemopt.optimizers import AdamW8bit
from tfmemopt.optimizers import _low_precision as lp

MODES = [None, "stochastic", "kahan", "plain"]


def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour():
    lo = np.float32(1.0)
    ulp = np.float32(2.0**-7)  # bfloat16 ulp in [1, 2)
    n = 20000
    key = lp.stream_key(7, tf.constant(3, tf.int64), 2)
    for frac in (0.01, 0.3, 0.5, 0.93):
        for sign in (1.0, -1.0):
            x = np.full((n,), sign * (lo + frac * ulp), np.float32)
            bits = lp.random16(key, tf.range(n))
            r = lp.stochastic_round_bf16(tf.constant(x), bits)
            r = tf.cast(r, tf.float32).numpy()
            assert set(np.unique(np.abs(r))) <= {lo, lo + ulp}
            # mean of n roundings: std of the mean is ulp*sqrt(f(1-f)/n)
            err = abs(float(np.mean(r, dtype=np.float64)) - float(x[0]))
            assert err <= 4 * ulp * np.sqrt(frac * (1 - frac) / n) + 1e-9
    # a value that is already a bfloat16 is never moved
    exact = tf.constant([1.0, -3.5, 0.0, 2.0**-100], tf.float32)
    bits = lp.random16(key, tf.range(4))
    r = lp.stochastic_round_bf16(exact, bits)
    np.testing.assert_array_equal(tf.cast(r, tf.float32).numpy(), exact)
    # the bits depend on the step, the variable and the element
    a = lp.random16(key, tf.range(64)).numpy()
    b = lp.random16(lp.stream_key(7, 4, 2), tf.range(64)).numpy()
    c = lp.random16(lp.stream_key(7, 3, 3), tf.range(64)).numpy()
    assert 0 <= a.min() and a.max() < 65536 and len(set(a)) > 60
    assert (a != b).mean() > 0.9 and (a != c).mean() > 0.9
    # the XLA-compiled write equals the plain ops, bit for bit
    rng = np.random.default_rng(0)
    w = tf.cast(rng.normal(size=(37, 19)), tf.bfloat16)
    delta = tf.constant(rng.normal(size=(37, 19)) * 1e-3, tf.float32)
    comp = tf.cast(rng.normal(size=(37, 19)) * 1e-3, tf.bfloat16)
    ids = tf.reshape(tf.range(5, 5 + 37 * 19), (37, 19))
    for mode in lp.MODES:
        plain = lp.new_weight(mode, w, delta, comp, key, ids)
        xla = lp.compiled_new_weight(mode)(w, delta, comp, key, 5, (0.0, 0.0))
        if mode == "kahan":
            np.testing.assert_array_equal(plain[1], xla[1])
            xla = xla[0]
        np.testing.assert_array_equal(plain[0], xla)


def _run(make, dtype, grad, w0=1.0, steps=60, shape=(4096,)):
    w = keras.Variable(np.full(shape, w0, np.float32), dtype=dtype)
    opt = make()
    opt.build([w])
    g = tf.constant(np.full(shape, grad, np.float32), dtype=w.dtype)

    @tf.function
    def step():
        opt.apply_gradients([(g, w)])

    for _ in range(steps):
        step()
    return np.asarray(keras.ops.cast(w, "float32")), opt


def test_small_updates_and_weight_decay_are_kept():
    # Adam's step with a constant gradient is the learning rate: 1e-4 per
    # step is 1/78 of a bfloat16 ulp at 1.0; the decay adds 1e-5 per step.
    def make(mode):
        return lambda: AdamW8bit(
            1e-4, weight_decay=0.1, min_8bit_size=0, bf16_update=mode
        )

    ref, _ = _run(make(None), "float32", 1.0)
    moved = 1.0 - float(ref.mean())
    assert moved == pytest.approx(60 * 1.1e-4, rel=0.02)
    plain, _ = _run(make("plain"), "bfloat16", 1.0)
    assert np.all(plain == 1.0)  # round to nearest loses every step
    keras_w, _ = _run(
        lambda: keras.optimizers.AdamW(1e-4, weight_decay=0.1),
        "bfloat16",
        1.0,
    )
    assert np.all(keras_w == 1.0)  # Keras: beta_2 cast to 1.0, step 0
    for mode in (None, "stochastic"):
        w, _ = _run(make(mode), "bfloat16", 1.0)
        assert float(w.mean()) < 1.0  # moved, where plain rounding did not
        # as far as float32 moved (a lost small step moves it less)
        assert abs((1.0 - float(w.mean())) - moved) <= 0.05 * moved, mode
    w, opt = _run(make("kahan"), "bfloat16", 1.0)
    # every weight within a bfloat16 ulp below 1.0 (2^-8) of float32's
    assert np.abs(w - ref).max() <= 2.0**-8
    kahan = [v for v in opt.variables if v.name.endswith("kahan")]
    assert len(kahan) == 1 and kahan[0].dtype == "bfloat16"
    total = w + np.asarray(keras.ops.cast(kahan[0], "float32"))
    # the buffer holds the rest, to its own bfloat16 rounding (measured:
    # 1.5% of the movement after 60 steps)
    assert np.abs(total - ref).max() <= 0.03 * moved


def test_beta_2_is_never_cast_to_the_weight_dtype():
    # bfloat16(0.999) == 1.0 (Keras's cast makes 1 - beta_2**t zero); the
    # first Adam step is lr * sign(g), here -1e-3 from 0 for a gradient 1.
    assert float(tf.cast(tf.constant(0.999), tf.bfloat16)) == 1.0
    for make in (
        lambda m: Adam8bit(1e-3, min_8bit_size=0, bf16_update=m),
        lambda m: Adam8bit(1e-3, bf16_update=m),  # float32 moments
    ):
        for mode in ("plain", "kahan", None):
            w, _ = _run(lambda: make(mode), "bfloat16", 1.0, 0.0, 1, (512,))
            np.testing.assert_allclose(w, -1e-3, rtol=1e-2)


def _bytes(variables):
    return sum(
        int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize
        if v.dtype != "bfloat16"
        else int(np.prod(v.shape)) * 2
        for v in variables
    )


def test_bytes_per_parameter_of_weights_and_state():
    """Weights + everything in `optimizer.variables`, from dtypes and sizes;
    gradients are bfloat16 (2 B/param)."""
    keras.config.set_dtype_policy("bfloat16")
    try:
        model = keras.Sequential(
            [
                keras.Input((256,)),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(256),
            ]
        )
        x = np.ones((4, 256), "float32")
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x))
        grads = tape.gradient(loss, model.trainable_variables)
    finally:
        keras.config.set_dtype_policy("float32")
    assert all(g.dtype == tf.bfloat16 for g in grads)
    assert all(w.dtype == "bfloat16" for w in model.weights)
    params = model.count_params()
    for mode, limit in ((None, 4.1), ("stochastic", 4.1), ("kahan", 6.1)):
        opt = AdamW8bit(1e-3, bf16_update=mode)
        opt.build(model.trainable_variables)
        per_param = (_bytes(model.weights) + _bytes(opt.variables)) / params
        # 2 (weights) + 2.03 (8-bit moments) [+ 2 (Kahan buffer)]
        assert limit - 0.1 <= per_param <= limit, (mode, per_param)
        if mode != "stochastic":
            # estimate_memory: 2-byte weights and gradients, and the state
            # the optimizer really keeps (Kahan buffer included)
            est = tfmemopt.estimate_memory(model, 4, optimizer=opt)
            assert est.parameters == est.gradients == 2 * params
            assert est.optimizer_state == _bytes(opt.variables[2:])


@pytest.mark.parametrize("cls", [Adam8bit, AdamW8bit, Adafactor])
def test_float32_weights_bit_for_bit_whatever_the_mode(cls):
    rng = np.random.default_rng(0)
    w0 = [rng.normal(size=(300, 20)), rng.normal(size=(20,))]
    grads = [[rng.normal(size=w.shape).astype("float32") for w in w0]
             for _ in range(3)]  # fmt: skip
    out = []
    for mode in ("omitted", "stochastic", "kahan"):  # None, plain: same path
        ws = [keras.Variable(w.astype("float32")) for w in w0]
        kwargs = {} if mode == "omitted" else {"bf16_update": mode}
        opt = cls(learning_rate=0.01, **kwargs)

        @tf.function
        def step(gs):
            opt.apply_gradients(zip(gs, ws))

        for gs in grads:
            step(gs)
        out.append([w.numpy() for w in ws])
        assert not any(v.name.endswith("kahan") for v in opt.variables)
    for other in out[1:]:
        for a, b in zip(out[0], other):
            np.testing.assert_array_equal(a, b)


def test_config_arguments_and_float16():
    opt = AdamW8bit(1e-3, bf16_update="kahan", bf16_seed=5)
    config = opt.get_config()
    assert config["bf16_update"] == "kahan" and config["bf16_seed"] == 5
    again = AdamW8bit.from_config(config)
    assert again.bf16_update == "kahan" and again.bf16_seed == 5
    assert Adafactor.from_config(Adafactor().get_config()).bf16_update is None
    with pytest.raises(ValueError, match="'stochastic', 'kahan' or 'plain'"):
        Adam8bit(bf16_update="nearest")
    with pytest.raises(ValueError, match="bf16_seed"):
        Adafactor(bf16_seed=-1)
    w = keras.Variable(np.ones((4,), np.float32), dtype="float16")
    with pytest.raises(TypeError, match="bf16_update='kahan'"):
        Adam8bit().build([w])
    # float16 with a compensation buffer: kept steps of 1/100 of an ulp
    w16, _ = _run(
        lambda: Adam8bit(1e-5, bf16_update="kahan"), "float16", 1.0, 1.0, 30
    )
    np.testing.assert_allclose(w16, 1.0 - 30e-5, atol=2.0**-11)


def test_composes_with_accumulation_and_jit():
    """tfmemopt.Model accumulation (one update per window) and a jit
    step on bfloat16 weights: both train and stay close to each other."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 12)).astype("float32")
    y = rng.normal(size=(64, 2)).astype("float32")
    keras.config.set_dtype_policy("bfloat16")
    results = {}
    try:
        for name, steps, jit in (("plain", 1, False), ("acc", 4, False),
                                 ("jit", None, True)):  # fmt: skip
            keras.utils.set_random_seed(0)
            inp = keras.Input((12,))
            h = keras.layers.Dense(64, activation="tanh")(inp)
            out = keras.layers.Dense(2)(h)
            if steps is None:
                model = keras.Model(inp, out)
            else:
                model = tfmemopt.Model(inp, out, accumulation_steps=steps)
            opt = AdamW8bit(3e-3, min_8bit_size=0, block_size=64)
            model.compile(opt, "mse", jit_compile=jit)
            hist = model.fit(
                x, y, batch_size=32, epochs=3, shuffle=False, verbose=0
            )
            results[name] = (hist.history["loss"], int(opt.iterations))
    finally:
        keras.config.set_dtype_policy("float32")
    for name, (loss, iterations) in results.items():
        assert iterations == 6, name  # once per batch of 32
        assert loss[-1] < loss[0] - 0.02, (name, loss)
        assert loss[-1] == pytest.approx(results["plain"][0][-1], rel=0.05)


def test_kahan_buffers_saved_relaid_dropped_or_started_at_zero():
    rng = np.random.default_rng(0)
    w = keras.Variable(rng.normal(size=(64, 32)), dtype="bfloat16")

    def trained(**kwargs):
        opt = AdamW8bit(1e-3, min_8bit_size=0, block_size=64, **kwargs)
        opt.build([w])
        for _ in range(3):
            opt.apply_gradients([(keras.ops.ones((64, 32), "bfloat16"), w)])
        return opt

    def kahan(opt):
        out = [v for v in opt.variables if v.name.endswith("kahan")]
        return np.asarray(keras.ops.cast(out[0], "float32")) if out else None

    saved = trained(bf16_update="kahan")
    store = {}
    saved.save_own_variables(store)
    assert store["tfmemopt_layout"].tolist() == [64, 0, 2, 1]
    assert np.abs(kahan(saved)).max() > 0
    # another block size: moments re-encoded, the buffer kept as it was
    other = AdamW8bit(1e-3, min_8bit_size=0, block_size=32, bf16_update="kahan")
    other.build([w])
    other.load_own_variables(store)
    np.testing.assert_array_equal(kahan(other), kahan(saved))
    # without a buffer: it is dropped, the rest loads (same block size)
    plain = AdamW8bit(1e-3, min_8bit_size=0, block_size=64)
    plain.build([w])
    plain.load_own_variables(store)
    assert kahan(plain) is None
    np.testing.assert_array_equal(
        np.asarray(plain.variables[2]), np.asarray(saved.variables[2])
    )
    # a state saved without buffers: they start at zero
    store = {}
    trained().save_own_variables(store)
    fresh = AdamW8bit(1e-3, min_8bit_size=0, block_size=64, bf16_update="kahan")
    fresh.build([w])
    fresh.load_own_variables(store)
    assert not np.any(kahan(fresh))


def _steps(opt, w, g, n):
    @tf.function
    def step():
        opt.apply_gradients([(g, w)])

    for _ in range(n):
        step()


def test_ema_of_bfloat16_weights_is_float32_and_keeps_moving():
    """`use_ema=True`: the averages of 16-bit weights are float32 (a
    bfloat16 average moves by (1 - 0.99) * (w - average), under half an ulp
    once the weights move slowly, and stalls); float32 weights keep Keras's
    own EMA bit for bit."""

    def make(**kw):
        return lambda: AdamW8bit(
            1e-4, min_8bit_size=0, use_ema=True, ema_momentum=0.99, **kw
        )

    ref, ref_opt = _run(make(), "float32", 1.0, steps=200, shape=(512,))
    (ref_avg,) = [v for v in ref_opt.variables if v.name.endswith("average")]
    # the average lags the weight by about 0.99 / 0.01 steps of 1e-4
    moved = 1.0 - float(np.mean(ref_avg.numpy()))
    assert 0.008 < moved < 0.0125 and 1.0 - ref.mean() > moved + 0.005
    # Keras's own EMA step, on a twin with the same weights: bit for bit.
    w = keras.Variable(np.ones((512,), np.float32))
    twin = make()()
    twin._update_model_variables_moving_average = (
        keras.optimizers.Optimizer._update_model_variables_moving_average
    ).__get__(twin)
    twin.build([w])
    _steps(twin, w, tf.ones((512,)), 200)
    np.testing.assert_array_equal(w.numpy(), ref)
    (twin_avg,) = [v for v in twin.variables if v.name.endswith("average")]
    np.testing.assert_array_equal(twin_avg.numpy(), ref_avg.numpy())

    for mode in (None, "kahan"):
        w, opt = _run(
            make(bf16_update=mode), "bfloat16", 1.0, steps=200, shape=(512,)
        )
        (avg,) = [v for v in opt.variables if v.name.endswith("average")]
        assert avg.dtype == "float32"
        # within 3% of float32's movement (stochastic rounding noise)
        got = 1.0 - float(np.mean(avg.numpy()))
        assert got == pytest.approx(moved, rel=0.03)
        # written back into the weights (rounded to bfloat16)
        opt.finalize_variable_values([w_var := opt._trainable_variables[0]])
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(keras.ops.cast(w_var, "float32")),
            keras.ops.convert_to_numpy(
                keras.ops.cast(keras.ops.cast(avg, "bfloat16"), "float32")
            ),
        )
    # a bfloat16 average (Keras's Adam family, and what tfmemopt did
    # before) stalls at 1.0: shown with Keras's SGD of the same steps.
    w = keras.Variable(np.ones((512,), np.float32), dtype="bfloat16")
    sgd = keras.optimizers.SGD(1e-4, use_ema=True, ema_momentum=0.99)
    sgd.build([w])
    _steps(sgd, w, tf.ones((512,), tf.bfloat16), 200)
    (sgd_avg,) = [v for v in sgd.variables if v.name.endswith("average")]
    assert float(keras.ops.max(keras.ops.cast(sgd_avg, "float32"))) == 1.0


def test_lazy_sparse_weight_decay_only_on_present_rows():
    """`lazy_sparse=True` with weight decay: only the rows present in the
    sparse gradient decay, for float32 and bfloat16 weights alike (Keras's
    decay of the whole variable would shrink absent rows too); a dense
    gradient still decays every row."""
    start = np.random.default_rng(0).uniform(1.0, 2.0, (64, 8))
    rows = tf.constant([3, 17, 40])
    grad = tf.IndexedSlices(tf.ones((3, 8)), rows, tf.constant([64, 8]))
    absent = np.setdiff1d(np.arange(64), rows.numpy())

    def train(dtype, lazy, sparse=True, steps=20):
        w = keras.Variable(start.astype(np.float32), dtype=dtype)
        opt = AdamW8bit(
            1e-2, weight_decay=0.5, min_8bit_size=0, lazy_sparse=lazy
        )
        opt.build([w])
        g = grad if sparse else tf.convert_to_tensor(grad)
        g = tf.cast(g.values, w.dtype) if sparse else tf.cast(g, w.dtype)
        if sparse:
            g = tf.IndexedSlices(g, rows, tf.constant([64, 8]))
        _steps(opt, w, g, steps)
        return np.asarray(keras.ops.cast(w, "float32"))

    dense = train("float32", False)
    for dtype in ("float32", "bfloat16"):
        lazy = train(dtype, True)
        first = np.asarray(keras.ops.cast(start.astype(np.float32), dtype))
        np.testing.assert_array_equal(lazy[absent], first[absent])
        # present rows: the step and the decay (0.2 + ~0.14 over the 20
        # steps), as the dense update's rows; bfloat16's stochastic rounding
        # walks by up to a few ulps (2^-7 in [1, 2)) per element.
        got, want = lazy[rows.numpy()], dense[rows.numpy()]
        if dtype == "float32":
            np.testing.assert_allclose(got, want, atol=1e-6)
        else:
            np.testing.assert_allclose(got, want, atol=4 * 2.0**-7)
            assert abs(float(np.mean(got - want))) < 0.01
    # the dense update decays absent rows: (1 - 0.5 * 1e-2) ** 20 = 0.905
    np.testing.assert_allclose(
        dense[absent], start[absent] * 0.995**20, rtol=1e-5
    )
    # a dense gradient with lazy_sparse decays every row
    whole = train("float32", True, sparse=False)
    np.testing.assert_allclose(whole, dense, rtol=1e-6)
