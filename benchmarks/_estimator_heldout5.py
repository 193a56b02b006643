"""The estimator's fifth held-out set (issue #23).

The first four held-out sets (`_estimator_heldout.py` to
`_estimator_heldout4.py`) have each been estimated and used to find or
diagnose defects, so none judges the rules unseen any more. This set is
their successor: model families in none of the design set (`MODELS` in
`estimator_accuracy.py`: MLPs, a BatchNorm CNN, MobileNetV2, ResNet50,
EfficientNetB0, self-attention transformer blocks on dense inputs, a
one-way LSTM classifier, an embedding classifier, keras-io's text
transformer and ViT), the first held-out set (a bidirectional GRU, a 1-D
conv net, a U-Net-like net, DenseNet121, MobileNetV3Small, keras-hub's
GPT-2, a wide-and-deep MLP, a convolutional autoencoder), the second (an
LSTM encoder-decoder, a two-tower retrieval model, a 3-D conv net, an
MLP-Mixer, a ResNeXt-like net, keras-hub's T5, FNet and Mixtral), the
third (a WaveNet-like net, a CRNN, an Xception-like net, a VAE, a graph
conv net, PointNet, keras-hub's ALBERT and DeBERTa-v3) and the fourth (a
patch transformer, a siamese net, a Conformer, stacked LSTMs,
EfficientNetV2B0, keras-hub's Whisper and Gemma). It was fixed in this
file and committed before any case was measured; its batch sizes come from
the models' arithmetic (weights, kept activations), not from the estimate.
Its cases are measured without an estimate; the set is estimated once
(`--heldout5 --reestimate`) after the estimator's rules are final. Why
each family is new:

- `tcn`: a temporal convolutional net: a 1x1 `Conv1D` stem, then six
  residual blocks of two causal dilated `Conv1D` (width 3, dilations 1 to
  32, ReLU, no gate) over 1024 steps, the head on the last step. (The
  third set's WaveNet gates each layer with tanh x sigmoid and sums skip
  connections; the first set's 1-D conv net has no dilation and no
  residual.)
- `perceiver`: a Perceiver-like classifier: a learned latent array (64 x
  128, a weight broadcast over the batch) cross-attends to 1024 input
  elements (queries from the latents, keys and values from the inputs:
  a 64 x 1024 score matrix per head), then four self-attention blocks
  over the latents only; no set attends from a learned array.
- `vgg16_32`: `keras.applications.VGG16` at 32x32, `weights=None`,
  without its top (global average pooling, a 10-way head): 14.7M weights
  in 13 plain 3x3 convolutions, no BatchNormalization, no residual; the
  weights and their optimizer state, not the activations, are most of
  the step.
- `espcn`: an ESPCN-like super-resolution net: three convolutions (5x5,
  3x3, 3x3, tanh) at the low resolution, then a sub-pixel shuffle
  (`tf.nn.depth_to_space`, x3) to a 192x192 image; MSE on the image. The
  output is larger than the input; no set has a depth-to-space.
- `dcn`: a Deep & Cross Network (v2-like) on tabular data: 16 embedded
  categorical ids and 256 numeric features form x0, three cross layers
  compute `x0 * Dense(x) + x` (an elementwise product with the first
  layer's output, kept for the whole backward pass), beside a deep
  ReLU tower; the two concatenated, a 2-way head. (The first set's
  wide-and-deep has no cross layer.)
- `gru_attention`: a GRU encoder-decoder with dot-product attention: the
  encoder returns every step and its final state, which starts the
  decoder; `keras.layers.Attention` from each decoder step to every
  encoder step, the context concatenated to the decoder's output, a
  vocabulary head at each step. (The second set's LSTM seq2seq has no
  attention; the first set's GRU is a bidirectional classifier.)
- `convlstm`: next-frame prediction with two `ConvLSTM2D` layers (3x3
  convolutional gates over 8 frames of 32x32, returning every frame),
  BatchNormalization between them, a `Conv3D` sigmoid head; MSE on the
  frames. No set has a convolutional recurrent cell.
- `falcon_tiny`: keras-hub's `FalconBackbone` from a tiny config (no
  download): ALiBi position biases (added to the scores, no position
  embedding and no rotary), float32 softmax, a GELU feed-forward; logits
  through the tied token embedding (`reverse=True`) at every position.

Variants: `base` (Adam) at two batch sizes, and at the larger one one or
two of `adamw` (AdamW), `sgd_momentum` (SGD, momentum 0.9),
`accumulation=4` (Adam, on `espcn` and `dcn`), `checkpointing=auto`
(Adam, on `tcn` and `perceiver`) and `mixed_bfloat16` (Adam, on
`vgg16_32` and `falcon_tiny`). Rough arithmetic behind the batch sizes
(float32): tcn 1024 x 64 = 256 KiB per tensor per sample, about 40 kept
per sample; perceiver 2.5 MiB of keys, values and scores per sample;
vgg16_32 56 MiB of weights (4x with Adam) and about 2 MiB of activations
per sample; espcn about 4 MiB per sample; dcn about 36 KiB per sample and
7 MiB of weights; gru_attention about 10 KiB per step per sample and a
1000-way logit per step; convlstm about 9 MiB per sample (9 tensors of
64 KiB per frame per layer); falcon_tiny 16 MiB of weights and about 16
MiB per sample.
"""

from __future__ import annotations

from _keras_hub_lm import tied_lm

# name -> [(variant, batch), ...]
HELDOUT5 = {
    "tcn": [
        ("base", 4),
        ("base", 16),
        ("adamw", 16),
        ("checkpointing=auto", 16),
    ],
    "perceiver": [
        ("base", 16),
        ("base", 48),
        ("sgd_momentum", 48),
        ("checkpointing=auto", 48),
    ],
    "vgg16_32": [
        ("base", 8),
        ("base", 32),
        ("sgd_momentum", 32),
        ("mixed_bfloat16", 32),
    ],
    "espcn": [
        ("base", 8),
        ("base", 32),
        ("adamw", 32),
        ("accumulation=4", 32),
    ],
    "dcn": [
        ("base", 1024),
        ("base", 4096),
        ("sgd_momentum", 4096),
        ("accumulation=4", 4096),
    ],
    "gru_attention": [
        ("base", 128),
        ("base", 256),
        ("adamw", 256),
    ],
    "convlstm": [
        ("base", 8),
        ("base", 20),
        ("sgd_momentum", 20),
    ],
    "falcon_tiny": [
        ("base", 4),
        ("base", 12),
        ("mixed_bfloat16", 12),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data); the language model's vocabulary is larger.
VOCAB = 1000


def _layers():
    """The custom layers of the set: a learned latent array broadcast over
    the batch (the Perceiver), a sub-pixel shuffle (ESPCN) and a cross
    layer (DCN)."""
    import tensorflow as tf
    from keras import layers
    from keras import ops

    class Latents(layers.Layer):
        def __init__(self, count, width, **kwargs):
            super().__init__(**kwargs)
            self.count, self.width = count, width

        def build(self, input_shape):
            self.latents = self.add_weight(
                shape=(1, self.count, self.width),
                initializer="random_normal",
                name="latents",
            )

        def call(self, x):
            latents = ops.cast(self.latents, self.compute_dtype)
            return ops.broadcast_to(
                latents, (ops.shape(x)[0], self.count, self.width)
            )

    class DepthToSpace(layers.Layer):
        def __init__(self, block, **kwargs):
            super().__init__(**kwargs)
            self.block = block

        def call(self, x):
            return tf.nn.depth_to_space(x, self.block)

    class Cross(layers.Layer):
        def build(self, input_shape):
            self.dense = layers.Dense(input_shape[0][-1])
            self.dense.build(input_shape[1])

        def call(self, inputs):
            x0, x = inputs
            return x0 * self.dense(x) + x

    return Latents, DepthToSpace, Cross


def build_heldout5(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "tcn":
        inp = keras.Input((1024, 16))
        x = layers.Conv1D(64, 1)(inp)
        for dilation in (1, 2, 4, 8, 16, 32):
            h = layers.Conv1D(
                64,
                3,
                padding="causal",
                dilation_rate=dilation,
                activation="relu",
            )(x)
            h = layers.Conv1D(
                64,
                3,
                padding="causal",
                dilation_rate=dilation,
                activation="relu",
            )(h)
            x = layers.Add()([x, h])
        x = layers.Lambda(lambda t: t[:, -1])(x)
        return inp, layers.Dense(10)(x), True
    if name == "perceiver":
        latents, _, _ = _layers()
        inp = keras.Input((1024, 64))
        z = latents(64, 128)(inp)
        h = layers.MultiHeadAttention(4, 32)(z, inp)  # query: the latents
        z = layers.LayerNormalization()(layers.Add()([z, h]))
        h = layers.Dense(512, activation="gelu")(z)
        z = layers.Add()([z, layers.Dense(128)(h)])
        for _ in range(4):
            h = layers.LayerNormalization()(z)
            h = layers.MultiHeadAttention(4, 32)(h, h)
            z = layers.Add()([z, h])
            h = layers.LayerNormalization()(z)
            h = layers.Dense(512, activation="gelu")(h)
            z = layers.Add()([z, layers.Dense(128)(h)])
        z = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(z))
        return inp, layers.Dense(10)(z), True
    if name == "vgg16_32":
        app = keras.applications.VGG16(
            weights=None,
            include_top=False,
            input_shape=(32, 32, 3),
            pooling="avg",
        )
        out = layers.Dense(10)(app.outputs[0])
        return app.inputs[0], out, True
    if name == "espcn":
        _, depth_to_space, _ = _layers()
        inp = keras.Input((64, 64, 3))
        x = layers.Conv2D(64, 5, padding="same", activation="tanh")(inp)
        x = layers.Conv2D(32, 3, padding="same", activation="tanh")(x)
        x = layers.Conv2D(3 * 3 * 3, 3, padding="same")(x)
        return inp, depth_to_space(3)(x), False
    if name == "dcn":
        _, _, cross = _layers()
        ids = keras.Input((16,), dtype="int32", name="categorical")
        numeric = keras.Input((256,), name="numeric")
        e = layers.Flatten()(layers.Embedding(VOCAB, 16)(ids))
        x0 = layers.Concatenate()([e, numeric])
        c = x0
        for _ in range(3):
            c = cross()([x0, c])
        d = layers.Dense(1024, activation="relu")(x0)
        d = layers.Dense(512, activation="relu")(d)
        x = layers.Concatenate()([c, d])
        return [ids, numeric], layers.Dense(2)(x), True
    if name == "gru_attention":
        source = keras.Input((32,), dtype="int32", name="source")
        target = keras.Input((32,), dtype="int32", name="target_in")
        e = layers.Embedding(VOCAB, 128)(source)
        encoded, state = layers.GRU(
            256, return_sequences=True, return_state=True
        )(e)
        d = layers.Embedding(VOCAB, 128)(target)
        d = layers.GRU(256, return_sequences=True)(d, initial_state=state)
        context = layers.Attention()([d, encoded])
        x = layers.Concatenate()([d, context])
        return [source, target], layers.Dense(VOCAB)(x), True
    if name == "convlstm":
        inp = keras.Input((8, 32, 32, 1))
        x = layers.ConvLSTM2D(16, 3, padding="same", return_sequences=True)(inp)
        x = layers.BatchNormalization()(x)
        x = layers.ConvLSTM2D(16, 3, padding="same", return_sequences=True)(x)
        out = layers.Conv3D(1, 3, padding="same", activation="sigmoid")(x)
        return inp, out, False
    if name == "falcon_tiny":
        import keras_hub

        backbone = keras_hub.models.FalconBackbone(
            vocabulary_size=VOCAB * 4,
            num_layers=4,
            num_attention_heads=4,
            hidden_dim=256,
            intermediate_dim=1024,
        )
        return tied_lm(backbone)
    raise ValueError(name)
