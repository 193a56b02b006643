"""The estimator's sixth held-out set (issue #23).

The first five held-out sets (`_estimator_heldout.py` to
`_estimator_heldout5.py`) have each been estimated and used to find or
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
conv net, PointNet, keras-hub's ALBERT and DeBERTa-v3), the fourth (a
patch transformer, a siamese net, a Conformer, stacked LSTMs,
EfficientNetV2B0, keras-hub's Whisper and Gemma) and the fifth (a TCN, a
Perceiver, VGG16, ESPCN, DCN, a GRU encoder-decoder with attention,
ConvLSTM, keras-hub's Falcon). It was fixed in this file and committed
before any case was measured; its batch sizes come from the models'
arithmetic (weights, kept activations), not from the estimate. Its cases
are measured without an estimate; the set is estimated once
(`--heldout6 --reestimate`) after the estimator's rules are final. Why
each family is new:

- `mobilenetv1_64`: `keras.applications.MobileNet` (v1) at 64x64,
  `weights=None`, 10 classes: 13 depthwise-separable blocks (depthwise
  3x3, BatchNormalization, ReLU6, pointwise 1x1), no residual and no
  expansion (MobileNetV2 and V3 have inverted residual blocks with a
  linear bottleneck; V3 has squeeze-and-excitation).
- `cnn_bilstm_tagger`: a sequence tagger: token embedding, two `Conv1D`
  (width 5) over 256 steps, a bidirectional LSTM returning every step and
  a 20-way tag head at every token (no set tags per token with an LSTM;
  the first set's GRU and the design LSTM classify the sequence).
- `relpos_encoder`: a Transformer encoder built from layers with learned
  relative position biases: a (2L - 1) x heads table gathered into an
  L x L x heads bias added to every layer's attention scores (a custom
  attention: Dense projections, einsum, softmax); no position
  embedding. DeBERTa's relative positions are disentangled
  content-to-position projections, not a learned scalar bias table.
- `tabular_3heads`: an MLP for tabular data with BatchNormalization,
  ReLU and Dropout in each of three 1024-wide layers, then three heads
  (one a Dense on the last layer, one on the second, one on the first)
  summed into one regression output; MSE. (The first set's wide-and-deep
  has no BatchNormalization and one head.)
- `fpn`: an FPN-like multi-scale net: four strided `Conv2D` stages (128
  to 8 pixels), 1x1 lateral convolutions, a top-down path of
  `UpSampling2D` + `Add`, a 3x3 smoothing convolution and a 5-way
  per-pixel head at 32x32. (The first set's U-Net concatenates skips and
  uses transposed convolutions; no set adds upsampled maps.)
- `mil_attention`: attention-based multiple-instance learning: a bag of
  128 instances (256 features each) encoded by a shared MLP, gated
  attention (tanh x sigmoid, a Dense to one score per instance), a
  softmax over the instances and the weighted sum of the instances, a
  2-way head on the bag. No set pools with learned attention weights.
- `sepconv_audio`: a depthwise-separable 1-D audio net: `SeparableConv1D`
  (width 9) blocks with BatchNormalization and ReLU over 4096 frames of
  40 features, `MaxPooling1D` between them, global average pooling, a
  12-way head. (The first set's 1-D conv net and the fifth's TCN use full
  `Conv1D`; no set has a separable 1-D convolution.)
- `distilbert_tiny`: keras-hub's `DistilBertBackbone` from a tiny config
  (no download): a bidirectional post-LayerNorm encoder with learned
  positions and no segment embedding, logits through the tied token
  embedding (`reverse=True`) at every position, as a masked LM's head.

Variants: `base` (Adam) at two batch sizes, and at the larger one one or
two of `adamw` (AdamW), `sgd_momentum` (SGD, momentum 0.9),
`accumulation=4` (Adam, on `cnn_bilstm_tagger` and `tabular_3heads`),
`checkpointing=auto` (Adam, on `relpos_encoder` and `fpn`) and
`mixed_bfloat16` (Adam, on `mobilenetv1_64` and `distilbert_tiny`). Rough
arithmetic behind the batch sizes (float32): mobilenetv1_64 13 MiB of
weights (4x with Adam) and about 3 MiB of activations per sample;
cnn_bilstm_tagger 256 x 128 = 128 KiB per tensor per sample, about 12
kept, and the LSTM's per-step gates; relpos_encoder 4 x 128 x 128 scores
(256 KiB) per layer per sample, about 5 MiB per sample in all;
tabular_3heads 4 KiB per tensor per sample, about 20 kept (80 KiB per
sample); fpn about 4 MiB per sample (the 64x64x32 stage is 512 KiB);
mil_attention 128 KiB per 256-wide tensor per sample, about 2 MiB per
sample; sepconv_audio 4096 x 64 = 1 MiB per tensor per sample, about 10
MiB per sample; distilbert_tiny 24 MiB of weights and about 12 MiB per
sample (the 128 x 4000 logits are 2 MiB).
"""

from __future__ import annotations

from _keras_hub_lm import tied_lm

# name -> [(variant, batch), ...]
HELDOUT6 = {
    "mobilenetv1_64": [
        ("base", 8),
        ("base", 32),
        ("sgd_momentum", 32),
        ("mixed_bfloat16", 32),
    ],
    "cnn_bilstm_tagger": [
        ("base", 32),
        ("base", 96),
        ("accumulation=4", 96),
    ],
    "relpos_encoder": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "tabular_3heads": [
        ("base", 512),
        ("base", 2048),
        ("adamw", 2048),
        ("accumulation=4", 2048),
    ],
    "fpn": [
        ("base", 12),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "mil_attention": [
        ("base", 24),
        ("base", 64),
        ("sgd_momentum", 64),
    ],
    "sepconv_audio": [
        ("base", 4),
        ("base", 12),
        ("adamw", 12),
    ],
    "distilbert_tiny": [
        ("base", 4),
        ("base", 12),
        ("mixed_bfloat16", 12),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data); the language model's vocabulary is larger.
VOCAB = 1000


def _layers():
    """The custom layer of the set: self-attention with a learned relative
    position bias (the relative-position encoder)."""
    from keras import layers
    from keras import ops

    class RelativeAttention(layers.Layer):
        def __init__(self, heads, key_dim, length, **kwargs):
            super().__init__(**kwargs)
            self.heads, self.key_dim, self.length = heads, key_dim, length

        def build(self, input_shape):
            width = self.heads * self.key_dim
            self.qkv = layers.Dense(3 * width)
            self.qkv.build(input_shape)
            self.out = layers.Dense(input_shape[-1])
            self.out.build(input_shape[:-1] + (width,))
            self.table = self.add_weight(
                shape=(2 * self.length - 1, self.heads),
                initializer="zeros",
                name="relative_bias",
            )
            pos = ops.arange(self.length)
            self.index = pos[None, :] - pos[:, None] + self.length - 1

        def call(self, x):
            n = self.length
            q, k, v = ops.split(self.qkv(x), 3, axis=-1)
            shape = (-1, n, self.heads, self.key_dim)
            q, k, v = (ops.reshape(t, shape) for t in (q, k, v))
            scores = ops.einsum("bqhd,bkhd->bhqk", q, k)
            scores = scores * (self.key_dim**-0.5)
            bias = ops.take(ops.cast(self.table, scores.dtype), self.index, 0)
            scores = scores + ops.transpose(bias, (2, 0, 1))[None]
            weights = ops.softmax(scores, axis=-1)
            h = ops.einsum("bhqk,bkhd->bqhd", weights, v)
            return self.out(ops.reshape(h, (-1, n, self.heads * self.key_dim)))

    return RelativeAttention


def build_heldout6(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "mobilenetv1_64":
        app = keras.applications.MobileNet(
            weights=None, input_shape=(64, 64, 3), classes=10
        )
        return app.inputs[0], app.outputs[0], True
    if name == "cnn_bilstm_tagger":
        inp = keras.Input((256,), dtype="int32")
        x = layers.Embedding(VOCAB, 128)(inp)
        x = layers.Conv1D(128, 5, padding="same", activation="relu")(x)
        x = layers.Conv1D(128, 5, padding="same", activation="relu")(x)
        x = layers.Bidirectional(layers.LSTM(128, return_sequences=True))(x)
        return inp, layers.Dense(20)(x), True
    if name == "relpos_encoder":
        attention = _layers()
        inp = keras.Input((128,), dtype="int32")
        x = layers.Embedding(VOCAB, 128)(inp)
        for _ in range(3):
            h = layers.LayerNormalization()(x)
            x = layers.Add()([x, attention(4, 32, 128)(h)])
            h = layers.LayerNormalization()(x)
            h = layers.Dense(512, activation="gelu")(h)
            x = layers.Add()([x, layers.Dense(128)(h)])
        x = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(x))
        return inp, layers.Dense(10)(x), True
    if name == "tabular_3heads":
        inp = keras.Input((512,))
        x, heads = inp, []
        for _ in range(3):
            x = layers.Dense(1024)(x)
            x = layers.BatchNormalization()(x)
            x = layers.Activation("relu")(x)
            x = layers.Dropout(0.2)(x)
            heads.append(layers.Dense(1)(x))
        return inp, layers.Add()(heads), False
    if name == "fpn":
        inp = keras.Input((128, 128, 3))
        x, stages = inp, []
        for filters in (32, 64, 128, 256):
            x = layers.Conv2D(
                filters, 3, strides=2, padding="same", activation="relu"
            )(x)
            stages.append(x)
        p = layers.Conv2D(64, 1)(stages[-1])
        for c in reversed(stages[1:-1]):  # 16x16, then 32x32
            p = layers.Add()(
                [layers.UpSampling2D()(p), layers.Conv2D(64, 1)(c)]
            )
        p = layers.Conv2D(64, 3, padding="same", activation="relu")(p)
        return inp, layers.Conv2D(5, 1)(p), True
    if name == "mil_attention":
        inp = keras.Input((128, 256))
        h = layers.Dense(512, activation="relu")(inp)
        h = layers.Dense(256, activation="relu")(h)
        gate = layers.Multiply()(
            [
                layers.Dense(128, activation="tanh")(h),
                layers.Dense(128, activation="sigmoid")(h),
            ]
        )
        scores = layers.Dense(1)(gate)
        weights = layers.Softmax(axis=1)(scores)
        bag = layers.Dot(axes=1)([weights, h])  # (batch, 1, 256)
        bag = layers.Flatten()(bag)
        return inp, layers.Dense(2)(bag), True
    if name == "sepconv_audio":
        inp = keras.Input((4096, 40))
        x = inp
        for filters in (64, 64, 128, 128):
            x = layers.SeparableConv1D(filters, 9, padding="same")(x)
            x = layers.BatchNormalization()(x)
            x = layers.Activation("relu")(x)
            x = layers.MaxPooling1D(2)(x)
        x = layers.GlobalAveragePooling1D()(x)
        return inp, layers.Dense(12)(x), True
    if name == "distilbert_tiny":
        import keras_hub

        backbone = keras_hub.models.DistilBertBackbone(
            vocabulary_size=VOCAB * 4,
            num_layers=4,
            num_heads=4,
            hidden_dim=256,
            intermediate_dim=1024,
            max_sequence_length=128,
        )
        return tied_lm(backbone)
    raise ValueError(name)
