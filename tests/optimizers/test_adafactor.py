"""tfmemopt.optimizers.Adafactor: the factored update, no NaN, small state."""

import os

import keras
import numpy as np
import pytest

from tfmemopt.optimizers import Adafactor


def reference(w, grads, lr=0.01, beta_1=None, clip=1.0, relative=True,
              scale=True, decay=-0.8, eps1=1e-30, eps2=1e-3):  # fmt: skip
    """Shazeer & Stern's Algorithm 4/5 in float64 numpy (T5 form)."""
    w = w.astype(np.float64)
    factored = w.ndim >= 2
    r = np.zeros(w.shape[:-1])
    c = np.zeros(w.shape[:-2] + w.shape[-1:])
    v = np.zeros(w.shape)
    m = np.zeros(w.shape)
    for t, g in enumerate(grads, start=1):
        rho = min(lr, 1 / np.sqrt(t)) if relative else lr
        alpha = max(eps2, np.sqrt(np.mean(w**2))) * rho if scale else rho
        b2 = 1 - t**decay
        g2 = g**2 + eps1
        if factored:
            r = b2 * r + (1 - b2) * g2.mean(-1)
            c = b2 * c + (1 - b2) * g2.mean(-2)
            vhat = (r / r.mean(-1, keepdims=True))[..., None] * c[..., None, :]
        else:
            v = b2 * v + (1 - b2) * g2
            vhat = v
        u = g / np.sqrt(vhat)
        if clip is not None:
            u = u / max(1.0, np.sqrt(np.mean(u**2)) / clip)
        if beta_1 is not None:
            m = beta_1 * m + (1 - beta_1) * u
            u = m
        w = w - alpha * u
    return w


@pytest.mark.parametrize("shape", [(7, 5), (2, 3, 4), (6,), ()])
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"beta_1": 0.9, "clip_threshold": None},
        {"relative_step": False, "scale_parameter": False},
    ],
)
def test_matches_the_paper_in_float64(shape, kwargs):
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=shape).astype("float32")
    grads = [rng.normal(size=shape).astype("float32") for _ in range(4)]
    w = keras.Variable(w0)
    opt = Adafactor(0.01, **kwargs)
    for g in grads:
        opt.apply_gradients([(g, w)])
    ref_kwargs = {
        "beta_1": kwargs.get("beta_1"),
        "clip": kwargs.get("clip_threshold", 1.0),
        "relative": kwargs.get("relative_step", True),
        "scale": kwargs.get("scale_parameter", True),
    }
    expected = reference(w0, [g.astype(np.float64) for g in grads], 0.01,
                         **ref_kwargs)  # fmt: skip
    np.testing.assert_allclose(w.numpy(), expected, rtol=2e-5, atol=1e-6)


def digits_mlp():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def test_relu_mlp_on_digits_never_nan_where_keras_adafactor_does():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype("float32")[:256]
    y = y[:256]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    finite = {}
    for name, opt in (("keras", keras.optimizers.Adafactor()),
                      ("ours", Adafactor())):  # fmt: skip
        model = digits_mlp()
        model.compile(opt, loss)
        model.train_on_batch(x[:64], y[:64])
        finite[name] = all(np.isfinite(w.numpy()).all() for w in model.weights)
        if name == "ours":
            history = model.fit(x, y, batch_size=64, epochs=3, verbose=0)
            assert np.isfinite(history.history["loss"]).all()
            assert history.history["loss"][-1] < history.history["loss"][0]
            assert all(np.isfinite(np.asarray(v)).all() for v in opt.variables)
    # the case is a real trigger: Keras 3.15's Adafactor NaNs in one step
    assert finite == {"keras": False, "ours": True}


def state_bytes(opt):
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        for v in opt.variables
        if v is not opt.iterations and v is not opt._learning_rate
    )


def test_state_a_few_percent_of_keras_adafactor():
    model = digits_mlp()
    ours, ref = Adafactor(), keras.optimizers.Adafactor()
    ours.build(model.trainable_variables)
    ref.build(model.trainable_variables)
    ratio = state_bytes(ours) / state_bytes(ref)
    assert ratio <= 0.05, ratio
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    rows_cols = (64 + 128) + (128 + 128) + (128 + 10)  # factored matrices
    biases = 128 + 128 + 10
    assert state_bytes(ours) == 4 * (rows_cols + biases)
    assert state_bytes(ours) < 0.05 * 4 * params


def test_non_finite_gradient_skips_the_variable():
    w = keras.Variable(np.ones((4, 6), "float32"))
    opt = Adafactor()
    opt.apply_gradients([(np.full((4, 6), 0.5, "float32"), w)])
    before = [np.asarray(v).copy() for v in opt.variables[2:]] + [w.numpy()]
    g = np.full((4, 6), 0.5, "float32")
    g[1, 2] = np.nan
    opt.apply_gradients([(g, w)])
    after = [np.asarray(v) for v in opt.variables[2:]] + [w.numpy()]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_config_and_keras_file_continue_exactly(tmp_path):
    opt = Adafactor(0.02, beta_1=0.8, clip_threshold=2.0, weight_decay=0.01)
    assert Adafactor.from_config(opt.get_config()).get_config() == (
        opt.get_config()
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 64)).astype("float32")
    y = rng.integers(0, 10, 64)
    model = digits_mlp()
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(True))
    model.fit(x, y, batch_size=16, verbose=0, shuffle=False)
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.optimizer, Adafactor)
    for m in (model, loaded):
        m.fit(x, y, batch_size=16, verbose=0, shuffle=False)
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"beta_2_decay": 0.5}, "beta_2_decay"),
        ({"beta_1": 1.0}, "beta_1"),
        ({"clip_threshold": 0.0}, "clip_threshold"),
        ({"epsilon_1": 0.0}, "epsilon_1"),
        ({"gradient_accumulation_steps": 2}, "AccumulatingOptimizer"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Adafactor(**kwargs)


def test_non_float_variable_refused():
    v = keras.Variable(np.zeros((2, 2), "int32"))
    with pytest.raises(TypeError, match="floating-point"):
        Adafactor().build([v])


def test_sparse_rows_are_summed_then_applied_densely():
    import tensorflow as tf

    start = np.arange(40, dtype="float32").reshape(10, 4) / 40
    grad = tf.IndexedSlices(
        tf.constant([[1.0, 1, 1, 1], [1.0, 1, 1, 1], [0.5, 0.5, 0.5, 0.5]]),
        tf.constant([1, 1, 2]),
        tf.constant([10, 4]),
    )
    sparse_w, dense_w = keras.Variable(start), keras.Variable(start)
    sparse_opt, dense_opt = Adafactor(0.01), Adafactor(0.01)
    for _ in range(2):
        sparse_opt.apply_gradients([(grad, sparse_w)])
        dense_opt.apply_gradients([(tf.convert_to_tensor(grad), dense_w)])
    np.testing.assert_array_equal(sparse_w.numpy(), dense_w.numpy())
    assert np.isfinite(sparse_w.numpy()).all()
