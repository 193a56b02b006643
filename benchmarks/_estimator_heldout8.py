"""The estimator's eighth held-out set (issue #23).

The first seven held-out sets (`_estimator_heldout.py` to
`_estimator_heldout7.py`) have each been seen, so none judges the rules
unseen any more. This set is their successor: model families in none of
the design set (`MODELS` in `estimator_accuracy.py`: MLPs, a BatchNorm
CNN, MobileNetV2, ResNet50, EfficientNetB0, self-attention transformer
blocks on dense inputs, a one-way LSTM classifier, an embedding
classifier, keras-io's text transformer and ViT), the first held-out set
(a bidirectional GRU, a 1-D conv net, a U-Net-like net, DenseNet121,
MobileNetV3Small, keras-hub's GPT-2, a wide-and-deep MLP, a
convolutional autoencoder), the second (an LSTM encoder-decoder, a
two-tower retrieval model, a 3-D conv net, an MLP-Mixer, a ResNeXt-like
net, keras-hub's T5, FNet and Mixtral), the third (a WaveNet-like net, a
CRNN, an Xception-like net, a VAE, a graph conv net, PointNet,
keras-hub's ALBERT and DeBERTa-v3), the fourth (a patch transformer, a
siamese net, a Conformer, stacked LSTMs, EfficientNetV2B0, keras-hub's
Whisper and Gemma), the fifth (a TCN, a Perceiver, VGG16, ESPCN, DCN, a
GRU encoder-decoder with attention, ConvLSTM, keras-hub's Falcon), the
sixth (MobileNet v1, a Conv1D + BiLSTM tagger, a relative-position
encoder, a three-head tabular MLP, an FPN, attention MIL, a separable
1-D audio net, keras-hub's DistilBERT) and the seventh (a ConvNeXt-like
net, keras-hub's Swin Transformer and BLOOM, a PixelCNN, gMLP, NCF, a
character-level CNN, a cross-attention encoder-decoder). It was fixed
in this file and committed before any case was measured; its batch sizes
come from the models' arithmetic (weights, kept activations), not from
the estimate. Its cases are measured without an estimate; the set is
estimated once (`--heldout8 --reestimate`) after the estimator's rules
are final. Why each family is new:

- `inception_mini`: a GoogLeNet-style net built from layers at 64x64: a
  stem of two convolutions (BatchNormalization, ReLU) to 32x32, then
  Inception modules whose four parallel branches (1x1; 1x1 then 3x3;
  1x1 then 5x5; 3x3 max-pooling then 1x1) are concatenated along the
  channels, two at 32x32 and two at 16x16 after a max-pooling, global
  average pooling and a 10-way head. No set concatenates parallel
  branches of different kernel sizes (DenseNet concatenates one layer's
  output to its input, the U-Net a skip, Xception and ResNeXt stack or
  group convolutions of one size).
- `shufflenet_v2`: ShuffleNet v2 (1.0x: 116, 232, 464 channels) built
  from layers at 128x128: a strided 3x3 stem and a max-pooling, units
  that split the channels in two halves, pass one through 1x1,
  depthwise 3x3 and 1x1 convolutions (BatchNormalization), concatenate
  it with the other and shuffle the channels (reshape, transpose,
  reshape), downsampling units with two strided branches, a 1x1
  convolution to 1024, global average pooling and a 10-way head. No set
  splits or shuffles channels (MobileNets add residuals, ResNeXt sums
  grouped convolutions).
- `segformer_tiny`: keras-hub's `SegFormerBackbone` on a `MiTBackbone`
  from a tiny config (no download) at 128x128: overlapping strided patch
  embeddings, efficient self-attention whose keys and values come from a
  spatially reduced map (a strided convolution, reduction 8, 4, 2, 1),
  Mix-FFN (a depthwise 3x3 convolution inside the MLP), four stages; the
  all-MLP decoder projects each stage, resizes to 32x32, concatenates and
  fuses them; a dropout, an 8-way 1x1 head and a bilinear resize to
  128x128 per-pixel logits (keras-hub's `SegFormerImageSegmenter` head).
  Swin attends inside windows, ViT, the patch transformer and the
  Perceiver over all tokens or a latent array; no set reduces the keys
  and values spatially, and no attention model segments.
- `mobilevit`: keras-io's MobileViT (its XXS-like configuration,
  expansion 2) at 128x128: MobileNetV2-style inverted residual blocks
  with swish, then MobileViT blocks: local 3x3 and 1x1 convolutions, the
  map reshaped into 4 pixel positions x (H W / 4) patches, Transformer
  layers (LayerNorm, two-head attention across the patches for each
  pixel position, an MLP with swish) over that axis, reshaped back, a 1x1
  convolution, concatenated with the block's input and fused by a 3x3
  convolution; a 1x1 convolution to 320, global average pooling, a
  10-way head. No set interleaves convolutions with attention over
  reshaped feature maps (the Conformer's convolution module is 1-D over
  audio frames).
- `gru4rec`: a session-based recommender in the GRU4Rec style: 64 item
  ids (a 4000-item catalogue) into a 128-wide embedding, a GRU of 256
  returning every step, dropout, and a 4000-way next-item head at every
  step. The recurrent sets classify a sequence (the first set's GRU, the
  design LSTM), tag it with a small head (the sixth set's BiLSTM: 20
  tags, stacked LSTMs: 20 classes) or decode another sequence (the
  encoder-decoders); no set has a recurrent net with a catalogue-sized
  softmax at every step.
- `deepfm`: DeepFM (Guo et al. 2017) on 26 categorical fields (one
  1000-id range per field, offset into one 26000-row table) and 13
  numeric features: a first-order term (1-wide embeddings summed, a
  Dense on the numeric features), the factorisation machine's pairwise
  interactions of the 16-wide field embeddings (half of the squared sum
  minus the sum of squares) and a deep part (the flattened embeddings
  and numeric features through three 400-wide Dense layers with ReLU and
  Dropout 0.5), all summed into one output; MSE. DCN crosses the input
  with cross layers, wide-and-deep concatenates a wide input, NCF
  multiplies one user and one item embedding; no set has the FM's
  pairwise interactions over many fields.
- `dncnn`: DnCNN (Zhang et al. 2017), the denoiser: 17 layers of 3x3
  convolutions at the full 40x40 resolution (64 channels; a ReLU after
  the first, BatchNormalization and ReLU after the next 15, one channel
  out) predicting the noise, subtracted from the grey input, an
  image-sized output; MSE. The autoencoder and the U-Net down- and
  upsample, ESPCN upsamples through a sub-pixel shuffle; no set keeps a
  deep stack at full resolution with a global residual.
- `nbeats`: N-BEATS (Oreshkin et al. 2020), the generic forecaster:
  two stacks of three blocks, each block four 256-wide Dense layers with
  ReLU and two linear heads, a backcast (the 384-step lookback) that is
  subtracted from the block's input and a forecast (96 steps) that is
  added to the output; MSE on the 96-step forecast. The MLPs of the
  sets are plain or residual stacks of one input; no set passes a
  doubly residual signal (subtract one head, sum the other) through
  its blocks, and no set forecasts a time series.

Variants: `base` (Adam) at two batch sizes, and at the larger one one or
two of `adamw` (AdamW, on `segformer_tiny` and `gru4rec`),
`sgd_momentum` (SGD, momentum 0.9, on `inception_mini` and `dncnn`),
`accumulation=4` (Adam, on `gru4rec`, `deepfm` and `nbeats`),
`checkpointing=auto` (Adam, on `inception_mini`, `segformer_tiny`,
`mobilevit` and `dncnn`) and `mixed_bfloat16` (Adam, on `shufflenet_v2`
and `mobilevit`). Rough arithmetic behind the batch sizes (float32):
inception_mini about 0.37M weights (6 MiB with Adam) and about 2400
channels of 32x32 maps (4 KiB per channel) and 3100 of 16x16 kept, about
12 MiB per sample; shufflenet_v2 about 1.3M weights (20 MiB with Adam),
the 64x64x24 stem (384 KiB per tensor) and small later maps, about 6
MiB per sample; segformer_tiny about 2.0M weights (31 MiB with Adam),
the first stage's 1024 tokens x 32 (128 KiB, 512 KiB in the Mix-FFN),
the decoder's four 32x32x128 maps (512 KiB each) and the 128x128x8
logits (512 KiB), about 15 MiB per sample; mobilevit about 1.3M weights
(20 MiB with Adam) and the 64x64 inverted residual blocks (512 KiB per
expanded tensor), about 11 MiB per sample; gru4rec about 1.8M weights
(28 MiB with Adam), the 64 x 4000 logits (1 MiB) and the GRU's kept
steps, about 3 MiB per sample; deepfm about 0.9M weights (15 MiB with
Adam) and about 20 KiB per sample; dncnn about 0.56M weights (9 MiB
with Adam) and 47 kept 40x40x64 maps (400 KiB each), about 18 MiB per
sample; nbeats about 2.4M weights (39 MiB with Adam) and about 70 KiB
per sample.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT8 = {
    "inception_mini": [
        ("base", 4),
        ("base", 16),
        ("checkpointing=auto", 16),
        ("sgd_momentum", 16),
    ],
    "shufflenet_v2": [
        ("base", 8),
        ("base", 32),
        ("mixed_bfloat16", 32),
    ],
    "segformer_tiny": [
        ("base", 4),
        ("base", 16),
        ("checkpointing=auto", 16),
        ("adamw", 16),
    ],
    "mobilevit": [
        ("base", 4),
        ("base", 16),
        ("checkpointing=auto", 16),
        ("mixed_bfloat16", 16),
    ],
    "gru4rec": [
        ("base", 16),
        ("base", 64),
        ("accumulation=4", 64),
        ("adamw", 64),
    ],
    "deepfm": [
        ("base", 2048),
        ("base", 8192),
        ("accumulation=4", 8192),
    ],
    "dncnn": [
        ("base", 4),
        ("base", 12),
        ("checkpointing=auto", 12),
        ("sgd_momentum", 12),
    ],
    "nbeats": [
        ("base", 512),
        ("base", 2048),
        ("accumulation=4", 2048),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data); the catalogue of gru4rec is larger.
VOCAB = 1000


def _layers():
    """The custom layers of the set: ShuffleNet's channel split and
    shuffle, DeepFM's field offsets, pairwise interactions and sum over
    the fields."""
    from keras import layers
    from keras import ops

    class ChannelSplit(layers.Layer):
        """The two halves of the channels."""

        def call(self, x):
            return ops.split(x, 2, axis=-1)

    class ChannelShuffle(layers.Layer):
        """Interleave the channels of two groups."""

        def call(self, x):
            h, w, c = x.shape[1:]
            x = ops.reshape(x, (-1, h, w, 2, c // 2))
            x = ops.transpose(x, (0, 1, 2, 4, 3))
            return ops.reshape(x, (-1, h, w, c))

    class FieldOffsets(layers.Layer):
        """Field f's ids moved to [f * size, (f + 1) * size)."""

        def __init__(self, size, **kwargs):
            super().__init__(**kwargs)
            self.size = size

        def call(self, ids):
            fields = ids.shape[-1]
            return ids + ops.arange(fields, dtype=ids.dtype) * self.size

    class FMInteraction(layers.Layer):
        """Sum over pairs of fields of <e_i, e_j>: one value per row."""

        def call(self, e):
            square_of_sum = ops.square(ops.sum(e, axis=1))
            sum_of_squares = ops.sum(ops.square(e), axis=1)
            return 0.5 * ops.sum(
                square_of_sum - sum_of_squares, axis=-1, keepdims=True
            )

    class FieldSum(layers.Layer):
        """The sum over the fields (axis 1)."""

        def call(self, x):
            return ops.sum(x, axis=1)

    return ChannelSplit, ChannelShuffle, FieldOffsets, FMInteraction, FieldSum


def _conv_bn(x, filters, size, strides=1):
    from keras import layers

    x = layers.Conv2D(
        filters, size, strides=strides, padding="same", use_bias=False
    )(x)
    x = layers.BatchNormalization()(x)
    return layers.Activation("relu")(x)


def _inception(x, b1, b3r, b3, b5r, b5, pool):
    """One Inception module: four parallel branches, concatenated."""
    from keras import layers

    one = _conv_bn(x, b1, 1)
    three = _conv_bn(_conv_bn(x, b3r, 1), b3, 3)
    five = _conv_bn(_conv_bn(x, b5r, 1), b5, 5)
    p = layers.MaxPooling2D(3, strides=1, padding="same")(x)
    return layers.Concatenate()([one, three, five, _conv_bn(p, pool, 1)])


def _shufflenet_v2():
    """(inputs, logits) of ShuffleNet v2 1.0x at 128x128."""
    import keras
    from keras import layers

    split, shuffle, *_ = _layers()

    def dw_bn(x, strides):
        x = layers.DepthwiseConv2D(
            3, strides=strides, padding="same", use_bias=False
        )(x)
        return layers.BatchNormalization()(x)

    def unit(x, out, strides):
        half = out // 2
        if strides == 1:
            left, right = split()(x)
        else:
            left = _conv_bn(dw_bn(x, strides), half, 1)
            right = x
        right = _conv_bn(right, half, 1)
        right = _conv_bn(dw_bn(right, strides), half, 1)
        return shuffle()(layers.Concatenate()([left, right]))

    inp = keras.Input((128, 128, 3))
    x = _conv_bn(inp, 24, 3, strides=2)
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    for out, repeats in ((116, 4), (232, 8), (464, 4)):
        x = unit(x, out, 2)
        for _ in range(repeats - 1):
            x = unit(x, out, 1)
    x = _conv_bn(x, 1024, 1)
    x = layers.GlobalAveragePooling2D()(x)
    return inp, layers.Dense(10)(x)


def _mobilevit():
    """(inputs, logits) of keras-io's MobileViT (XXS-like) at 128x128."""
    import keras
    from keras import layers

    swish = keras.activations.swish

    def conv_block(x, filters=16, kernel_size=3, strides=2):
        return layers.Conv2D(
            filters, kernel_size, strides=strides, activation=swish,
            padding="same",
        )(x)  # fmt: skip

    def inverted_residual(x, expanded, out, strides=1):
        m = layers.Conv2D(expanded, 1, padding="same", use_bias=False)(x)
        m = layers.Activation(swish)(layers.BatchNormalization()(m))
        m = layers.DepthwiseConv2D(
            3, strides=strides, padding="same", use_bias=False
        )(m)
        m = layers.Activation(swish)(layers.BatchNormalization()(m))
        m = layers.Conv2D(out, 1, padding="same", use_bias=False)(m)
        m = layers.BatchNormalization()(m)
        if strides == 1 and x.shape[-1] == out:
            return layers.Add()([m, x])
        return m

    def transformer(x, blocks, dim):
        for _ in range(blocks):
            h = layers.LayerNormalization(epsilon=1e-6)(x)
            h = layers.MultiHeadAttention(2, dim, dropout=0.1)(h, h)
            x = layers.Add()([h, x])
            h = layers.LayerNormalization(epsilon=1e-6)(x)
            h = layers.Dense(dim * 2, activation=swish)(h)
            h = layers.Dropout(0.1)(h)
            h = layers.Dense(dim, activation=swish)(h)
            h = layers.Dropout(0.1)(h)
            x = layers.Add()([h, x])
        return x

    def mobilevit_block(x, blocks, dim):
        local = conv_block(x, dim, strides=1)
        local = conv_block(local, dim, kernel_size=1, strides=1)
        h, w = local.shape[1:3]
        patches = layers.Reshape((4, h * w // 4, dim))(local)
        g = transformer(patches, blocks, dim)
        g = layers.Reshape((h, w, dim))(g)
        g = conv_block(g, x.shape[-1], kernel_size=1, strides=1)
        return conv_block(layers.Concatenate()([x, g]), dim, strides=1)

    e = 2  # expansion factor
    inp = keras.Input((128, 128, 3))
    x = conv_block(inp, 16)
    x = inverted_residual(x, 16 * e, 16)
    x = inverted_residual(x, 16 * e, 24, strides=2)
    x = inverted_residual(x, 24 * e, 24)
    x = inverted_residual(x, 24 * e, 24)
    x = inverted_residual(x, 24 * e, 48, strides=2)
    x = mobilevit_block(x, 2, 64)
    x = inverted_residual(x, 64 * e, 64, strides=2)
    x = mobilevit_block(x, 4, 80)
    x = inverted_residual(x, 80 * e, 80, strides=2)
    x = mobilevit_block(x, 3, 96)
    x = conv_block(x, 320, kernel_size=1, strides=1)
    x = layers.GlobalAveragePooling2D()(x)
    return inp, layers.Dense(10)(x)


def build_heldout8(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "inception_mini":
        inp = keras.Input((64, 64, 3))
        x = _conv_bn(inp, 32, 3, strides=2)
        x = _conv_bn(x, 64, 3)
        x = _inception(x, 32, 48, 64, 8, 16, 16)
        x = _inception(x, 64, 64, 96, 16, 48, 32)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        x = _inception(x, 96, 48, 104, 8, 24, 32)
        x = _inception(x, 80, 56, 112, 12, 32, 32)
        x = layers.GlobalAveragePooling2D()(x)
        x = layers.Dropout(0.4)(x)
        return inp, layers.Dense(10)(x), True
    if name == "shufflenet_v2":
        inp, logits = _shufflenet_v2()
        return inp, logits, True
    if name == "segformer_tiny":
        import keras_hub

        encoder = keras_hub.models.MiTBackbone(
            layerwise_depths=[2, 2, 2, 2],
            num_layers=4,
            layerwise_num_heads=[1, 2, 4, 5],
            layerwise_sr_ratios=[8, 4, 2, 1],
            max_drop_path_rate=0.1,
            layerwise_patch_sizes=[7, 3, 3, 3],
            layerwise_strides=[4, 2, 2, 2],
            image_shape=(128, 128, 3),
            hidden_dims=[32, 64, 128, 160],
        )
        backbone = keras_hub.models.SegFormerBackbone(
            image_encoder=encoder, projection_filters=128
        )
        inp = keras.Input((128, 128, 3))
        x = layers.Dropout(0.1)(backbone(inp))
        x = layers.Conv2D(8, 1)(x)
        x = layers.Resizing(128, 128, interpolation="bilinear")(x)
        return inp, x, True
    if name == "mobilevit":
        inp, logits = _mobilevit()
        return inp, logits, True
    if name == "gru4rec":
        inp = keras.Input((64,), dtype="int32")
        x = layers.Embedding(VOCAB * 4, 128)(inp)
        x = layers.GRU(256, return_sequences=True)(x)
        x = layers.Dropout(0.25)(x)
        return inp, layers.Dense(VOCAB * 4)(x), True
    if name == "deepfm":
        _, _, offsets, fm, fields_sum = _layers()
        ids = keras.Input((26,), dtype="int32", name="categorical")
        numeric = keras.Input((13,), name="numeric")
        shifted = offsets(VOCAB)(ids)
        weights = layers.Embedding(26 * VOCAB, 1)(shifted)  # (26, 1)
        first = layers.Add()([fields_sum()(weights), layers.Dense(1)(numeric)])
        e = layers.Embedding(26 * VOCAB, 16)(shifted)
        second = fm()(e)
        deep = layers.Concatenate()([layers.Flatten()(e), numeric])
        for _ in range(3):
            deep = layers.Dense(400, activation="relu")(deep)
            deep = layers.Dropout(0.5)(deep)
        deep = layers.Dense(1)(deep)
        return [ids, numeric], layers.Add()([first, second, deep]), False
    if name == "dncnn":
        inp = keras.Input((40, 40, 1))
        x = layers.Conv2D(64, 3, padding="same", activation="relu")(inp)
        for _ in range(15):
            x = _conv_bn(x, 64, 3)
        noise = layers.Conv2D(1, 3, padding="same")(x)
        return inp, layers.Subtract()([inp, noise]), False
    if name == "nbeats":
        lookback, horizon = 384, 96
        inp = keras.Input((lookback,))
        residual, forecasts = inp, []
        for _ in range(2 * 3):  # two stacks of three blocks
            h = residual
            for _ in range(4):
                h = layers.Dense(256, activation="relu")(h)
            backcast = layers.Dense(lookback)(h)
            forecasts.append(layers.Dense(horizon)(h))
            residual = layers.Subtract()([residual, backcast])
        return inp, layers.Add()(forecasts), False
    raise ValueError(name)
