"""The estimator's ninth held-out set (issue #23).

The first eight held-out sets (`_estimator_heldout.py` to
`_estimator_heldout8.py`) have each been seen, so none judges the rules
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
character-level CNN, a cross-attention encoder-decoder) and the eighth
(a GoogLeNet-style Inception net, ShuffleNet v2, keras-hub's SegFormer,
keras-io's MobileViT, GRU4Rec, DeepFM, DnCNN, N-BEATS). It was fixed in
this file and committed before any case was measured; its batch sizes
come from the models' arithmetic (weights, kept activations), not from
the estimate. Its cases are measured without an estimate; the set is
estimated once (`--heldout9 --reestimate`) after the estimator's rules
are final. Why each family is new:

- `squeezenet`: SqueezeNet 1.1 (Iandola et al. 2016) built from layers
  at 128x128: a strided 3x3 convolution (64) and 3x3 max-poolings
  between eight fire modules (a 1x1 squeeze convolution to 16, 32, 48 or
  64 channels, then 1x1 and 3x3 expand convolutions of four times that,
  ReLU, concatenated), dropout 0.5, a 1x1 convolution to the 10 classes
  with ReLU and global average pooling, no Dense layer and no
  BatchNormalization. The Inception net concatenates four branches of
  one module's input, MobileNets and ShuffleNet use depthwise
  convolutions; no set squeezes the channels through a 1x1 bottleneck
  before every concatenation of two expansions.
- `deeplabv3plus`: DeepLabV3+ (Chen et al. 2018) built from layers at
  128x128: a small strided encoder (BatchNormalization, ReLU) to 16x16
  (output stride 8) with two atrous 3x3 convolutions (dilation 2),
  atrous spatial pyramid pooling (a 1x1 convolution, 3x3 convolutions
  at dilation 6, 12 and 18 and an image-level pooling branch upsampled
  back, concatenated and fused), a decoder that upsamples it 2x and
  concatenates it with the stride-4 features (48 channels), two 3x3
  convolutions, an 8-way 1x1 head and a 4x bilinear upsampling to
  128x128 per-pixel logits. WaveNet and the TCN dilate 1-D
  convolutions; no set has 2-D atrous convolutions or a pyramid of
  dilation rates.
- `xlnet_tiny`: keras-hub's `XLNetBackbone` from a tiny config (no
  download: 4 layers, 4 heads, 256 wide, 1024 in the MLP, a 4000-token
  vocabulary) over 128 tokens, with a 4000-way Dense head at every
  position (float32 logits). XLNet's attention adds a relative
  position term from sinusoidal relative encodings (with its own
  biases) and a segment term to the content term; the relative-position
  encoder of the sixth set adds a learned bias per head and offset,
  DeBERTa disentangles content and relative position, T5 buckets a
  bias; no set has XLNet's Transformer-XL style relative attention.
- `vivit`: keras-io's Video Vision Transformer (ViViT) on 16 frames of
  64x64x3: a tubelet embedding (a Conv3D with a 4x8x8 kernel and
  stride, 128 filters, into 4 x 8 x 8 = 256 tokens), a learned position
  embedding, four Transformer layers (LayerNorm, four-head attention,
  an MLP of 512 with GELU), a LayerNorm, global average pooling and a
  10-way head. The 3-D conv net and ConvLSTM convolve over a clip, the
  ViT and the patch transformer attend over one image's patches; no set
  attends over spatio-temporal tubelets of a video.
- `han`: a hierarchical attention network (Yang et al. 2016) over
  documents of 16 sentences x 32 words: a word encoder (an embedding of
  100, a bidirectional GRU of 64 returning every step and additive
  attention pooling: a tanh Dense of 100, a score, a softmax over the
  words, the weighted sum) applied to every sentence through
  `TimeDistributed`, then a sentence-level bidirectional GRU with the
  same attention pooling and a 5-way head. The recurrent sets run one
  recurrent net over one sequence (the encoder-decoders two); no set
  runs a recurrent net inside `TimeDistributed` over a batch of
  sentences and another over their encodings.
- `din`: Deep Interest Network (Zhou et al. 2018): a user's 50 clicked
  item ids, a candidate item id and 4 profile ids; a 64-wide item
  embedding shared by history and candidate, a local activation unit
  per clicked item (the concatenation of the item, the candidate, their
  difference and their product through Dense 80 and 40 with PReLU and a
  1-wide Dense) whose weights pool the history without a softmax; the
  pooled history, the candidate and the profile embeddings through
  Dense 200 and 80 with PReLU and a 2-way click head. GRU4Rec and NCF
  embed a sequence or a pair, the two-tower model compares towers; no
  set weights a user's history by its relevance to a candidate.
- `hourglass`: a stacked hourglass network (Newell et al. 2016) for
  keypoint heatmaps at 128x128: a strided 7x7 stem, bottleneck residual
  modules (BatchNormalization, ReLU before each of a 1x1, 3x3 and 1x1
  convolution, 128 channels) to 32x32, then two hourglasses of depth 3
  (a residual branch at each scale, max-pooling down to 4x4, nearest
  upsampling and an add back up), each followed by a residual module, a
  1x1 convolution and a 16-map heatmap, which with the features is
  remapped (1x1 convolutions) and added into the next stack's input;
  MSE on the second stack's 32x32x16 heatmaps (no intermediate loss).
  The U-Net concatenates skips once, the FPN sums one top-down pathway;
  no set stacks encoder-decoders that feed their predictions back, and
  no set regresses keypoint heatmaps.
- `tabnet`: TabNet (Arik and Pfister 2019) on 54 numeric features: a
  BatchNormalization of the input, then 5 decision steps, each an
  attentive transformer (Dense, BatchNormalization, times the prior
  scales, sparsemax (the sort-based projection onto the simplex) into a
  feature mask; prior times 1.3 minus the mask) and a feature
  transformer of the masked features (two GLU blocks whose Dense
  layers are shared by the steps, two of the step's own; each Dense,
  BatchNormalization, GLU, residual scaled by sqrt(0.5); n_d = n_a =
  64), the ReLU of the decision half summed over the steps, a 7-way
  head. The tabular sets embed categorical fields or run MLPs over all
  features; no set selects features with a learned sparse mask per step
  (the sparsity regulariser of the paper is left out).

Variants: `base` (Adam) at two batch sizes, and at the larger one one or
two of `adamw` (AdamW, on `xlnet_tiny` and `vivit`), `sgd_momentum`
(SGD, momentum 0.9, on `squeezenet` and `hourglass`), `accumulation=4`
(Adam, on `han`, `din` and `tabnet`), `checkpointing=auto` (Adam, on
`squeezenet`, `deeplabv3plus`, `vivit` and `hourglass`) and
`mixed_bfloat16` (Adam, on `deeplabv3plus` and `xlnet_tiny`). Rough
arithmetic behind the batch sizes (float32): squeezenet about 0.73M
weights (11 MiB with Adam), the 63x63x64 stem (1 MiB) and per fire
module the squeeze and the two expansions with the concatenation
(about 1.2 MiB at 31x31, 0.3 at 15x15 and 0.1 at 7x7), about 6 MiB per
sample; deeplabv3plus about 2.6M weights (39 MiB with Adam), the
64x64x32 and 32x32x64 encoder maps (512 and 256 KiB), the pyramid's
five 16x16x128 branches (128 KiB each), the decoder's 32x32x128 maps
(512 KiB) and the 128x128x8 logits (512 KiB), about 15 MiB per sample;
xlnet_tiny about 5.5M weights (84 MiB with Adam), per layer the 4 x 128
x 128 attention scores of the content and position terms (256 KiB
each) and the 128 x 1024 MLP (512 KiB), the 128 x 4000 logits (2 MiB),
about 22 MiB per sample; vivit about 0.9M weights (14 MiB with Adam),
the 768 KiB clip, per layer the 4 x 256 x 256 scores (1 MiB, with the
softmax and dropout 3 MiB) and the 256 x 512 MLP (512 KiB), about 22
MiB per sample; han about 0.26M weights and per document 16 sentences
of 32 words x (100 embedded, 128 encoded, the GRUs' kept gates and the
attention's 100), about 2.5 MiB per document; din about 0.16M weights
(the 1000 x 64 item table) and per sample the 50 x 256 activation-unit
input (50 KiB) and its 80- and 40-wide layers, about 150 KiB per
sample; hourglass about 1.4M weights (22 MiB with Adam) and per sample
the 64x64x64 stem maps (1 MiB each), about ten residual modules' maps
at 32x32 (3.5 MiB each) and more at 16x16 to 4x4, about 35 MiB kept of
its layers' 53 MiB of outputs per sample; tabnet about 0.48M weights (7
MiB with Adam) and in each of its six feature transformers four GLU
blocks (the Dense and BatchNormalization outputs 256 wide, the GLU and
the scaled residual 128), plus the 54-wide masks, about 100 KiB per
sample.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT9 = {
    "squeezenet": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
        ("sgd_momentum", 32),
    ],
    "deeplabv3plus": [
        ("base", 4),
        ("base", 16),
        ("checkpointing=auto", 16),
        ("mixed_bfloat16", 16),
    ],
    "xlnet_tiny": [
        ("base", 4),
        ("base", 12),
        ("adamw", 12),
        ("mixed_bfloat16", 12),
    ],
    "vivit": [
        ("base", 2),
        ("base", 8),
        ("checkpointing=auto", 8),
        ("adamw", 8),
    ],
    "han": [
        ("base", 32),
        ("base", 128),
        ("accumulation=4", 128),
    ],
    "din": [
        ("base", 512),
        ("base", 2048),
        ("accumulation=4", 2048),
    ],
    "hourglass": [
        ("base", 2),
        ("base", 6),
        ("checkpointing=auto", 6),
        ("sgd_momentum", 6),
    ],
    "tabnet": [
        ("base", 512),
        ("base", 2048),
        ("accumulation=4", 2048),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data); XLNet's vocabulary is larger.
VOCAB = 1000


def _layers():
    """The custom layers of the set: attention pooling (HAN), DIN's
    activation-unit input and weighted sum, TabNet's GLU, sparsemax,
    prior update and halves."""
    from keras import layers
    from keras import ops

    class AttentionPool(layers.Layer):
        """Additive attention over axis 1: softmax(w . tanh(W h)) h."""

        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.proj = layers.Dense(units, activation="tanh")
            self.score = layers.Dense(1, use_bias=False)

        def call(self, h):
            alpha = ops.softmax(self.score(self.proj(h)), axis=1)
            return ops.sum(alpha * h, axis=1)

    class ActivationUnitInput(layers.Layer):
        """[h, c, h - c, h * c] for each history item h, candidate c."""

        def call(self, history, candidate):
            c = ops.broadcast_to(candidate, ops.shape(history))
            return ops.concatenate(
                [history, c, history - c, history * c], axis=-1
            )

    class WeightedSum(layers.Layer):
        """sum_t w_t h_t over axis 1 (no softmax)."""

        def call(self, weights, history):
            return ops.sum(weights * history, axis=1)

    class GLU(layers.Layer):
        """The first half times the sigmoid of the second."""

        def call(self, x):
            a, b = ops.split(x, 2, axis=-1)
            return a * ops.sigmoid(b)

    class Sparsemax(layers.Layer):
        """Sparsemax over the last axis (Martins and Astudillo 2016)."""

        def call(self, z):
            d = z.shape[-1]
            zs = ops.flip(ops.sort(z, axis=-1), axis=-1)
            k = ops.arange(1, d + 1, dtype=z.dtype)
            support = ops.cast(1 + k * zs > ops.cumsum(zs, axis=-1), z.dtype)
            kz = ops.sum(support, axis=-1, keepdims=True)
            tau = (ops.sum(support * zs, axis=-1, keepdims=True) - 1) / kz
            return ops.maximum(z - tau, 0)

    class PriorUpdate(layers.Layer):
        """prior * (gamma - mask)."""

        def __init__(self, gamma, **kwargs):
            super().__init__(**kwargs)
            self.gamma = gamma

        def call(self, prior, mask):
            return prior * (self.gamma - mask)

    class Halves(layers.Layer):
        """The first `n` features and the rest."""

        def __init__(self, n, **kwargs):
            super().__init__(**kwargs)
            self.n = n

        def call(self, x):
            return x[:, : self.n], x[:, self.n :]

    return (
        AttentionPool,
        ActivationUnitInput,
        WeightedSum,
        GLU,
        Sparsemax,
        PriorUpdate,
        Halves,
    )


def _conv_bn(x, filters, size, strides=1, dilation=1):
    from keras import layers

    x = layers.Conv2D(
        filters,
        size,
        strides=strides,
        dilation_rate=dilation,
        padding="same",
        use_bias=False,
    )(x)
    x = layers.BatchNormalization()(x)
    return layers.Activation("relu")(x)


def _squeezenet():
    """(inputs, logits) of SqueezeNet 1.1 at 128x128."""
    import keras
    from keras import layers

    def fire(x, squeeze):
        s = layers.Conv2D(squeeze, 1, activation="relu")(x)
        one = layers.Conv2D(4 * squeeze, 1, activation="relu")(s)
        three = layers.Conv2D(
            4 * squeeze, 3, padding="same", activation="relu"
        )(s)
        return layers.Concatenate()([one, three])

    inp = keras.Input((128, 128, 3))
    x = layers.Conv2D(64, 3, strides=2, activation="relu")(inp)  # 63x63
    x = layers.MaxPooling2D(3, strides=2)(x)  # 31x31
    x = fire(fire(x, 16), 16)
    x = layers.MaxPooling2D(3, strides=2)(x)  # 15x15
    x = fire(fire(x, 32), 32)
    x = layers.MaxPooling2D(3, strides=2)(x)  # 7x7
    for squeeze in (48, 48, 64, 64):
        x = fire(x, squeeze)
    x = layers.Dropout(0.5)(x)
    x = layers.Conv2D(10, 1, activation="relu")(x)
    return inp, layers.GlobalAveragePooling2D()(x)


def _deeplabv3plus():
    """(inputs, per-pixel logits) of a DeepLabV3+ at 128x128."""
    import keras
    from keras import layers

    inp = keras.Input((128, 128, 3))
    x = _conv_bn(inp, 32, 3, strides=2)  # 64x64
    x = _conv_bn(x, 32, 3)
    x = _conv_bn(x, 64, 3, strides=2)  # 32x32
    low = _conv_bn(x, 64, 3)
    x = _conv_bn(low, 128, 3, strides=2)  # 16x16: output stride 8
    x = _conv_bn(x, 128, 3)
    x = _conv_bn(x, 256, 3, dilation=2)
    x = _conv_bn(x, 256, 3, dilation=2)
    # Atrous spatial pyramid pooling.
    pool = layers.GlobalAveragePooling2D(keepdims=True)(x)
    pool = _conv_bn(pool, 128, 1)
    pool = layers.UpSampling2D(16, interpolation="bilinear")(pool)
    branches = [_conv_bn(x, 128, 1)] + [
        _conv_bn(x, 128, 3, dilation=rate) for rate in (6, 12, 18)
    ]
    x = layers.Concatenate()(branches + [pool])
    x = _conv_bn(x, 128, 1)
    x = layers.Dropout(0.1)(x)
    # Decoder.
    x = layers.UpSampling2D(2, interpolation="bilinear")(x)  # 32x32
    x = layers.Concatenate()([x, _conv_bn(low, 48, 1)])
    x = _conv_bn(x, 128, 3)
    x = _conv_bn(x, 128, 3)
    x = layers.Conv2D(8, 1)(x)
    x = layers.UpSampling2D(4, interpolation="bilinear")(x)
    return inp, layers.Activation("linear", dtype="float32")(x)


def _vivit():
    """(inputs, logits) of keras-io's ViViT on 16 frames of 64x64x3."""
    import keras
    from keras import layers
    from keras import ops

    class PositionalEncoder(layers.Layer):
        def __init__(self, embed_dim, **kwargs):
            super().__init__(**kwargs)
            self.embed_dim = embed_dim

        def build(self, input_shape):
            _, num_tokens, _ = input_shape
            self.position_embedding = layers.Embedding(
                input_dim=num_tokens, output_dim=self.embed_dim
            )
            self.positions = ops.arange(0, num_tokens, 1)

        def call(self, encoded_tokens):
            return encoded_tokens + self.position_embedding(self.positions)

    dim = 128
    inp = keras.Input((16, 64, 64, 3))
    x = layers.Conv3D(dim, (4, 8, 8), strides=(4, 8, 8), padding="valid")(inp)
    x = layers.Reshape((-1, dim))(x)
    x = PositionalEncoder(dim)(x)
    for _ in range(4):
        h = layers.LayerNormalization(epsilon=1e-6)(x)
        h = layers.MultiHeadAttention(4, dim // 4, dropout=0.1)(h, h)
        x = layers.Add()([h, x])
        h = layers.LayerNormalization(epsilon=1e-6)(x)
        h = layers.Dense(dim * 4, activation=keras.activations.gelu)(h)
        h = layers.Dense(dim, activation=keras.activations.gelu)(h)
        x = layers.Add()([h, x])
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    x = layers.GlobalAveragePooling1D()(x)
    return inp, layers.Dense(10)(x)


def _han():
    """(inputs, logits) of a hierarchical attention network."""
    import keras
    from keras import layers

    pool, *_ = _layers()
    words = keras.Input((32,), dtype="int32")
    h = layers.Embedding(VOCAB, 100)(words)
    h = layers.Bidirectional(layers.GRU(64, return_sequences=True))(h)
    word_encoder = keras.Model(words, pool(100)(h))
    inp = keras.Input((16, 32), dtype="int32")
    s = layers.TimeDistributed(word_encoder)(inp)
    s = layers.Bidirectional(layers.GRU(64, return_sequences=True))(s)
    return inp, layers.Dense(5)(pool(100)(s))


def _din():
    """(inputs, logits) of a Deep Interest Network."""
    import keras
    from keras import layers

    _, unit_input, weighted_sum, *_ = _layers()
    history = keras.Input((50,), dtype="int32", name="history")
    candidate = keras.Input((1,), dtype="int32", name="candidate")
    profile = keras.Input((4,), dtype="int32", name="profile")
    items = layers.Embedding(VOCAB, 64)
    h, c = items(history), items(candidate)
    a = unit_input()(h, c)
    for units in (80, 40):
        a = layers.PReLU()(layers.Dense(units)(a))
    pooled = weighted_sum()(layers.Dense(1)(a), h)
    p = layers.Flatten()(layers.Embedding(VOCAB, 16)(profile))
    x = layers.Concatenate()([pooled, layers.Flatten()(c), p])
    for units in (200, 80):
        x = layers.PReLU()(layers.Dense(units)(x))
    return [history, candidate, profile], layers.Dense(2)(x)


def _residual(x, out):
    """A pre-activation bottleneck module (the hourglass's)."""
    from keras import layers

    skip = x if x.shape[-1] == out else layers.Conv2D(out, 1)(x)
    h = x
    for filters, size in ((out // 2, 1), (out // 2, 3), (out, 1)):
        h = layers.Activation("relu")(layers.BatchNormalization()(h))
        h = layers.Conv2D(filters, size, padding="same")(h)
    return layers.Add()([h, skip])


def _hourglass_module(x, depth, f=128):
    from keras import layers

    up = _residual(x, f)
    low = _residual(layers.MaxPooling2D(2)(x), f)
    if depth > 1:
        low = _hourglass_module(low, depth - 1, f)
    else:
        low = _residual(low, f)
    low = _residual(low, f)
    return layers.Add()([up, layers.UpSampling2D(2)(low)])


def _hourglass():
    """(inputs, heatmaps) of a two-stack hourglass network at 128x128."""
    import keras
    from keras import layers

    inp = keras.Input((128, 128, 3))
    x = _conv_bn(inp, 64, 7, strides=2)  # 64x64
    x = _residual(x, 128)
    x = layers.MaxPooling2D(2)(x)  # 32x32
    x = _residual(x, 128)
    x = _residual(x, 128)
    for stack in range(2):
        h = _residual(_hourglass_module(x, 3), 128)
        h = _conv_bn(h, 128, 1)
        heat = layers.Conv2D(16, 1)(h)
        if stack == 0:
            x = layers.Add()(
                [x, layers.Conv2D(128, 1)(h), layers.Conv2D(128, 1)(heat)]
            )
    return inp, heat


def _tabnet(steps=5, n=64, gamma=1.3):
    """(inputs, logits) of TabNet on 54 numeric features."""
    import math

    import keras
    from keras import layers
    from keras import ops

    _, _, _, glu, sparsemax, prior_update, halves = _layers()
    scale = math.sqrt(0.5)

    def glu_block(x, dense):
        return glu()(layers.BatchNormalization()(dense(x)))

    shared = [layers.Dense(4 * n, use_bias=False) for _ in range(2)]

    def feature_transformer(x):
        h = glu_block(x, shared[0])
        h = layers.Rescaling(scale)(layers.Add()([h, glu_block(h, shared[1])]))
        for _ in range(2):
            own = layers.Dense(4 * n, use_bias=False)
            h = layers.Rescaling(scale)(layers.Add()([h, glu_block(h, own)]))
        return halves(n)(h)  # (decision, attention)

    inp = keras.Input((54,))
    x = layers.BatchNormalization()(inp)
    _, a = feature_transformer(x)
    prior = layers.Activation(ops.ones_like)(x)
    out = None
    for _ in range(steps):
        m = layers.BatchNormalization()(layers.Dense(54, use_bias=False)(a))
        mask = sparsemax()(layers.Multiply()([m, prior]))
        prior = prior_update(gamma)(prior, mask)
        d, a = feature_transformer(layers.Multiply()([mask, x]))
        d = layers.Activation("relu")(d)
        out = d if out is None else layers.Add()([out, d])
    return inp, layers.Dense(7)(out)


def build_heldout9(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "squeezenet":
        inp, logits = _squeezenet()
        return inp, logits, True
    if name == "deeplabv3plus":
        inp, logits = _deeplabv3plus()
        return inp, logits, True
    if name == "xlnet_tiny":
        import keras_hub

        backbone = keras_hub.models.XLNetBackbone(
            vocabulary_size=VOCAB * 4,
            num_layers=4,
            num_heads=4,
            hidden_dim=256,
            intermediate_dim=1024,
            dropout=0.1,
        )
        inputs = {
            kind: keras.Input((128,), dtype="int32", name=kind)
            for kind in ("token_ids", "padding_mask", "segment_ids")
        }
        logits = layers.Dense(VOCAB * 4)(backbone(inputs))
        logits = layers.Activation("linear", dtype="float32")(logits)
        return inputs, logits, True
    if name == "vivit":
        inp, logits = _vivit()
        return inp, logits, True
    if name == "han":
        inp, logits = _han()
        return inp, logits, True
    if name == "din":
        inputs, logits = _din()
        return inputs, logits, True
    if name == "hourglass":
        inp, heat = _hourglass()
        return inp, heat, False
    if name == "tabnet":
        inp, logits = _tabnet()
        return inp, logits, True
    raise ValueError(name)
