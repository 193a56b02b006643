"""The estimator's seventh held-out set (issue #23).

The first six held-out sets (`_estimator_heldout.py` to
`_estimator_heldout6.py`) have each been estimated, so none judges the
rules unseen any more. This set is their successor: model families in
none of the design set (`MODELS` in `estimator_accuracy.py`: MLPs, a
BatchNorm CNN, MobileNetV2, ResNet50, EfficientNetB0, self-attention
transformer blocks on dense inputs, a one-way LSTM classifier, an
embedding classifier, keras-io's text transformer and ViT), the first
held-out set (a bidirectional GRU, a 1-D conv net, a U-Net-like net,
DenseNet121, MobileNetV3Small, keras-hub's GPT-2, a wide-and-deep MLP, a
convolutional autoencoder), the second (an LSTM encoder-decoder, a
two-tower retrieval model, a 3-D conv net, an MLP-Mixer, a ResNeXt-like
net, keras-hub's T5, FNet and Mixtral), the third (a WaveNet-like net, a
CRNN, an Xception-like net, a VAE, a graph conv net, PointNet,
keras-hub's ALBERT and DeBERTa-v3), the fourth (a patch transformer, a
siamese net, a Conformer, stacked LSTMs, EfficientNetV2B0, keras-hub's
Whisper and Gemma), the fifth (a TCN, a Perceiver, VGG16, ESPCN, DCN, a
GRU encoder-decoder with attention, ConvLSTM, keras-hub's Falcon) and the
sixth (MobileNet v1, a Conv1D + BiLSTM tagger, a relative-position
encoder, a three-head tabular MLP, an FPN, attention MIL, a separable
1-D audio net, keras-hub's DistilBERT). It was fixed in this file and
committed before any case was measured; its batch sizes come from the
models' arithmetic (weights, kept activations), not from the estimate.
Its cases are measured without an estimate; the set is estimated once
(`--heldout7 --reestimate`) after the estimator's rules are final. Why
each family is new:

- `convnext_mini`: a ConvNeXt-like net built from layers at 128x128: a
  4x4 stride-4 patchify stem, blocks of depthwise 7x7 convolution,
  LayerNormalization (not BatchNormalization), an inverted 4x pointwise
  MLP (Dense 4d, GELU, Dense d) and a residual add, LayerNorm + 2x2
  stride-2 convolutions between the stages. No set has a 7x7 depthwise
  convolution followed by LayerNorm and an inverted MLP (MobileNetV2/V3,
  EfficientNet and MobileNet v1 use 3x3/5x5 depthwise with BatchNorm;
  ResNeXt uses grouped 3x3 convolutions).
- `swin_tiny`: keras-hub's `SwinTransformerBackbone` from a tiny config
  (no download) at 128x128: self-attention inside 8x8 windows,
  alternately shifted, with a relative position bias, patch merging
  between the stages, stochastic depth; global average pooling and a
  10-way head. The patch transformer, ViT, Perceiver and the Mixer attend
  over (or mix) all patches; no set has windowed, shifted attention.
- `bloom_tiny`: keras-hub's `BloomBackbone` from a tiny config: a causal
  decoder with ALiBi (a linear bias on the attention scores per head, no
  position embedding of any kind), a LayerNorm on the embeddings, logits
  through the tied token embedding. GPT-2 and OPT-like decoders use
  learned positions, Gemma/Mixtral/Falcon rotary embeddings.
- `pixelcnn`: a PixelCNN-style autoregressive image model: masked
  convolutions (a type-A 7x7 mask, then residual blocks of 1x1, masked
  type-B 3x3, 1x1), a 16-way per-pixel head over 32x32 grey images. The
  mask multiplies the kernel inside the step (a custom layer); no set
  has masked convolutions.
- `gmlp`: gMLP on token embeddings: each block a LayerNorm, a channel
  expansion with GELU split into two halves, the spatial gating unit
  (LayerNorm, then a learned L x L projection across the tokens, bias
  initialised to one) multiplying the other half, a projection back and a
  residual add. The MLP-Mixer mixes tokens with an MLP on transposed
  activations without gating; FNet mixes with Fourier transforms.
- `ncf`: neural collaborative filtering (He et al. 2017): user and item
  ids (20000 and 10000 rows) into a GMF branch (an elementwise product of
  32-wide embeddings) and an MLP branch (64-wide embeddings concatenated,
  256-128-64), both concatenated into one rating output; MSE, large
  batches. The two-tower model compares two towers with a dot product and
  has no GMF product or joint MLP; DCN has cross layers on dense inputs.
- `char_cnn`: a character-level CNN text classifier (Zhang et al. 2015,
  smaller): a 16-wide embedding of 512 characters, six `Conv1D` (256
  filters, widths 7, 7, 3, 3, 3, 3) with three max-poolings by 3, then
  a flattened 15 x 256 map into two 1024-wide Dense layers with Dropout
  and a 4-way head. The first set's 1-D conv net reads float frames and
  pools globally; no set feeds a flattened conv map into large Dense
  layers from character ids.
- `xattn_seq2seq`: a Transformer encoder-decoder built from layers:
  token + learned position embeddings on both sides (128 tokens), two
  encoder layers (self-attention, FFN), two decoder layers (causal
  self-attention, cross-attention to the encoder's output, FFN), post-
  LayerNorm, a 1000-way head at every target token. T5 and Whisper are
  keras-hub's (relative buckets, a convolutional audio front end); the
  GRU encoder-decoder attends with additive attention over GRU states.

Variants: `base` (Adam) at two batch sizes, and at the larger one one or
two of `adamw` (AdamW), `sgd_momentum` (SGD, momentum 0.9),
`accumulation=4` (Adam, on `ncf` and `char_cnn`), `checkpointing=auto`
(Adam, on `convnext_mini`, `bloom_tiny`, `gmlp` and `xattn_seq2seq`) and
`mixed_bfloat16` (Adam, on `swin_tiny`). Rough arithmetic behind the
batch sizes (float32): convnext_mini about 1.5M weights (6 MiB, 24 MiB
with Adam) and the 32x32x64 stage's 256 KiB tensors (1 MiB expanded),
about 9 MiB per sample; swin_tiny 1024 tokens x 48 = 192 KiB per tensor
(768 KiB in the MLP), about 8 MiB per sample; bloom_tiny about 4.2M
weights (68 MiB with Adam) and about 12 MiB per sample (the 128 x 4000
logits are 2 MiB); pixelcnn 32x32x64 = 256 KiB per tensor, about 30 kept
(7.5 MiB per sample); gmlp 128 x 512 = 256 KiB per tensor, about 6 kept
per block of 4 (6 MiB per sample); ncf 2.9M embedding weights (44 MiB
with Adam) and about 5 KiB per sample; char_cnn about 5.5M weights (88
MiB with Adam) and about 2 MiB per sample (512 x 256 maps);
xattn_seq2seq about 8 MiB per sample (scores 4 x 128 x 128, logits 128
x 1000).
"""

from __future__ import annotations

from _keras_hub_lm import tied_lm

# name -> [(variant, batch), ...]
HELDOUT7 = {
    "convnext_mini": [
        ("base", 4),
        ("base", 16),
        ("checkpointing=auto", 16),
        ("sgd_momentum", 16),
    ],
    "swin_tiny": [
        ("base", 4),
        ("base", 16),
        ("mixed_bfloat16", 16),
    ],
    "bloom_tiny": [
        ("base", 4),
        ("base", 12),
        ("checkpointing=auto", 12),
        ("adamw", 12),
    ],
    "pixelcnn": [
        ("base", 8),
        ("base", 24),
        ("sgd_momentum", 24),
    ],
    "gmlp": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
        ("adamw", 32),
    ],
    "ncf": [
        ("base", 4096),
        ("base", 16384),
        ("accumulation=4", 16384),
    ],
    "char_cnn": [
        ("base", 16),
        ("base", 64),
        ("accumulation=4", 64),
    ],
    "xattn_seq2seq": [
        ("base", 8),
        ("base", 24),
        ("checkpointing=auto", 24),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data); the language model's vocabulary is larger.
VOCAB = 1000


def _layers():
    """The custom layers of the set: PixelCNN's masked convolution and
    gMLP's spatial gating unit."""
    from keras import layers
    from keras import ops

    class MaskedConv2D(layers.Layer):
        """A 'same' convolution whose kernel sees only the pixels above
        and to the left (type A: not the centre; type B: the centre
        too)."""

        def __init__(self, filters, size, kind, activation=None, **kwargs):
            super().__init__(**kwargs)
            self.filters, self.size, self.kind = filters, size, kind
            self.activation = activation

        def build(self, input_shape):
            import numpy as np

            k = self.size
            self.kernel = self.add_weight(
                shape=(k, k, input_shape[-1], self.filters),
                initializer="glorot_uniform",
                name="kernel",
            )
            self.bias = self.add_weight(
                shape=(self.filters,), initializer="zeros", name="bias"
            )
            mask = np.ones((k, k, 1, 1), "float32")
            mask[k // 2, k // 2 + (self.kind == "B") :] = 0
            mask[k // 2 + 1 :] = 0
            self.mask = mask

        def call(self, x):
            kernel = self.kernel * ops.cast(self.mask, self.kernel.dtype)
            y = ops.conv(x, ops.cast(kernel, x.dtype), padding="same")
            y = y + ops.cast(self.bias, y.dtype)
            return ops.relu(y) if self.activation == "relu" else y

    class SpatialGating(layers.Layer):
        """gMLP's spatial gating unit: u * (W norm(v) + b) over tokens."""

        def build(self, input_shape):
            n = input_shape[1]
            self.norm = layers.LayerNormalization()
            self.norm.build(input_shape[:-1] + (input_shape[-1] // 2,))
            self.w = self.add_weight(
                shape=(n, n), initializer="zeros", name="spatial_kernel"
            )
            self.b = self.add_weight(
                shape=(n,), initializer="ones", name="spatial_bias"
            )

        def call(self, x):
            u, v = ops.split(x, 2, axis=-1)
            v = self.norm(v)
            w = ops.cast(self.w, v.dtype)
            v = ops.einsum("mn,bnd->bmd", w, v)
            v = v + ops.cast(self.b, v.dtype)[None, :, None]
            return u * v

    return MaskedConv2D, SpatialGating


def _encoder_decoder():
    """(inputs, logits) of the cross-attention encoder-decoder."""
    import keras
    from keras import layers
    from keras import ops

    class TokenAndPosition(layers.Layer):
        def __init__(self, length, vocab, dim, **kwargs):
            super().__init__(**kwargs)
            self.token = layers.Embedding(vocab, dim)
            self.position = layers.Embedding(length, dim)
            self.length = length

        def call(self, ids):
            return self.token(ids) + self.position(ops.arange(self.length))

    length, dim = 128, 128
    source = keras.Input((length,), dtype="int32", name="source_ids")
    target = keras.Input((length,), dtype="int32", name="target_ids")
    h = TokenAndPosition(length, VOCAB, dim)(source)
    for _ in range(2):
        a = layers.MultiHeadAttention(4, 32)(h, h)
        h = layers.LayerNormalization()(layers.Add()([h, a]))
        f = layers.Dense(512, activation="relu")(h)
        f = layers.Dense(dim)(f)
        h = layers.LayerNormalization()(layers.Add()([h, f]))
    y = TokenAndPosition(length, VOCAB, dim)(target)
    for _ in range(2):
        a = layers.MultiHeadAttention(4, 32)(y, y, use_causal_mask=True)
        y = layers.LayerNormalization()(layers.Add()([y, a]))
        a = layers.MultiHeadAttention(4, 32)(y, h)
        y = layers.LayerNormalization()(layers.Add()([y, a]))
        f = layers.Dense(512, activation="relu")(y)
        f = layers.Dense(dim)(f)
        y = layers.LayerNormalization()(layers.Add()([y, f]))
    return [source, target], layers.Dense(VOCAB)(y)


def build_heldout7(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "convnext_mini":
        inp = keras.Input((128, 128, 3))
        x = layers.Conv2D(64, 4, strides=4)(inp)
        x = layers.LayerNormalization(epsilon=1e-6)(x)
        for stage, dim in enumerate((64, 128, 256)):
            if stage:
                x = layers.LayerNormalization(epsilon=1e-6)(x)
                x = layers.Conv2D(dim, 2, strides=2)(x)
            for _ in range(2):
                h = layers.DepthwiseConv2D(7, padding="same")(x)
                h = layers.LayerNormalization(epsilon=1e-6)(h)
                h = layers.Dense(4 * dim, activation="gelu")(h)
                h = layers.Dense(dim)(h)
                x = layers.Add()([x, h])
        x = layers.GlobalAveragePooling2D()(x)
        x = layers.LayerNormalization(epsilon=1e-6)(x)
        return inp, layers.Dense(10)(x), True
    if name == "swin_tiny":
        import keras_hub

        backbone = keras_hub.models.SwinTransformerBackbone(
            image_shape=(128, 128, 3),
            embed_dim=48,
            depths=(2, 2),
            num_heads=(3, 6),
            window_size=8,
            patch_size=4,
        )
        inp = keras.Input((128, 128, 3))
        h = backbone(inp)
        if isinstance(h, dict):  # a pyramid of feature maps: the last
            h = h[sorted(h)[-1]]
        while len(h.shape) > 2:
            h = layers.GlobalAveragePooling1D()(
                layers.Reshape((-1, h.shape[-1]))(h)
            )
        return inp, layers.Dense(10)(h), True
    if name == "bloom_tiny":
        import keras_hub

        backbone = keras_hub.models.BloomBackbone(
            vocabulary_size=VOCAB * 4,
            num_layers=4,
            num_heads=4,
            hidden_dim=256,
            intermediate_dim=1024,
        )
        return tied_lm(backbone)
    if name == "pixelcnn":
        masked, _ = _layers()
        inp = keras.Input((32, 32, 1))
        x = masked(64, 7, "A", activation="relu")(inp)
        for _ in range(5):
            h = layers.Conv2D(32, 1, activation="relu")(x)
            h = masked(32, 3, "B", activation="relu")(h)
            h = layers.Conv2D(64, 1, activation="relu")(h)
            x = layers.Add()([x, h])
        x = layers.Conv2D(64, 1, activation="relu")(x)
        x = layers.Conv2D(64, 1, activation="relu")(x)
        return inp, layers.Conv2D(16, 1)(x), True
    if name == "gmlp":
        _, gating = _layers()
        inp = keras.Input((128,), dtype="int32")
        x = layers.Embedding(VOCAB, 128)(inp)
        for _ in range(4):
            h = layers.LayerNormalization()(x)
            h = layers.Dense(512, activation="gelu")(h)
            h = gating()(h)
            h = layers.Dense(128)(h)
            x = layers.Add()([x, h])
        x = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(x))
        return inp, layers.Dense(10)(x), True
    if name == "ncf":
        user = keras.Input((1,), dtype="int32", name="user_id")
        item = keras.Input((1,), dtype="int32", name="item_id")
        gmf = layers.Multiply()(
            [
                layers.Flatten()(layers.Embedding(20000, 32)(user)),
                layers.Flatten()(layers.Embedding(10000, 32)(item)),
            ]
        )
        mlp = layers.Concatenate()(
            [
                layers.Flatten()(layers.Embedding(20000, 64)(user)),
                layers.Flatten()(layers.Embedding(10000, 64)(item)),
            ]
        )
        for width in (256, 128, 64):
            mlp = layers.Dense(width, activation="relu")(mlp)
        out = layers.Dense(1)(layers.Concatenate()([gmf, mlp]))
        return [user, item], out, False
    if name == "char_cnn":
        inp = keras.Input((512,), dtype="int32")
        x = layers.Embedding(VOCAB, 16)(inp)
        for width, pool in ((7, True), (7, True), (3, False), (3, False)):
            x = layers.Conv1D(256, width, activation="relu")(x)
            if pool:
                x = layers.MaxPooling1D(3)(x)
        x = layers.Conv1D(256, 3, activation="relu")(x)
        x = layers.Conv1D(256, 3, activation="relu")(x)
        x = layers.MaxPooling1D(3)(x)
        x = layers.Flatten()(x)
        for _ in range(2):
            x = layers.Dense(1024, activation="relu")(x)
            x = layers.Dropout(0.5)(x)
        return inp, layers.Dense(4)(x), True
    if name == "xattn_seq2seq":
        inputs, logits = _encoder_decoder()
        return inputs, logits, True
    raise ValueError(name)
