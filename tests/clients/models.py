"""Real client models, small: keras-io examples, keras-hub tasks, MobileNetV2.

The keras-io models follow the layers of the keras-io examples named in each
builder (keras-team/keras-io, Apache License 2.0: the layers keep the
example's structure, call signatures and loss patterns, re-typed here at a
tiny size). The keras-hub models are built from tiny configs (no download).
Dropout is 0 everywhere so that accumulation can be compared with plain
Keras exactly.

Each `Client` gives a fresh, seeded, built model, its compile arguments and
synthetic data of the real shapes.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import keras
import numpy as np
import tensorflow as tf
from keras import layers
from keras import ops

# --- keras-io examples/nlp/text_classification_with_transformer.py -------


@keras.saving.register_keras_serializable(package="tfmemopt_clients")
class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.ff_dim, self.rate = ff_dim, rate
        self.att = layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=embed_dim
        )
        self.ffn = keras.Sequential(
            [layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)]
        )
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)

    def get_config(self):
        return {
            **super().get_config(),
            "embed_dim": self.embed_dim,
            "num_heads": self.num_heads,
            "ff_dim": self.ff_dim,
            "rate": self.rate,
        }


@keras.saving.register_keras_serializable(package="tfmemopt_clients")
class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.maxlen, self.vocab_size = maxlen, vocab_size
        self.embed_dim = embed_dim
        self.token_emb = layers.Embedding(
            input_dim=vocab_size, output_dim=embed_dim
        )
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions

    def get_config(self):
        return {
            **super().get_config(),
            "maxlen": self.maxlen,
            "vocab_size": self.vocab_size,
            "embed_dim": self.embed_dim,
        }


def text_transformer(maxlen=16, vocab_size=40, embed_dim=16, blocks=2):
    inputs = layers.Input(shape=(maxlen,))
    x = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)(inputs)
    for _ in range(blocks):
        x = TransformerBlock(embed_dim, 2, 32, rate=0.0)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(20, activation="relu")(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


def text_data(n, maxlen=16, vocab_size=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab_size, size=(n, maxlen)).astype("int32")
    return x, rng.integers(0, 2, size=(n,))


# --- keras-io examples/vision/image_classification_with_vision_transformer


@keras.saving.register_keras_serializable(package="tfmemopt_clients")
class Patches(layers.Layer):
    def __init__(self, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size

    def call(self, images):
        input_shape = ops.shape(images)
        batch_size = input_shape[0]
        height, width = input_shape[1], input_shape[2]
        channels = input_shape[3]
        num_patches_h = height // self.patch_size
        num_patches_w = width // self.patch_size
        patches = keras.ops.image.extract_patches(images, size=self.patch_size)
        return ops.reshape(
            patches,
            (
                batch_size,
                num_patches_h * num_patches_w,
                self.patch_size * self.patch_size * channels,
            ),
        )

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size}


@keras.saving.register_keras_serializable(package="tfmemopt_clients")
class PatchEncoder(layers.Layer):
    def __init__(self, num_patches, projection_dim, **kwargs):
        super().__init__(**kwargs)
        self.num_patches = num_patches
        self.projection_dim = projection_dim
        self.projection = layers.Dense(units=projection_dim)
        self.position_embedding = layers.Embedding(
            input_dim=num_patches, output_dim=projection_dim
        )

    def call(self, patch):
        positions = ops.expand_dims(
            ops.arange(start=0, stop=self.num_patches, step=1), axis=0
        )
        projected_patches = self.projection(patch)
        return projected_patches + self.position_embedding(positions)

    def get_config(self):
        return {
            **super().get_config(),
            "num_patches": self.num_patches,
            "projection_dim": self.projection_dim,
        }


def _mlp(x, hidden_units, dropout_rate):
    for units in hidden_units:
        x = layers.Dense(units, activation=keras.activations.gelu)(x)
        x = layers.Dropout(dropout_rate)(x)
    return x


def vit(image=16, patch=4, dim=16, depth=2, classes=5):
    num_patches = (image // patch) ** 2
    inputs = keras.Input(shape=(image, image, 3))
    patches = Patches(patch)(inputs)
    encoded = PatchEncoder(num_patches, dim)(patches)
    for _ in range(depth):
        x1 = layers.LayerNormalization(epsilon=1e-6)(encoded)
        attention_output = layers.MultiHeadAttention(
            num_heads=2, key_dim=dim, dropout=0.0
        )(x1, x1)
        x2 = layers.Add()([attention_output, encoded])
        x3 = layers.LayerNormalization(epsilon=1e-6)(x2)
        x3 = _mlp(x3, hidden_units=[dim * 2, dim], dropout_rate=0.0)
        encoded = layers.Add()([x3, x2])
    representation = layers.LayerNormalization(epsilon=1e-6)(encoded)
    representation = layers.Flatten()(representation)
    features = _mlp(representation, hidden_units=[32, 16], dropout_rate=0.0)
    logits = layers.Dense(classes)(features)
    return keras.Model(inputs=inputs, outputs=logits)


def image_data(n, size=16, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(n, size, size, 3)).astype("float32")
    return x, rng.integers(0, classes, size=(n,))


# --- keras-io examples/nlp/bidirectional_lstm_imdb.py (+ mask_zero) -----


def bilstm(vocab=30, units=8):
    inputs = keras.Input(shape=(None,), dtype="int32")
    x = layers.Embedding(vocab, 8, mask_zero=True)(inputs)
    x = layers.Bidirectional(layers.LSTM(units, return_sequences=True))(x)
    x = layers.Bidirectional(layers.LSTM(units))(x)
    outputs = layers.Dense(1, activation="sigmoid")(x)
    return keras.Model(inputs, outputs)


def padded_text(n, maxlen=12, vocab=30, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(1, vocab, size=(n, maxlen)).astype("int32")
    for i, length in enumerate(rng.integers(2, maxlen + 1, size=n)):
        x[i, length:] = 0
    return x, rng.integers(0, 2, size=(n, 1)).astype("float32")


# --- keras-io examples/vision/captcha_ocr.py ------------------------------


def ctc_batch_cost(y_true, y_pred, input_length, label_length):
    """Per-sample CTC loss, shape (batch, 1), as the example's helper."""
    loss = ops.ctc_loss(
        ops.cast(y_true, "int32"),
        y_pred,
        ops.cast(ops.squeeze(label_length, axis=-1), "int32"),
        ops.cast(ops.squeeze(input_length, axis=-1), "int32"),
        mask_index=0,
    )
    return ops.expand_dims(loss, 1)


@keras.saving.register_keras_serializable(package="tfmemopt_clients")
class CTCLayer(layers.Layer):
    def __init__(self, name=None, **kwargs):
        super().__init__(name=name, **kwargs)
        self.loss_fn = ctc_batch_cost

    def call(self, y_true, y_pred):
        # The training-time loss, added with `self.add_loss()`.
        batch_len = ops.cast(ops.shape(y_true)[0], dtype="int64")
        input_length = ops.cast(ops.shape(y_pred)[1], dtype="int64")
        label_length = ops.cast(ops.shape(y_true)[1], dtype="int64")
        input_length = input_length * ops.ones(
            shape=(batch_len, 1), dtype="int64"
        )
        label_length = label_length * ops.ones(
            shape=(batch_len, 1), dtype="int64"
        )
        loss = self.loss_fn(y_true, y_pred, input_length, label_length)
        self.add_loss(loss)
        return y_pred


def captcha_ocr(width=32, height=16, chars=6):
    input_img = layers.Input(
        shape=(width, height, 1), name="image", dtype="float32"
    )
    labels = layers.Input(name="label", shape=(None,), dtype="float32")
    x = layers.Conv2D(
        8,
        (3, 3),
        activation="relu",
        kernel_initializer="he_normal",
        padding="same",
        name="Conv1",
    )(input_img)
    x = layers.MaxPooling2D((2, 2), name="pool1")(x)
    x = layers.Conv2D(
        8,
        (3, 3),
        activation="relu",
        kernel_initializer="he_normal",
        padding="same",
        name="Conv2",
    )(x)
    x = layers.MaxPooling2D((2, 2), name="pool2")(x)
    new_shape = ((width // 4), (height // 4) * 8)
    x = layers.Reshape(target_shape=new_shape, name="reshape")(x)
    x = layers.Dense(16, activation="relu", name="dense1")(x)
    x = layers.Dropout(0.0)(x)
    x = layers.Bidirectional(layers.LSTM(8, return_sequences=True))(x)
    x = layers.Dense(chars + 1, activation="softmax", name="dense2")(x)
    output = CTCLayer(name="ctc_loss")(labels, x)
    return keras.Model(
        inputs=[input_img, labels], outputs=output, name="ocr_model_v1"
    )


def captcha_data(n, width=32, height=16, chars=6, length=3, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "image": rng.uniform(size=(n, width, height, 1)).astype("float32"),
        "label": rng.integers(1, chars + 1, size=(n, length)).astype("float32"),
    }


# --- keras-hub task models, tiny configs ----------------------------------


def _hub():
    import keras_hub

    return keras_hub


TEXT = dict(
    vocabulary_size=50,
    num_layers=2,
    num_heads=2,
    hidden_dim=16,
    intermediate_dim=32,
    dropout=0.0,
    max_sequence_length=16,
)


def gpt2_causal_lm():
    hub = _hub()
    return hub.models.GPT2CausalLM(
        hub.models.GPT2Backbone(**TEXT), preprocessor=None
    )


def bert_classifier():
    hub = _hub()
    return hub.models.BertTextClassifier(
        hub.models.BertBackbone(**TEXT),
        num_classes=3,
        preprocessor=None,
        dropout=0.0,
    )


def vit_classifier():
    hub = _hub()
    backbone = hub.models.ViTBackbone(
        image_shape=(16, 16, 3),
        patch_size=4,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        mlp_dim=32,
    )
    return hub.models.ViTImageClassifier(
        backbone, num_classes=4, preprocessor=None
    )


def token_inputs(n, seq=16, vocab=50, seed=0, segments=False):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, size=(n, seq)).astype("int32")
    padding = np.ones((n, seq), "int32")
    for i, length in enumerate(rng.integers(seq // 2, seq + 1, size=n)):
        padding[i, length:] = 0
    x = {"token_ids": tokens, "padding_mask": padding}
    if segments:
        x["segment_ids"] = np.zeros_like(tokens)
    return x


def lm_data(n, seed=0):
    x = token_inputs(n, seed=seed)
    y = np.roll(x["token_ids"], -1, axis=1)
    return x, y, x["padding_mask"].astype("float32")


# --- keras.applications -----------------------------------------------------


def mobilenet_v2():
    model = keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=5
    )
    # Frozen BatchNormalization (inference statistics, as when
    # fine-tuning): micro-batch statistics would differ by nature.
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            layer.trainable = False
    return model


# --- the registry -----------------------------------------------------------


def sce(from_logits=False):
    return keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


@dataclasses.dataclass
class Client:
    name: str
    build: Callable[[], keras.Model]
    data: Callable[[int], tuple]
    loss: Callable[[], object] | None
    batch: int = 8
    peak_batch: int = 256
    # The batch of the checkpointing peak, where it differs: a tensor must
    # reach the CPU statistics' 256 KiB to be counted.
    ckpt_batch: int | None = None

    def model(self, seed=0):
        keras.utils.set_random_seed(seed)
        model = self.build()
        x = self.fit_data(2)[0]
        model(x)  # build, as a user's first call does
        return model

    def fit_data(self, n):
        out = self.data(n)
        if not isinstance(out, tuple):
            return (out,)
        return out


CLIENTS = {
    c.name: c
    for c in [
        Client(
            "kio_text_transformer", text_transformer, text_data, lambda: sce()
        ),
        Client("kio_vit", vit, image_data, lambda: sce(True)),
        Client(
            "kio_bilstm_masked",
            bilstm,
            padded_text,
            lambda: keras.losses.BinaryCrossentropy(),
            peak_batch=2048,
            # an 8-unit LSTM's per-step tensors are 64 KiB at 2048
            ckpt_batch=16384,
        ),
        Client(
            "kio_captcha_ctc", captcha_ocr, captcha_data, None, peak_batch=128
        ),
        Client(
            "hub_gpt2_causal_lm", gpt2_causal_lm, lm_data, lambda: sce(True)
        ),
        Client(
            "hub_bert_classifier",
            bert_classifier,
            lambda n, seed=0: (
                token_inputs(n, seed=seed, segments=True),
                np.arange(n) % 3,
            ),
            lambda: sce(True),
        ),
        Client(
            "hub_vit_classifier",
            vit_classifier,
            lambda n, seed=0: image_data(n, classes=4, seed=seed),
            lambda: sce(True),
        ),
        Client(
            "mobilenet_v2",
            mobilenet_v2,
            lambda n, seed=0: image_data(n, size=32, seed=seed),
            lambda: sce(),
            peak_batch=128,
        ),
    ]
}


def adam():
    """Adam with epsilon 1e-3: weights whose true gradient is 0 (attention
    key biases) get rounding noise of ~1e-9 as gradient, which Adam with
    the default 1e-7 blows up to a full step of either sign (2e-3 of the
    update, seen on the keras-io ViT); the repeated-row error on position
    embeddings is 0.30 with this epsilon, 0.47 with the default."""
    return keras.optimizers.Adam(0.01, epsilon=1e-3)


def compile_kwargs(client, optimizer=None):
    kwargs = {"optimizer": optimizer or adam()}
    loss = client.loss() if client.loss else None
    if loss is not None:
        kwargs["loss"] = loss
    return kwargs


def loss_grads(model, data):
    """Gradients of the compiled loss (and added losses), graph mode."""
    x, y, sw = keras.utils.unpack_x_y_sample_weight(tuple(data))

    @tf.function
    def step(x, y, sw):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x, y, y_pred, sw, training=True)
        return loss, tape.gradient(loss, model.trainable_variables)

    loss, grads = step(x, y, sw)
    return float(loss), [np.asarray(tf.convert_to_tensor(g)) for g in grads]
