"""The estimator's twelfth held-out set (issue #23).

The first eleven held-out sets (`_estimator_heldout.py` to
`_estimator_heldout11.py`) have each been seen, so none judges the rules
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
1-D audio net, keras-hub's DistilBERT), the seventh (a ConvNeXt-like
net, keras-hub's Swin Transformer and BLOOM, a PixelCNN, gMLP, NCF, a
character-level CNN, a cross-attention encoder-decoder), the eighth (a
GoogLeNet-style Inception net, ShuffleNet v2, keras-hub's SegFormer,
keras-io's MobileViT, GRU4Rec, DeepFM, DnCNN, N-BEATS), the ninth
(SqueezeNet 1.1, DeepLabV3+, keras-hub's XLNet, keras-io's ViViT, a
hierarchical attention network, DIN, a two-stack hourglass, TabNet),
the tenth (an HRNet-like net, a capsule network, the CycleGAN / fast
style transfer ResNet generator, keras-hub's BART and RWKV-7, GAT, DLRM,
a Show-and-Tell captioner) and the eleventh (a pre-activation Wide
ResNet 16-4, a dilated colorization net, keras-hub's Llama, a
transformer time-series forecaster, an Elman RNN language model,
AutoInt, a DCGAN generator, NeRF's MLP). It was fixed in this file and
committed before any case was measured; its batch sizes come from the
models' arithmetic (weights, layer outputs per sample), not from the
estimate. Its cases are measured without an estimate; the set is
estimated once (`--heldout12 --reestimate`) after the estimator's rules
are final. The families were chosen for kind and for a first step that
is fast on a CPU, not for what the estimator might get right or wrong.
Why each family is new:

- `alexnet`: an AlexNet-style net (Krizhevsky et al. 2012) on
  128x128x3: an 11x11 convolution of stride 4 (64, ReLU) to 32x32, 3x3
  max pooling of stride 2 (no padding), a 5x5 convolution (192), pooling,
  three 3x3 convolutions (384, 256, 256), pooling to 3x3x256, then two
  dropout (0.5) + dense 1024 (ReLU) layers and a 10-way head. VGG16
  stacks 3x3 convolutions, the other classifiers are residual, dense or
  depthwise; no set has an 11x11 stride-4 stem, overlapping
  pooling and a classifier whose weights are mostly in dense layers.
- `tiny_yolo`: a Tiny-YOLO-v2-like detector (Redmon and Farhadi 2017)
  on 128x128x3: 3x3 convolutions (16, 32, 64, 128) without bias, each
  with BatchNormalization, LeakyReLU (0.1) and 2x2 max pooling, down to
  8x8, then 3x3 convolutions of 256, 512 and 512 there, and a 1x1
  convolution to 2 anchors x (4 box values, objectness, 20 classes) per
  cell, regressed with MSE to a grid-sized target (YOLO's sum-squared
  loss). The segmentation nets predict per pixel, the classifiers per
  image, the hourglass heatmaps; no set has a single-shot detector's
  grid of boxes, nor LeakyReLU.
- `electra_tiny`: keras-hub's `ElectraBackbone` from a tiny config (no
  download: 4 layers, 4 heads, 256 wide, 128-wide embeddings projected
  to 256, 1024 in the MLP, a 4000-token vocabulary) over 128 tokens
  with segment ids and a padding mask, and ELECTRA's discriminator head
  (dense 256, GELU, then 2 logits: replaced or original) at every token
  (float32). DistilBERT, ALBERT, DeBERTa-v3 and the relative-position
  encoder are other encoders and classify a sequence or model tokens;
  no set has ELECTRA, nor a per-token binary replaced-token head.
- `cct`: keras-io's Compact Convolutional Transformer on 32x32x3: a
  convolutional tokenizer (3x3 convolutions of 64 and 128, ReLU, each
  followed by 3x3 max pooling of stride 2) to 64 tokens of 128, a
  learned position embedding, two pre-LayerNorm encoder layers (2 heads
  of 64, dropout 0.1, an MLP of two dense 128 GELU layers) whose
  residual branches pass stochastic depth (rates 0 and 0.1), a final
  LayerNormalization and sequence pooling (a softmax over the tokens
  weights their sum) into a 10-way head. ViT, the patch transformer,
  Swin and MobileViT cut patches; no set tokenizes with a convolution
  stack, drops residual branches per sample or pools by learned token
  weights.
- `lstm_autoencoder`: an LSTM autoencoder (as for anomaly detection on
  time series): 100 steps of 16 channels into an LSTM of 256 (its last
  state the code), `RepeatVector` of the code to 100 steps, an LSTM of
  256 over them returning every step and a time-distributed dense layer
  back to 16 channels, MSE to the sequence-sized input. The LSTM
  encoder-decoder and the GRU encoder-decoder decode with teacher
  forcing into tokens, the stacked LSTMs classify; no set reconstructs a
  whole sequence from one repeated code.
- `xdeepfm`: xDeepFM (Lian et al. 2018) on Criteo-like rows: 13 numeric
  features each scaling a learned 16-wide vector, 26 categorical fields
  of 1000 ids each in one table with an offset per field (16-wide), a
  compressed interaction network of two layers of 64 feature maps (each
  the outer products of the previous maps and the 39 fields along the
  embedding, compressed by learned weightings, ReLU, averaged over the
  embedding), a deep part (two dense 256 ReLU layers on the flattened
  fields) and a linear part, summed into 2 logits. DeepFM and DLRM
  cross fields by pairwise dot products, DCN by its cross layers,
  AutoInt by attention; no set has vector-wise outer-product
  interactions compressed across fields.
- `edsr`: an EDSR-baseline-like super-resolution net (Lim et al. 2017)
  from 32x32x3 to 64x64x3: a 3x3 convolution (64), eight residual blocks
  of two 3x3 convolutions (64, ReLU between) without BatchNormalization
  whose output is scaled by 0.1 before the add, a 3x3 convolution, a
  global skip from the first, a 3x3 convolution to 256 and a sub-pixel
  shuffle (x2), and a 3x3 convolution to the image, MSE to an
  image-sized target. ESPCN upsamples from a shallow net without
  residuals, DnCNN denoises at one resolution with BatchNormalization;
  no set has residual-scaled blocks without normalization before an
  upsampling.
- `convmixer`: keras-io's ConvMixer-256/8 (Trockman and Kolter 2022) on
  32x32x3: a 2x2 patch convolution of stride 2 to 16x16x256 (GELU,
  BatchNormalization), then eight blocks of a 5x5 depthwise convolution
  (GELU, BatchNormalization) with a residual add and a 1x1 convolution
  (GELU, BatchNormalization), global average pooling and a 10-way head.
  The MLP-Mixer mixes with dense layers, ConvNeXt and MobileNets
  downsample in stages; no set keeps one resolution and width through
  alternating depthwise and pointwise mixing after a patch stem.

Variants: `base` (Adam) at two batch sizes, and at the larger one one or
two of `adamw` (AdamW, on `electra_tiny` and `xdeepfm`), `sgd_momentum`
(SGD, momentum 0.9, on `alexnet`), `accumulation=4` (Adam, on
`lstm_autoencoder` and `convmixer`), `checkpointing=auto` (Adam, on
`tiny_yolo`, `cct` and `edsr`) and `mixed_bfloat16` (Adam, on
`tiny_yolo` and `electra_tiny`); 26 cases. Rough arithmetic behind the
batch sizes (float32; weights from `count_params()`, "outputs" the sum
of the Keras layers' outputs per sample, a backbone counted as one
layer, plus a hand count of what such a layer keeps inside it; Adam
keeps 4 words per weight with the gradient): alexnet 5.89M weights (90
MiB with Adam: the first dense layer 2.36M), outputs 0.90 MiB per
sample (the 32x32x64 map, 256 KiB); tiny_yolo 3.96M weights (60 MiB:
the two 3x3 convolutions at 512 3.5M), outputs 7.2 MiB per sample (the
128x128x16 maps, 1 MiB each, three times with BatchNormalization and
LeakyReLU); electra_tiny 3.85M weights (59 MiB), layer outputs 0.25 MiB
per sample with the backbone as one, about 10 MiB by hand (per layer
the 4 x 128 x 128 scores, 256 KiB, about three times with the softmax
and dropout, the 128 x 1024 MLP maps, 512 KiB, twice with GELU, and
about six 128 x 256 maps of 128 KiB); cct 0.28M weights (4 MiB),
outputs 1.3 MiB per sample (the 32x32x64 maps, 256 KiB each), about 1.5
MiB with the 2 x 64 x 64 scores; lstm_autoencoder 0.81M weights (12
MiB), outputs 0.21 MiB per sample (the repeated code and the decoded
sequence, 100 KiB each), about 1.4 MiB by hand with the two
recurrences' per-step gates and states (100 steps x 6 x 256 words,
600 KiB each); xdeepfm 0.90M weights (14 MiB: the table 0.42M), outputs
0.03 MiB per sample, about 0.3 MiB by hand with the CIN's outer
products (39 x 39 x 16 and 64 x 39 x 16 words, 95 and 156 KiB); edsr
0.78M weights (12 MiB), outputs 10.8 MiB per sample (the 32x32x64 maps,
256 KiB each, four per block); convmixer 0.60M weights (9 MiB), outputs
14.8 MiB per sample (the 16x16x256 maps, 256 KiB each, seven per block).
Weights with Adam plus outputs (by hand where given) times the larger
batch: alexnet about 205 MiB at 128, tiny_yolo 292 at 32, electra_tiny
219 at 16, cct 196 at 128, lstm_autoencoder 191 at 128, xdeepfm 321 at
1024, edsr 185 at 16, convmixer 245 at 16; set 10's docstring found
such a sum 1.3 to 5.3 times the measured peak for the ninth set's
models, so these peaks should fall between about 30 and 400 MiB, and at
the smaller batch lower. A 2-step smoke run at a batch of 4 (64 for
xdeepfm) of every case, without reading memory, took 1.4 to 13 s per
case on this CPU.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT12 = {
    "alexnet": [
        ("base", 32),
        ("base", 128),
        ("sgd_momentum", 128),
    ],
    "tiny_yolo": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
        ("mixed_bfloat16", 32),
    ],
    "electra_tiny": [
        ("base", 4),
        ("base", 16),
        ("adamw", 16),
        ("mixed_bfloat16", 16),
    ],
    "cct": [
        ("base", 32),
        ("base", 128),
        ("checkpointing=auto", 128),
    ],
    "lstm_autoencoder": [
        ("base", 32),
        ("base", 128),
        ("accumulation=4", 128),
    ],
    "xdeepfm": [
        ("base", 256),
        ("base", 1024),
        ("adamw", 1024),
    ],
    "edsr": [
        ("base", 4),
        ("base", 16),
        ("checkpointing=auto", 16),
    ],
    "convmixer": [
        ("base", 4),
        ("base", 16),
        ("accumulation=4", 16),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data).
VOCAB = 1000


def _layers():
    """The custom layers of the set: stochastic depth and the learned
    positions of the CCT, field offsets and the compressed interaction
    of xDeepFM's CIN, EDSR's sub-pixel shuffle and the CCT's
    sequence pooling."""
    import keras
    import tensorflow as tf
    from keras import layers
    from keras import ops

    class StochasticDepth(layers.Layer):
        """Drops a residual branch per sample with probability `rate`
        in training (the CCT's stochastic depth)."""

        def __init__(self, rate, **kwargs):
            super().__init__(**kwargs)
            self.rate = rate
            self.seed = keras.random.SeedGenerator(1)

        def call(self, x, training=None):
            if not training:
                return x
            keep = 1.0 - self.rate
            shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
            mask = ops.floor(
                keep
                + keras.random.uniform(shape, seed=self.seed, dtype=x.dtype)
            )
            return x / keep * mask

    class AddPositions(layers.Layer):
        """A learned position embedding added to a sequence."""

        def build(self, shape):
            self.positions = self.add_weight(
                shape=(1, shape[1], shape[2]), initializer="random_normal"
            )

        def call(self, x):
            return x + ops.cast(self.positions, x.dtype)

    class FieldOffsets(layers.Layer):
        """Field i's ids + i * vocab: one table for all the fields."""

        def __init__(self, vocab, **kwargs):
            super().__init__(**kwargs)
            self.vocab = vocab

        def call(self, ids):
            fields = ops.shape(ids)[-1]
            return ids + ops.arange(fields, dtype=ids.dtype) * self.vocab

    class Interaction(layers.Layer):
        """One CIN layer: the outer products of the previous layer's
        feature maps (h of them) and the fields (m), each of D values,
        compressed by `maps` learned (h * m)-weightings: (b, maps, D)."""

        def __init__(self, maps, **kwargs):
            super().__init__(**kwargs)
            self.maps = maps

        def build(self, shapes):
            h, m = shapes[0][1], shapes[1][1]
            self.kernel = self.add_weight(
                shape=(h * m, self.maps), initializer="glorot_uniform"
            )

        def call(self, inputs):
            xk, x0 = inputs
            z = ops.einsum("bhd,bmd->bhmd", xk, x0)
            z = ops.reshape(z, (-1, xk.shape[1] * x0.shape[1], x0.shape[2]))
            return ops.einsum("bjd,jk->bkd", z, ops.cast(self.kernel, z.dtype))

    class DepthToSpace(layers.Layer):
        def __init__(self, block, **kwargs):
            super().__init__(**kwargs)
            self.block = block

        def call(self, x):
            return tf.nn.depth_to_space(x, self.block)

    class SequencePool(layers.Layer):
        """The tokens' sum weighted by (b, n, 1) softmax weights."""

        def call(self, inputs):
            weights, x = inputs
            return ops.sum(weights * x, axis=1)

    return (
        StochasticDepth,
        AddPositions,
        FieldOffsets,
        Interaction,
        DepthToSpace,
        SequencePool,
    )


def _alexnet():
    """(inputs, logits) of an AlexNet-style net on 128x128."""
    import keras
    from keras import layers

    inp = keras.Input((128, 128, 3))
    x = layers.Conv2D(64, 11, strides=4, padding="same", activation="relu")(
        inp
    )  # 32x32
    x = layers.MaxPooling2D(3, strides=2)(x)  # 15x15
    x = layers.Conv2D(192, 5, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D(3, strides=2)(x)  # 7x7
    for filters in (384, 256, 256):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    x = layers.Flatten()(layers.MaxPooling2D(3, strides=2)(x))  # 3x3x256
    for _ in range(2):
        x = layers.Dense(1024, activation="relu")(layers.Dropout(0.5)(x))
    return inp, layers.Dense(10)(x)


def _tiny_yolo():
    """(inputs, grid) of a Tiny-YOLO-v2-like detector on 128x128."""
    import keras
    from keras import layers

    def conv(x, filters, size=3):
        x = layers.Conv2D(filters, size, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        return layers.LeakyReLU(negative_slope=0.1)(x)

    inp = keras.Input((128, 128, 3))
    x = inp
    for filters in (16, 32, 64, 128):
        x = layers.MaxPooling2D()(conv(x, filters))  # down to 8x8
    x = conv(conv(conv(x, 256), 512), 512)
    # 2 anchors x (4 box values, objectness, 20 classes) per cell
    grid = layers.Conv2D(2 * 25, 1)(x)
    return inp, layers.Activation("linear", dtype="float32")(grid)


def _cct():
    """(inputs, logits) of keras-io's Compact Convolutional Transformer
    on 32x32."""
    import keras
    from keras import layers

    stochastic_depth, add_positions, *_, sequence_pool = _layers()
    inp = keras.Input((32, 32, 3))
    x = inp
    for filters in (64, 128):  # the convolutional tokenizer
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    x = layers.Reshape((64, 128))(x)  # 8x8 tokens
    x = add_positions()(x)
    rates = (0.0, 0.1)
    for rate in rates:
        h = layers.LayerNormalization(epsilon=1e-5)(x)
        h = layers.MultiHeadAttention(2, 64, dropout=0.1)(h, h)
        x = layers.Add()([stochastic_depth(rate)(h), x])
        h = layers.LayerNormalization(epsilon=1e-5)(x)
        h = layers.Dense(128, activation="gelu")(h)
        h = layers.Dropout(0.1)(h)
        h = layers.Dense(128, activation="gelu")(h)
        h = layers.Dropout(0.1)(h)
        x = layers.Add()([stochastic_depth(rate)(h), x])
    x = layers.LayerNormalization(epsilon=1e-5)(x)
    # sequence pooling: a softmax over the tokens weights their sum
    weights = layers.Softmax(axis=1)(layers.Dense(1)(x))  # (64, 1)
    pooled = sequence_pool()([weights, x])
    return inp, layers.Dense(10)(pooled)


def _lstm_autoencoder():
    """(inputs, reconstruction) of an LSTM autoencoder on 100 steps of
    16 channels."""
    import keras
    from keras import layers

    inp = keras.Input((100, 16))
    code = layers.LSTM(256)(inp)
    x = layers.RepeatVector(100)(code)
    x = layers.LSTM(256, return_sequences=True)(x)
    return inp, layers.TimeDistributed(layers.Dense(16))(x)


def _xdeepfm():
    """(inputs, logits) of xDeepFM on 39 fields."""
    import keras
    from keras import layers

    _, _, field_offsets, interaction, *_ = _layers()
    dense = keras.Input((13,), name="numeric")
    sparse = keras.Input((26,), dtype="int32", name="categorical")
    numeric = layers.Reshape((13, 1))(dense)
    numeric = layers.Dense(16, use_bias=False)(numeric)  # (13, 16)
    cat = layers.Embedding(26 * VOCAB, 16)(field_offsets(VOCAB)(sparse))
    x0 = layers.Concatenate(axis=1)([numeric, cat])  # (39, 16)
    xk, pooled = x0, []
    for maps in (64, 64):  # the compressed interaction network
        xk = layers.Activation("relu")(interaction(maps)([xk, x0]))
        pooled.append(
            layers.GlobalAveragePooling1D(data_format="channels_first")(xk)
        )
    deep = layers.Flatten()(x0)
    for _ in range(2):
        deep = layers.Dense(256, activation="relu")(deep)
    linear = layers.Dense(2)(layers.Flatten()(x0))
    head = layers.Dense(2)(layers.Concatenate()([*pooled, deep]))
    return [dense, sparse], layers.Add()([linear, head])


def _edsr():
    """(inputs, x2 image) of an EDSR-baseline-like super-resolution net
    from 32x32 to 64x64."""
    import keras
    from keras import layers

    *_, depth_to_space, _ = _layers()
    inp = keras.Input((32, 32, 3))
    x = head = layers.Conv2D(64, 3, padding="same")(inp)
    for _ in range(8):  # residual blocks without BatchNormalization
        h = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
        h = layers.Conv2D(64, 3, padding="same")(h)
        h = layers.Rescaling(0.1)(h)  # residual scaling
        x = layers.Add()([x, h])
    x = layers.Conv2D(64, 3, padding="same")(x)
    x = layers.Add()([x, head])  # the global skip
    x = depth_to_space(2)(layers.Conv2D(64 * 4, 3, padding="same")(x))
    return inp, layers.Conv2D(3, 3, padding="same")(x)


def _convmixer():
    """(inputs, logits) of keras-io's ConvMixer-256/8 on 32x32."""
    import keras
    from keras import layers

    def act_bn(x):
        return layers.BatchNormalization()(layers.Activation("gelu")(x))

    inp = keras.Input((32, 32, 3))
    x = act_bn(layers.Conv2D(256, 2, strides=2)(inp))  # 16x16 patches
    for _ in range(8):
        h = act_bn(layers.DepthwiseConv2D(5, padding="same")(x))
        x = layers.Add()([h, x])  # the spatial mixing's residual
        x = act_bn(layers.Conv2D(256, 1)(x))  # channel mixing
    x = layers.GlobalAveragePooling2D()(x)
    return inp, layers.Dense(10)(x)


def build_heldout12(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "alexnet":
        inp, logits = _alexnet()
        return inp, logits, True
    if name == "tiny_yolo":
        inp, grid = _tiny_yolo()
        return inp, grid, False
    if name == "electra_tiny":
        import keras_hub

        backbone = keras_hub.models.ElectraBackbone(
            vocab_size=VOCAB * 4,
            num_layers=4,
            num_heads=4,
            hidden_dim=256,
            embedding_dim=128,
            intermediate_dim=1024,
            max_sequence_length=128,
        )
        inputs = {
            kind: keras.Input((128,), dtype="int32", name=kind)
            for kind in ("token_ids", "segment_ids", "padding_mask")
        }
        h = backbone(inputs)["sequence_output"]
        # the discriminator: replaced or original, at every token
        h = layers.Dense(256, activation="gelu")(h)
        logits = layers.Dense(2)(h)
        logits = layers.Activation("linear", dtype="float32")(logits)
        return inputs, logits, True
    if name == "cct":
        inp, logits = _cct()
        return inp, logits, True
    if name == "lstm_autoencoder":
        inp, out = _lstm_autoencoder()
        return inp, out, False
    if name == "xdeepfm":
        inputs, logits = _xdeepfm()
        return inputs, logits, True
    if name == "edsr":
        inp, image = _edsr()
        return inp, image, False
    if name == "convmixer":
        inp, logits = _convmixer()
        return inp, logits, True
    raise ValueError(name)
