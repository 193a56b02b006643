"""The estimator's eleventh held-out set (issue #23).

The first ten held-out sets (`_estimator_heldout.py` to
`_estimator_heldout10.py`) have each been seen, so none judges the rules
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
hierarchical attention network, DIN, a two-stack hourglass, TabNet) and
the tenth (an HRNet-like net, a capsule network, the CycleGAN / fast
style transfer ResNet generator, keras-hub's BART and RWKV-7, GAT, DLRM,
a Show-and-Tell captioner). It was fixed in this file and committed
before any case was measured; its batch sizes come from the models'
arithmetic (weights, layer outputs per sample), not from the estimate.
Its cases are measured without an estimate; the set is estimated once
(`--heldout11 --reestimate`) after the estimator's rules are final. The
families were chosen for kind and for a first step that is fast on a
CPU, not for what the estimator might get right or wrong. Why each
family is new:

- `wrn_16_4`: a pre-activation Wide ResNet 16-4 (Zagoruyko and
  Komodakis 2016) on 32x32x3: a 3x3 convolution (16), three stages of
  two blocks at 64, 128 and 256 channels (32x32, 16x16, 8x8), each
  block BatchNormalization and ReLU before each of its two 3x3
  convolutions, dropout 0.3 between them, a 1x1 projection shortcut
  from the pre-activation in each stage's first block, then
  BatchNormalization, ReLU, global average pooling and a 10-way head.
  ResNet50 and the ResNeXt-like net are post-activation bottleneck
  nets, DenseNet concatenates; no set has pre-activation residual
  blocks, widened basic blocks or dropout inside a residual block.
- `colorizer`: an image colorization net (after Zhang et al. 2016) on a
  64x64 lightness channel: pairs of 3x3 convolutions (ReLU) down to 8x8
  by strided convolutions (32, 64, 128), a trunk of four dilated 3x3
  convolutions at 8x8x256 (dilations 2, 2, 4, 4), two
  BatchNormalizations, then three nearest upsamplings with 3x3
  convolutions (128, 64, 32) back to 64x64 and a 1x1 convolution to the
  two colour channels (tanh), MSE to an image-sized target. DeepLabV3+
  has atrous branches in parallel over a pretrained-style encoder, the
  U-Net and the hourglass skip across; no set predicts colour from
  lightness or has a serial dilated trunk between a strided encoder and
  an upsampling decoder without skips.
- `llama_tiny`: keras-hub's `LlamaBackbone` from a tiny config (no
  download: 3 layers, 8 query heads sharing 2 key-value heads, 256
  wide, 704 in the SwiGLU MLP, a 4000-token vocabulary) over 128
  tokens, with logits through its untied output embedding
  (`token_embedding(h, reverse=True)`) at every position (float32).
  Gemma, Mixtral, Falcon, BLOOM and GPT-2 are other decoders; no set
  has Llama.
- `ts_transformer`: a transformer forecaster for a multivariate time
  series: 128 steps of 8 channels projected to 64, sinusoidal positions
  added, three post-LayerNorm encoder layers (4 heads of 16, 256 in the
  MLP, dropout 0.1) and a flatten head (a dense layer from the 128 x 64
  encoded steps) to 32 future steps of 8 channels, MSE to the
  sequence-sized forecast. N-BEATS forecasts with MLP blocks, the TCN
  and WaveNet convolve, the transformers of the other sets classify or
  model tokens; no set regresses a future sequence with attention.
- `rnn_lm`: an Elman RNN language model: 64 tokens embedded (256), two
  `SimpleRNN` layers of 512 (tanh) with dropout 0.2, and a 1000-way
  head at every step. The recurrent sets use LSTM, GRU, ConvLSTM and
  RWKV-7's recurrence; no set has a plain tanh RNN, nor a recurrent
  next-token model over its whole sequence.
- `autoint`: AutoInt (Song et al. 2019) on Criteo-like rows: 13
  numeric features each scaling a learned 16-wide vector, 26
  categorical fields of 1000 ids each in one table with an offset per
  field (16-wide), three interacting layers of multi-head
  self-attention over the 39 field vectors (2 heads of 32, output 64)
  with a projected residual and ReLU, and a 2-way head on the
  flattened fields. DeepFM, DCN and DLRM cross fields by products, DIN
  attends from a target item over a history; no set has self-attention
  across the fields of a row.
- `dcgan_generator`: a DCGAN generator (Radford et al. 2016) from a
  128-D code: a dense layer to 4x4x512, BatchNormalization and ReLU,
  three 4x4 transposed convolutions of stride 2 (256, 128, 64, each
  with BatchNormalization and ReLU) and one to 64x64x3 (tanh), trained
  on MSE to an image-sized target (a generator trained on a
  reconstruction loss). The ResNet generator maps an image to an image,
  the VAE's and autoencoder's decoders follow their encoders; no set
  generates an image from a flat code alone.
- `nerf_mlp`: NeRF's MLP (Mildenhall et al. 2020) on 3-D points: the
  coordinates' Fourier features (10 frequencies, sin and cos, with the
  coordinates: 63 values), eight dense layers of 256 (ReLU) with the
  encoding concatenated again into the fifth, and 4 outputs (RGB and
  density) regressed with MSE. The MLPs of the design set take dense
  features; no set has a coordinate network with positional
  encoding, at batches of many thousand rows of 3 values.

Variants: `base` (Adam) at two batch sizes, and at the larger one one or
two of `adamw` (AdamW, on `llama_tiny` and `autoint`), `sgd_momentum`
(SGD, momentum 0.9, on `wrn_16_4`), `accumulation=4` (Adam, on `rnn_lm`
and `dcgan_generator`), `checkpointing=auto` (Adam, on `wrn_16_4`,
`colorizer` and `ts_transformer`) and `mixed_bfloat16` (Adam, on
`colorizer` and `llama_tiny`); 26 cases. Rough arithmetic behind the
batch sizes (float32; weights from `count_params()`, "outputs" the sum
of the Keras layers' outputs per sample, a backbone counted as one
layer, plus a hand count of what such a layer keeps inside it; Adam
keeps 4 words per weight with the gradient): wrn_16_4 2.75M weights (44
MiB with Adam), outputs 7.6 MiB per sample (the 32x32x64 maps, 256 KiB
each); colorizer 2.89M weights (46 MiB), outputs 4.1 MiB per sample
(the 64x64x32 maps, 512 KiB each); llama_tiny 4.16M weights (67 MiB),
outputs about 18 MiB per sample by hand (per layer the 8 x 128 x 128
scores, 512 KiB, about three times with the softmax and mask, the 128 x
704 SwiGLU's three maps, 352 KiB each; the 128 x 4000 logits, 2 MiB,
and their softmax; the layer outputs count 2.0 MiB with the backbone
as one); ts_transformer 2.25M weights (36 MiB: the flatten head 2.1M),
outputs 1.4 MiB per sample, about 5 MiB by hand with the 4 x 128 x 128
scores (256 KiB, with softmax and dropout about 1 MiB per layer);
rnn_lm 1.69M weights (27 MiB), outputs 0.8 MiB per sample (the two
64 x 512 sequences, 128 KiB each, the 64 x 1000 logits, 256 KiB), about
1.5 MiB with the recurrence's per-step states; autoint 0.47M weights (8
MiB), outputs 0.13 MiB per sample (each attention's 39 x 64 maps, 10
KiB, its 2 x 39 x 39 scores, 12 KiB); dcgan_generator 3.81M weights (61
MiB: the first dense layer 1.05M, the first transposed convolution
2.10M), outputs 1.5 MiB per sample (the 32x32x64 maps, 256 KiB each,
the 64x64x3 image, 48 KiB); nerf_mlp 0.49M weights (8 MiB), outputs
about 10 KiB per sample. Weights with Adam plus outputs (by hand where
given) times the larger batch: wrn_16_4 about 530 MiB at 64, colorizer
176 at 32, llama_tiny 211 at 8, ts_transformer 196 at 32, rnn_lm 219 at
128, autoint 274 at 2048, dcgan_generator 157 at 64, nerf_mlp 168 at
16384; set 10's docstring found such a sum 1.3 to 5.3 times the
measured peak for the ninth set's models, so these peaks should fall
between about 30 and 400 MiB, and at the smaller batch lower. A
2-step smoke run at a batch of 4 (64 for autoint and nerf_mlp) of every
case, without reading memory, took 2 to 8 s per case on this CPU.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT11 = {
    "wrn_16_4": [
        ("base", 16),
        ("base", 64),
        ("checkpointing=auto", 64),
        ("sgd_momentum", 64),
    ],
    "colorizer": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
        ("mixed_bfloat16", 32),
    ],
    "llama_tiny": [
        ("base", 2),
        ("base", 8),
        ("adamw", 8),
        ("mixed_bfloat16", 8),
    ],
    "ts_transformer": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "rnn_lm": [
        ("base", 32),
        ("base", 128),
        ("accumulation=4", 128),
    ],
    "autoint": [
        ("base", 512),
        ("base", 2048),
        ("adamw", 2048),
    ],
    "dcgan_generator": [
        ("base", 16),
        ("base", 64),
        ("accumulation=4", 64),
    ],
    "nerf_mlp": [
        ("base", 4096),
        ("base", 16384),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data).
VOCAB = 1000


def _layers():
    """The custom layers of the set: a sinusoidal position encoding
    added to a sequence (the time-series transformer), field offsets
    (AutoInt) and NeRF's Fourier features of coordinates."""
    from keras import layers
    from keras import ops

    class AddPositions(layers.Layer):
        def call(self, x):
            n, d = x.shape[1], x.shape[2]
            pos = ops.arange(n, dtype="float32")[:, None]
            i = ops.arange(d // 2, dtype="float32")[None]
            angle = pos / ops.power(10000.0, 2 * i / d)
            pe = ops.concatenate([ops.sin(angle), ops.cos(angle)], axis=-1)
            return x + ops.cast(pe, x.dtype)[None]

    class FieldOffsets(layers.Layer):
        """Field i's ids + i * vocab: one table for all the fields."""

        def __init__(self, vocab, **kwargs):
            super().__init__(**kwargs)
            self.vocab = vocab

        def call(self, ids):
            fields = ops.shape(ids)[-1]
            return ids + ops.arange(fields, dtype=ids.dtype) * self.vocab

    class Fourier(layers.Layer):
        """[x, sin(2^k pi x), cos(2^k pi x)] for k < bands."""

        def __init__(self, bands, **kwargs):
            super().__init__(**kwargs)
            self.bands = bands

        def call(self, x):
            freqs = 2.0 ** ops.arange(self.bands, dtype="float32") * 3.14159
            xf = ops.reshape(
                x[..., None] * ops.cast(freqs, x.dtype), (-1, 3 * self.bands)
            )
            return ops.concatenate([x, ops.sin(xf), ops.cos(xf)], axis=-1)

    return AddPositions, FieldOffsets, Fourier


def _wrn_16_4():
    """(inputs, logits) of a pre-activation Wide ResNet 16-4 on 32x32."""
    import keras
    from keras import layers

    def bn_relu(x):
        return layers.Activation("relu")(layers.BatchNormalization()(x))

    inp = keras.Input((32, 32, 3))
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(inp)
    for stage, width in enumerate((64, 128, 256)):
        for block in range(2):
            strides = 2 if stage > 0 and block == 0 else 1
            h = bn_relu(x)
            skip = x
            if block == 0:  # the projection shortcut from the pre-activation
                skip = layers.Conv2D(width, 1, strides=strides, use_bias=False)(
                    h
                )
            h = layers.Conv2D(
                width, 3, strides=strides, padding="same", use_bias=False
            )(h)
            h = layers.Dropout(0.3)(bn_relu(h))
            h = layers.Conv2D(width, 3, padding="same", use_bias=False)(h)
            x = layers.Add()([h, skip])
    x = layers.GlobalAveragePooling2D()(bn_relu(x))
    return inp, layers.Dense(10)(x)


def _colorizer():
    """(inputs, ab channels) of a colorization net on 64x64 L."""
    import keras
    from keras import layers

    def conv(x, filters, strides=1, dilation=1):
        x = layers.Conv2D(
            filters,
            3,
            strides=strides,
            dilation_rate=dilation,
            padding="same",
            activation="relu",
        )(x)
        return x

    inp = keras.Input((64, 64, 1))
    x = conv(conv(inp, 32), 32, strides=2)  # 32x32
    x = conv(conv(x, 64), 64, strides=2)  # 16x16
    x = layers.BatchNormalization()(conv(conv(x, 128), 128, strides=2))  # 8
    for dilation in (2, 2, 4, 4):  # dilated trunk at 8x8
        x = conv(x, 256, dilation=dilation)
    x = layers.BatchNormalization()(x)
    x = conv(x, 128)
    for filters in (128, 64, 32):
        x = layers.UpSampling2D()(x)
        x = conv(x, filters)
    ab = layers.Conv2D(2, 1, activation="tanh")(x)
    return inp, layers.Activation("linear", dtype="float32")(ab)


def _ts_transformer():
    """(inputs, forecast) of a transformer forecaster: 128 steps of 8
    channels in, 32 steps of 8 channels out."""
    import keras
    from keras import layers

    add_positions, *_ = _layers()
    inp = keras.Input((128, 8))
    x = add_positions()(layers.Dense(64)(inp))
    for _ in range(3):
        h = layers.MultiHeadAttention(4, 16, dropout=0.1)(x, x)
        x = layers.LayerNormalization()(layers.Add()([x, h]))
        h = layers.Dense(256, activation="relu")(x)
        h = layers.Dense(64)(layers.Dropout(0.1)(h))
        x = layers.LayerNormalization()(layers.Add()([x, h]))
    x = layers.Flatten()(x)  # the flatten head of the forecasters
    x = layers.Dense(32 * 8)(x)
    return inp, layers.Reshape((32, 8))(x)


def _rnn_lm():
    """(inputs, next-token logits) of an Elman RNN language model."""
    import keras
    from keras import layers

    tokens = keras.Input((64,), dtype="int32")
    x = layers.Embedding(VOCAB, 256)(tokens)
    for _ in range(2):
        x = layers.SimpleRNN(512, return_sequences=True)(x)
        x = layers.Dropout(0.2)(x)
    return tokens, layers.Dense(VOCAB)(x)


def _autoint():
    """(inputs, logits) of AutoInt on 39 fields."""
    import keras
    from keras import layers

    _, field_offsets, _ = _layers()
    dense = keras.Input((13,), name="numeric")
    sparse = keras.Input((26,), dtype="int32", name="categorical")
    # each numeric feature scales its own learned vector
    numeric = layers.Reshape((13, 1))(dense)
    numeric = layers.Dense(16, use_bias=False)(numeric)  # (13, 16)
    cat = layers.Embedding(26 * VOCAB, 16)(field_offsets(VOCAB)(sparse))
    x = layers.Concatenate(axis=1)([numeric, cat])  # (39, 16)
    for _ in range(3):
        h = layers.MultiHeadAttention(2, 32, output_shape=64)(x, x)
        skip = layers.Dense(64, use_bias=False)(x)
        x = layers.Activation("relu")(layers.Add()([h, skip]))
    return [dense, sparse], layers.Dense(2)(layers.Flatten()(x))


def _dcgan_generator():
    """(inputs, image) of a DCGAN generator from a 128-D code."""
    import keras
    from keras import layers

    z = keras.Input((128,))
    x = layers.Dense(4 * 4 * 512, use_bias=False)(z)
    x = layers.Reshape((4, 4, 512))(x)
    x = layers.Activation("relu")(layers.BatchNormalization()(x))
    for filters in (256, 128, 64):
        x = layers.Conv2DTranspose(
            filters, 4, strides=2, padding="same", use_bias=False
        )(x)
        x = layers.Activation("relu")(layers.BatchNormalization()(x))
    x = layers.Conv2DTranspose(3, 4, strides=2, padding="same")(x)
    return z, layers.Activation("tanh")(x)  # 64x64x3


def _nerf_mlp():
    """(inputs, rgb + density) of NeRF's MLP on 3-D points."""
    import keras
    from keras import layers

    *_, fourier = _layers()
    xyz = keras.Input((3,))
    enc = fourier(10)(xyz)  # 63
    x = enc
    for i in range(8):
        if i == 4:  # NeRF's skip of the encoding into the fifth layer
            x = layers.Concatenate()([x, enc])
        x = layers.Dense(256, activation="relu")(x)
    return xyz, layers.Dense(4)(x)


def build_heldout11(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "wrn_16_4":
        inp, logits = _wrn_16_4()
        return inp, logits, True
    if name == "colorizer":
        inp, ab = _colorizer()
        return inp, ab, False
    if name == "llama_tiny":
        import keras_hub

        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=VOCAB * 4,
            num_layers=3,
            num_query_heads=8,
            num_key_value_heads=2,
            hidden_dim=256,
            intermediate_dim=704,
        )
        inputs = {
            kind: keras.Input((128,), dtype="int32", name=kind)
            for kind in ("token_ids", "padding_mask")
        }
        h = backbone(inputs)
        logits = backbone.token_embedding(h, reverse=True)
        logits = layers.Activation("linear", dtype="float32")(logits)
        return inputs, logits, True
    if name == "ts_transformer":
        inp, forecast = _ts_transformer()
        return inp, forecast, False
    if name == "rnn_lm":
        inp, logits = _rnn_lm()
        return inp, logits, True
    if name == "autoint":
        inputs, logits = _autoint()
        return inputs, logits, True
    if name == "dcgan_generator":
        inp, image = _dcgan_generator()
        return inp, image, False
    if name == "nerf_mlp":
        inp, out = _nerf_mlp()
        return inp, out, False
    raise ValueError(name)
