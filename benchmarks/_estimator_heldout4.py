"""The estimator's fourth held-out set (issue #23).

The first three held-out sets (`_estimator_heldout.py`,
`_estimator_heldout2.py`, `_estimator_heldout3.py`) have each been used to
find or diagnose defects, so none judges the rules unseen any more. This
set is their successor: model families in none of the design set
(`MODELS` in `estimator_accuracy.py`: MLPs, a BatchNorm CNN, MobileNetV2,
ResNet50, EfficientNetB0, self-attention transformer blocks on dense
inputs, a one-way LSTM classifier, an embedding classifier, keras-io's
text transformer and ViT), the first held-out set (a bidirectional GRU, a
1-D conv net, a U-Net-like net, DenseNet121, MobileNetV3Small, keras-hub's
GPT-2, a wide-and-deep MLP, a convolutional autoencoder), the second (an
LSTM encoder-decoder, a two-tower retrieval model, a 3-D conv net, an
MLP-Mixer, a ResNeXt-like net, keras-hub's T5, FNet and Mixtral) and the
third (a WaveNet-like net, a CRNN, an Xception-like net, a VAE, a graph
conv net, PointNet, keras-hub's ALBERT and DeBERTa-v3). It was fixed in
this file and committed before any case was measured; its batch sizes
come from the models' arithmetic (weights, kept activations), not from
the estimate. Its cases are measured without an estimate; the set is
estimated once (`--heldout4 --reestimate`) after the estimator's rules are
final. Why each family is new:

- `patch_transformer`: a ViT-like classifier built from layers, not
  keras-io's ViT: the patches are cut and projected by one strided
  `Conv2D` (8x8, stride 8) instead of `extract_patches` + `Dense`, a
  learned class token is prepended (a `concatenate` of a broadcast weight)
  and learned positions are added from a weight (no `Embedding`); pre-norm
  blocks, the head on the class token.
- `siamese`: one convolutional encoder (a nested `keras.Model`) shared by
  two image inputs (its weights' gradient is the sum of the two calls), a
  distance head on `|a - b|`. No set has a layer called twice on two
  inputs.
- `conformer`: three Conformer-like blocks over 128 80-feature frames: two
  half-step feed-forward modules, self-attention, and a convolution module
  (pointwise `Conv1D` to twice the width, a GLU gate, `DepthwiseConv1D`
  of width 15, BatchNormalization, swish, pointwise `Conv1D`); a
  per-frame 32-way head.
- `stacked_lstm`: three LSTMs stacked, each returning every step, and a
  `TimeDistributed` 20-way head at each step (the design set's LSTM is one
  layer returning its last step; the third set's CRNN has one GRU).
- `efficientnetv2b0_64`: `keras.applications.EfficientNetV2B0` at 64x64,
  `weights=None`: fused MBConv blocks (a full 3x3 `Conv2D` expansion, not
  EfficientNetB0's depthwise one) before the MBConv blocks.
- `whisper_tiny`: keras-hub's `WhisperBackbone` from a tiny config (no
  download): an audio encoder (two `Conv1D`, the second strided, over
  80-mel frames, sinusoidal positions) and a decoder with causal
  self-attention and cross-attention to the encoder; a 1000-way head at
  each decoder position.
- `gemma_tiny`: keras-hub's `GemmaBackbone` from a tiny config: RMS
  norms, rotary positions, multi-query attention (one key/value head),
  GeGLU feed-forward, logits through the tied token embedding
  (`reverse=True`) at every position.

Variants: `base` (Adam) at two batch sizes, and at the larger one two of
`adamw` (AdamW), `sgd_momentum` (SGD, momentum 0.9), `accumulation=4`
(Adam, on `siamese` and `stacked_lstm`), `checkpointing=auto` (Adam, on
`patch_transformer` and `conformer`) and `mixed_bfloat16` (Adam, on
`efficientnetv2b0_64` and `gemma_tiny`).
"""

from __future__ import annotations

from _keras_hub_lm import tied_lm

# name -> [(variant, batch), ...]
HELDOUT4 = {
    "patch_transformer": [
        ("base", 8),
        ("base", 32),
        ("adamw", 32),
        ("checkpointing=auto", 32),
    ],
    "siamese": [
        ("base", 16),
        ("base", 64),
        ("sgd_momentum", 64),
        ("accumulation=4", 64),
    ],
    "conformer": [
        ("base", 4),
        ("base", 16),
        ("adamw", 16),
        ("checkpointing=auto", 16),
    ],
    "stacked_lstm": [
        ("base", 64),
        ("base", 128),
        ("sgd_momentum", 128),
        ("accumulation=4", 128),
    ],
    "efficientnetv2b0_64": [
        ("base", 4),
        ("base", 16),
        ("sgd_momentum", 16),
        ("mixed_bfloat16", 16),
    ],
    "whisper_tiny": [
        ("base", 4),
        ("base", 16),
        ("adamw", 16),
        ("sgd_momentum", 16),
    ],
    "gemma_tiny": [
        ("base", 4),
        ("base", 12),
        ("adamw", 12),
        ("mixed_bfloat16", 12),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data); the language models' vocabularies are larger.
VOCAB = 1000


def _layers():
    """The custom layers of the set: a learned class token prepended and
    learned positions added (the patch transformer), and a GLU gate (the
    Conformer's convolution module)."""
    from keras import layers
    from keras import ops

    class ClassTokenAndPosition(layers.Layer):
        def build(self, input_shape):
            _, length, width = input_shape
            self.token = self.add_weight(
                shape=(1, 1, width), initializer="zeros", name="token"
            )
            self.position = self.add_weight(
                shape=(1, length + 1, width),
                initializer="random_normal",
                name="position",
            )

        def call(self, x):
            token = ops.broadcast_to(
                ops.cast(self.token, x.dtype),
                (ops.shape(x)[0], 1, ops.shape(x)[-1]),
            )
            x = ops.concatenate([token, x], axis=1)
            return x + ops.cast(self.position, x.dtype)

    class GLU(layers.Layer):
        def call(self, x):
            a, b = ops.split(x, 2, axis=-1)
            return a * ops.sigmoid(b)

    return ClassTokenAndPosition, GLU


def build_heldout4(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers
    from keras import ops

    if name == "patch_transformer":
        class_token_and_position, _ = _layers()
        inp = keras.Input((64, 64, 3))
        x = layers.Conv2D(192, 8, strides=8)(inp)  # 8x8 patches
        x = layers.Reshape((64, 192))(x)
        x = class_token_and_position()(x)
        for _ in range(4):
            h = layers.LayerNormalization()(x)
            h = layers.MultiHeadAttention(6, 32)(h, h)
            x = layers.Add()([x, h])
            h = layers.LayerNormalization()(x)
            h = layers.Dense(768, activation="gelu")(h)
            h = layers.Dense(192)(h)
            x = layers.Add()([x, h])
        x = layers.LayerNormalization()(x)
        x = layers.Lambda(lambda t: t[:, 0])(x)
        return inp, layers.Dense(10)(x), True
    if name == "siamese":
        image = keras.Input((64, 64, 3))
        h = image
        for filters in (32, 64, 128):
            h = layers.Conv2D(filters, 3, padding="same", activation="relu")(h)
            h = layers.MaxPooling2D()(h)
        h = layers.GlobalAveragePooling2D()(h)
        encoder = keras.Model(image, layers.Dense(128)(h), name="encoder")
        left = keras.Input((64, 64, 3), name="left")
        right = keras.Input((64, 64, 3), name="right")
        distance = layers.Subtract()([encoder(left), encoder(right)])
        distance = layers.Activation(ops.abs)(distance)
        x = layers.Dense(64, activation="relu")(distance)
        return [left, right], layers.Dense(2)(x), True
    if name == "conformer":
        _, glu = _layers()
        inp = keras.Input((128, 80))
        x = layers.Dense(144)(inp)

        def feed_forward(x):
            h = layers.LayerNormalization()(x)
            h = layers.Dense(576, activation="swish")(h)
            h = layers.Dense(144)(h)
            return layers.Add()([x, layers.Rescaling(0.5)(h)])

        for _ in range(3):
            x = feed_forward(x)
            h = layers.LayerNormalization()(x)
            h = layers.MultiHeadAttention(4, 36)(h, h)
            x = layers.Add()([x, h])
            h = layers.LayerNormalization()(x)
            h = glu()(layers.Conv1D(288, 1)(h))
            h = layers.DepthwiseConv1D(15, padding="same")(h)
            h = layers.BatchNormalization()(h)
            h = layers.Activation("swish")(h)
            h = layers.Conv1D(144, 1)(h)
            x = layers.Add()([x, h])
            x = feed_forward(x)
            x = layers.LayerNormalization()(x)
        return inp, layers.Dense(32)(x), True
    if name == "stacked_lstm":
        # Each step's gates, batch x 4 x 512 floats, are >= 256 KiB from
        # batch 32 (the accumulation's micro-batch at batch 128).
        x = inp = keras.Input((32, 128))
        for _ in range(3):
            x = layers.LSTM(512, return_sequences=True)(x)
        return inp, layers.TimeDistributed(layers.Dense(20))(x), True
    if name == "efficientnetv2b0_64":
        app = keras.applications.EfficientNetV2B0(
            weights=None, input_shape=(64, 64, 3), classes=10
        )
        return app.inputs[0], app.outputs[0], True
    if name == "whisper_tiny":
        import keras_hub

        backbone = keras_hub.models.WhisperBackbone(
            vocabulary_size=VOCAB * 4,
            num_layers=2,
            num_heads=4,
            hidden_dim=128,
            intermediate_dim=512,
            num_mels=80,
            max_encoder_sequence_length=400,
            max_decoder_sequence_length=64,
        )
        inputs = {
            "encoder_features": keras.Input((400, 80), name="encoder_features"),
            "decoder_token_ids": keras.Input(
                (64,), dtype="int32", name="decoder_token_ids"
            ),
            "decoder_padding_mask": keras.Input(
                (64,), dtype="int32", name="decoder_padding_mask"
            ),
        }
        h = backbone(inputs)["decoder_sequence_output"]
        return inputs, layers.Dense(VOCAB)(h), True
    if name == "gemma_tiny":
        import keras_hub

        backbone = keras_hub.models.GemmaBackbone(
            vocabulary_size=VOCAB * 4,
            num_layers=4,
            num_query_heads=4,
            num_key_value_heads=1,
            hidden_dim=256,
            intermediate_dim=1024,
            head_dim=64,
        )
        return tied_lm(backbone)
    raise ValueError(name)
