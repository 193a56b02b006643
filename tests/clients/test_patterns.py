"""The classes of real client code from issue #16, one test each.

Layers are written the way keras-io and keras-hub write them (see
`models.py`); each test fails on the behaviour the issue reported.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers
from keras import ops

import tfmemopt
from tfmemopt.accumulation._sparse_rows import reads_batch

from . import models as M


def _train(build, compile_kwargs, x, y=None, batch=8, wrap=None, epochs=1):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = build()
    if wrap is not None:
        model = tfmemopt.Model.wrap(model, **wrap)
    w0 = model.get_weights()
    model.compile(**compile_kwargs())
    history = model.fit(
        x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0
    )
    return model.get_weights(), w0, history.history


def _rel(ref, got, w0):
    change = max(np.abs(a - b).max() for a, b in zip(ref, w0))
    assert change > 0
    return max(np.abs(a - b).max() for a, b in zip(ref, got)) / change


# -- 1. repeated embedding rows ----------------------------------------------


def test_keras_sparse_adam_squares_each_occurrence():
    """What Keras 3's own Adam does with a row repeated in one sparse
    gradient (documented in docs/accumulating_optimizer.md): v grows by
    (1 - beta_2) * (1 + 1), where Adam on the summed (dense) gradient
    grows it by (1 - beta_2) * 2**2."""

    def v_after(grad):
        var = keras.Variable(np.zeros((3, 1), "float32"))
        opt = keras.optimizers.Adam(0.1)
        opt.build([var])
        opt.apply_gradients([(grad, var)])
        return opt.variables[3].numpy().ravel()

    rows = tf.IndexedSlices(
        tf.ones((2, 1)), tf.constant([1, 1]), tf.constant([3, 1])
    )
    np.testing.assert_allclose(v_after(rows), [0, 0.002, 0], rtol=1e-5)
    dense = tf.constant([[0.0], [2.0], [0.0]])
    np.testing.assert_allclose(v_after(dense), [0, 0.004, 0], rtol=1e-5)


def test_reads_batch_tells_tokens_from_positions():
    emb = layers.Embedding(10, 4)
    emb.build((None,))
    seen = {}

    @tf.function
    def grads(x):
        with tf.GradientTape() as tape:
            positions = ops.arange(0, ops.shape(x)[1])
            y = emb(x) + emb(positions)
        (token_and_position,) = tape.gradient(y, [emb.embeddings])
        with tf.GradientTape() as tape:
            y = emb(ops.arange(0, ops.shape(x)[1])) * ops.sum(
                ops.cast(x, "float32")
            )
        (position_only,) = tape.gradient(y, [emb.embeddings])
        seen["mixed"] = reads_batch(token_and_position.indices, x)
        seen["positions"] = reads_batch(position_only.indices, x)
        return token_and_position.values

    grads(tf.constant([[1, 2, 3], [3, 2, 1]]))
    assert seen == {"mixed": True, "positions": False}


# Adam on position embeddings (rows looked up with ops.arange are in every
# micro-batch; the full batch has each once; concatenated, Adam was 0.30
# (eps 1e-3) to 0.96 (default eps) of the update away after 2 steps): the
# same models, data, batch 8, accumulation 4, Adam (eps 1e-3) and 1e-4 bound
# are test_clients.py::test_accumulation_equals_plain_keras, cases
# kio_text_transformer (TokenAndPositionEmbedding) and kio_vit
# (PatchEncoder), which also check
# the monitor's keys and the .keras round trip; the test that was here
# repeated those two trainings.


# -- 2. add_loss terms ---------------------------------------------------------


class PerSampleLoss(layers.Layer):
    """`add_loss` of a per-sample tensor (shape (batch, 1), as the CTC
    layer of keras-io's captcha OCR): Keras sums it over the batch."""

    def call(self, y_true, y_pred):
        per_sample = ops.sum(ops.square(y_true - y_pred), axis=-1)
        self.add_loss(ops.expand_dims(per_sample, 1))
        return y_pred


class MeanLoss(layers.Layer):
    """`add_loss` of a scalar mean (keras-io VAE's KL term, as add_loss)."""

    def call(self, x):
        self.add_loss(0.1 * ops.mean(ops.square(x)))
        return x


def add_loss_model():
    x_in = keras.Input((5,), name="x")
    t_in = keras.Input((3,), name="t")
    h = layers.Dense(
        8,
        activation="tanh",
        activity_regularizer=keras.regularizers.L2(0.01),
        kernel_regularizer=keras.regularizers.L2(0.02),
    )(x_in)
    h = MeanLoss()(h)
    out = PerSampleLoss()(t_in, layers.Dense(3)(h))
    return keras.Model({"x": x_in, "t": t_in}, out)


def add_loss_data(n=10):
    rng = np.random.default_rng(0)
    return {
        "x": rng.normal(size=(n, 5)).astype("float32"),
        "t": rng.normal(size=(n, 3)).astype("float32"),
    }


@pytest.mark.parametrize("steps", [1, 4])
def test_add_loss_terms_equal_plain_keras(steps):
    """Per-sample, mean and regulariser terms; 10 samples at batch 10 with
    N=4 (micro-batches 3, 3, 3, 1). The per-sample term was 1/N."""
    x = add_loss_data()

    def compile_kwargs():
        return dict(optimizer=keras.optimizers.SGD(0.1))

    ref, w0, h_ref = _train(add_loss_model, compile_kwargs, x, batch=10)
    got, _, h_got = _train(
        add_loss_model,
        compile_kwargs,
        x,
        batch=10,
        wrap=dict(accumulation_steps=steps),
    )
    assert _rel(ref, got, w0) <= 1e-5
    np.testing.assert_allclose(h_got["loss"], h_ref["loss"], rtol=1e-5)


def test_add_loss_inside_checkpointed_segment_is_kept():
    """keras-io captcha OCR: the CTC layer adds its loss inside the last
    'auto' segment ('No loss to compute' before); the loss and gradients
    equal the plain model's, and it trains wrapped with checkpointing."""
    client = M.CLIENTS["kio_captcha_ctc"]
    data = client.fit_data(8)
    plain = client.model()
    plain.compile(optimizer="sgd")
    loss0, g0 = M.loss_grads(plain, data)
    model = client.model()
    model.compile(optimizer="sgd")
    report = tfmemopt.enable_checkpointing(model, "auto")
    assert "ctc_loss" in report.segments[-1]
    loss1, g1 = M.loss_grads(model, data)
    assert loss0 > 0 and abs(loss0 - loss1) <= 1e-5 * loss0
    for a, b in zip(g0, g1):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # Called again, the model does not keep the earlier call's losses.
    model(data[0])
    assert len(model.losses) == 1


# -- 3, 4. a subclass with its own train_step and positional arguments -------


@keras.saving.register_keras_serializable(package="tfmemopt_clients")
class Sampling(layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = ops.shape(z_mean)[0]
        dim = ops.shape(z_mean)[1]
        epsilon = keras.random.normal(
            shape=(batch, dim), seed=self.seed_generator
        )
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


def vae_parts(latent_dim=2):
    """keras-io examples/generative/vae.py's encoder and decoder, 8x8."""
    encoder_inputs = keras.Input(shape=(8, 8, 1))
    x = layers.Conv2D(4, 3, activation="relu", strides=2, padding="same")(
        encoder_inputs
    )
    x = layers.Flatten()(x)
    x = layers.Dense(8, activation="relu")(x)
    z_mean = layers.Dense(latent_dim, name="z_mean")(x)
    z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
    z = Sampling()([z_mean, z_log_var])
    encoder = keras.Model(
        encoder_inputs, [z_mean, z_log_var, z], name="encoder"
    )
    latent_inputs = keras.Input(shape=(latent_dim,))
    x = layers.Dense(4 * 4 * 4, activation="relu")(latent_inputs)
    x = layers.Reshape((4, 4, 4))(x)
    x = layers.Conv2DTranspose(
        4, 3, activation="relu", strides=2, padding="same"
    )(x)
    decoder_outputs = layers.Conv2DTranspose(
        1, 3, activation="sigmoid", padding="same"
    )(x)
    decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")
    return encoder, decoder


@keras.saving.register_keras_serializable(package="tfmemopt_clients")
class VAE(tfmemopt.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker]

    def call(self, data):
        return self.decoder(self.encoder(data)[2])

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(
                ops.sum(
                    keras.losses.binary_crossentropy(data, reconstruction),
                    axis=(1, 2),
                )
            )
            kl_loss = -0.5 * (
                1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var)
            )
            kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        return {"loss": self.total_loss_tracker.result()}

    def get_config(self):
        config = super().get_config()
        config["encoder"] = keras.saving.serialize_keras_object(self.encoder)
        config["decoder"] = keras.saving.serialize_keras_object(self.decoder)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        for key in ("encoder", "decoder"):
            config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)


def mnist_like(n=32):
    return np.random.default_rng(0).uniform(size=(n, 8, 8, 1)).astype("float32")


def test_own_train_step_with_accumulation_raises():
    vae = VAE(*vae_parts(), accumulation_steps=4)
    vae.compile(optimizer=keras.optimizers.Adam())
    with pytest.raises(ValueError, match="AccumulatingOptimizer"):
        vae.fit(mnist_like(), epochs=1, batch_size=16, verbose=0)
    with pytest.raises(ValueError, match="overrides `train_step`"):
        vae.train_on_batch(mnist_like(16))


def test_own_train_step_accumulates_across_steps_as_told():
    """What the error says to do: no in-step accumulation, and
    AccumulatingOptimizer: 4 fit steps, one update (after the 4th)."""
    vae = VAE(*vae_parts())
    vae.compile(
        optimizer=tfmemopt.AccumulatingOptimizer(
            keras.optimizers.Adam(0.01), accumulation_steps=4
        )
    )
    vae(mnist_like(2))
    w0 = vae.get_weights()
    vae.fit(mnist_like(48), epochs=1, batch_size=16, verbose=0)
    w3 = vae.get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(w0, w3))
    vae.fit(mnist_like(16), epochs=1, batch_size=16, verbose=0)
    assert any(not np.array_equal(a, b) for a, b in zip(w0, vae.get_weights()))


def test_subclass_with_two_positional_arguments_is_not_functional(tmp_path):
    """VAE(encoder, decoder) was taken for Model(inputs, outputs): save,
    estimate_memory and find_batch_size failed with AttributeError."""
    vae = VAE(*vae_parts())
    assert type(vae) is VAE
    vae.compile(optimizer=keras.optimizers.Adam())
    x = mnist_like()
    vae.fit(x, epochs=1, batch_size=16, verbose=0)
    path = str(tmp_path / "vae.keras")
    vae.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is VAE
    for a, b in zip(vae.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    # x-only data, as fit takes it (item 7).
    result = tfmemopt.find_batch_size(vae, x, max_batch_size=16, verbose=0)
    assert result.batch_size >= 8


# -- 5. wrap + checkpointing ---------------------------------------------------


def test_wrap_with_checkpointing_auto_on_functional_model():
    """`'WrappedModel' object has no attribute 'outputs'` before."""
    x, y = M.text_data(16)
    keras.utils.set_random_seed(0)
    plain = M.text_transformer()
    keras.utils.set_random_seed(0)
    inner = M.text_transformer()
    wrapped = tfmemopt.Model.wrap(inner, 4, checkpointing="auto")
    report = tfmemopt.checkpointing.checkpointing_report(inner)
    assert report is not None and len(report.segments) >= 2, str(report)
    w0 = plain.get_weights()
    for model in (plain, wrapped):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=M.sce())
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert _rel(plain.get_weights(), wrapped.get_weights(), w0) <= 1e-5


# -- 6. checkpointing 'auto' on keras-hub tasks --------------------------------


@pytest.mark.parametrize(
    "name, inside, segments",
    [
        ("hub_gpt2_causal_lm", "gpt2_backbone", 3),
        ("hub_bert_classifier", "bert_backbone", 2),
        ("hub_vit_classifier", "vi_t_backbone", 2),
    ],
)
def test_auto_goes_into_the_backbone(name, inside, segments):
    model = M.CLIENTS[name].model()
    report = tfmemopt.enable_checkpointing(model, "auto")
    assert report.inside.endswith(inside), str(report)
    assert len(report.segments) == segments, str(report)
    assert tfmemopt.checkpointing.checkpointing_report(model) is report
    tfmemopt.disable_checkpointing(model)
    backbone = model.get_layer(inside)
    assert tfmemopt.checkpointing.checkpointing_report(backbone) is None
    assert "call" not in backbone.__dict__


def test_auto_warns_when_its_one_segment_is_the_whole_model():
    model = keras.Sequential([keras.Input((4,)), layers.Dense(4)])
    with pytest.warns(UserWarning, match="saves nothing"):
        tfmemopt.enable_checkpointing(model, "auto")
    model = keras.Sequential(
        [keras.Input((4,))] + [layers.Dense(4) for _ in range(9)]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tfmemopt.enable_checkpointing(model, "auto")


# -- 7. x-only data, dict inputs --------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("as_dataset", [False, True])
def test_find_batch_size_takes_x_only(as_dataset):
    """keras-io captcha OCR is fit on a dict of inputs, no y."""
    client = M.CLIENTS["kio_captcha_ctc"]
    model = client.model()
    model.compile(optimizer="adam")
    x = client.fit_data(16)[0]
    data = tf.data.Dataset.from_tensor_slices(x).batch(8) if as_dataset else x
    result = tfmemopt.find_batch_size(model, data, max_batch_size=16, verbose=0)
    assert result.batch_size >= 8


def test_estimate_memory_with_dict_inputs_in_any_key_order():
    """Keys not in sorted order, inputs of different widths: specs passed
    as a list were matched to the sorted keys and the trace failed."""
    b = keras.Input((3,), name="b")
    a = keras.Input((4,), name="a")
    h = layers.Concatenate()([layers.Dense(8)(a), layers.Dense(8)(b)])
    model = keras.Model({"b": b, "a": a}, layers.Dense(2)(h))
    model.compile("adam", "mse")
    estimate = tfmemopt.estimate_memory(model, batch_size=16)
    assert estimate.total > 0 and estimate.activations > 0
