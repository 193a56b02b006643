"""The estimator's tenth held-out set (issue #23).

The first nine held-out sets (`_estimator_heldout.py` to
`_estimator_heldout9.py`) have each been seen, so none judges the rules
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
keras-io's MobileViT, GRU4Rec, DeepFM, DnCNN, N-BEATS) and the ninth
(SqueezeNet 1.1, DeepLabV3+, keras-hub's XLNet, keras-io's ViViT, a
hierarchical attention network, DIN, a two-stack hourglass, TabNet). It
was fixed in this file and committed before any case was measured; its
batch sizes come from the models' arithmetic (weights, layer outputs
per sample), not from the estimate. Its cases are measured without an
estimate; the set is estimated once (`--heldout10 --reestimate`) after
the estimator's rules are final. Why each family is new:

- `hrnet_mini`: an HRNet-like segmentation net (Wang et al. 2019,
  HRNetV2) built from layers at 128x128: a stem of two strided 3x3
  convolutions (BatchNormalization, ReLU) to 32x32, two bottleneck
  residual blocks, then branches at 32x32x32 and 16x16x64 (and 8x8x128
  from the second stage on) kept in parallel through two stages of two
  basic residual blocks (two 3x3 convolutions) per branch, each stage
  ending in an exchange unit in which every
  branch receives the sum of all branches (a 1x1 convolution and
  nearest upsampling from a coarser one, strided 3x3 convolutions from
  a finer one); the head upsamples every branch to 32x32, concatenates
  them, a 1x1 convolution, an 8-way 1x1 convolution and a 4x bilinear
  upsampling to per-pixel logits. The U-Net, the FPN, DeepLabV3+ and
  the hourglass go down to a coarse resolution and back up once (per
  stack); no set keeps several resolutions in parallel and exchanges
  them repeatedly.
- `capsnet`: a capsule network with dynamic routing (Sabour et al.
  2017) on 28x28x1: a 9x9 convolution (256, ReLU), a strided 9x9
  convolution to 16 types of 8-D primary capsules on 6x6 (576
  capsules, squashed), a transformation matrix per pair of primary and
  digit capsule (576 x 10 x 16 x 8, drawn with a standard deviation of
  0.1) predicting 10 digit capsules of 16-D
  (`u_hat`, 576 x 10 x 16 per sample), three routing iterations
  (coupling coefficients a softmax of the logits over the digit
  capsules, their weighted sum squashed, the logits updated by the
  agreement), and the lengths of the digit capsules as the 10 logits
  of the cross-entropy (the paper's margin loss and reconstruction
  decoder are left out). No set predicts vectors per pair of
  capsules and routes them by agreement in the step.
- `resnet_generator`: the ResNet generator of fast style transfer and
  CycleGAN (Johnson et al. 2016, Zhu et al. 2017) at 64x64: reflection
  padding and a 7x7 convolution (32), two strided 3x3 convolutions (64,
  128), six residual blocks at 16x16x128 (reflection padding, 3x3
  convolutions), two transposed convolutions back up (64, 32) and a
  reflection-padded 7x7 convolution to 3 channels with tanh, instance
  normalisation (`GroupNormalization` with a group per channel) and
  ReLU after every convolution but the last; MSE to an image-sized
  target (a generator trained on a reconstruction loss). The
  convolutional autoencoder and the VAE compress to a bottleneck, the
  U-Net concatenates skips; no set has instance normalisation,
  reflection padding or a residual trunk at a quarter of the
  resolution between strided and transposed convolutions.
- `bart_tiny`: keras-hub's `BartBackbone` from a tiny config (no
  download: 3 encoder and 3 decoder layers, 4 heads, 256 wide, 1024 in
  the MLP, a 4000-token vocabulary) over 128 encoder and 128 decoder
  tokens, with logits through the tied token embedding at every decoder
  position (float32). BART is a post-LayerNorm encoder-decoder with
  learned positions, embeddings shared by encoder and decoder, and
  GELU; T5 has relative position buckets and RMS norms, Whisper an
  audio encoder, the seventh set's encoder-decoder is built from
  layers; no set has BART's denoising encoder-decoder.
- `gat`: a graph attention network (Velickovic et al. 2018) for node
  classification on batched dense graphs (128 nodes of 64 features and
  a 128x128 adjacency per sample, an edge where the adjacency's value
  is above 0.9, self-loops added): two layers of 8 heads of 32 (a
  shared projection, per-head source and destination scores, LeakyReLU
  0.2 of their sum per node pair, a softmax over the neighbours with
  the non-edges masked, dropout 0.6 on the coefficients, the heads
  concatenated, ELU) and an output layer of one head to 7 classes per
  node (sparse labels per node). The third set's GCN multiplies by a
  fixed normalised adjacency; no set learns attention coefficients
  over a graph's edges.
- `rwkv7_tiny`: keras-hub's `RWKV7Backbone` from a tiny config (no
  download: 2 layers, 256 wide, 4 heads of 64, 1024 in the channel
  mixing, LoRA ranks 32/16/16/16, a 1000-token vocabulary) over 32
  tokens, with its own 1000-way head at every position (float32). Its
  time mixing is a recurrence (the generalised delta rule: a 64 x 64
  state per head decayed, updated by outer products, read by the
  receptance), written out step by step into a `TensorArray` in
  TensorFlow; the recurrent sets use Keras's LSTM and GRU layers,
  ConvLSTM its own cell; no set has a matrix-valued state per head or
  a linear-attention RNN.
- `dlrm`: DLRM (Naumov et al. 2019) on Criteo-like rows: 13 numeric
  features through a bottom MLP (512, 256, 32, ReLU), 26 categorical
  fields of 1000 ids each looked up in one table with an offset per
  field (32-wide), the dot products of every pair of the 27 vectors (a
  batched matmul, the 351 below the diagonal gathered) concatenated
  with the bottom MLP's output, a top MLP (512, 256, ReLU) and a 2-way
  click head. DeepFM sums the pairwise products into one factorisation
  machine term, DCN crosses a flat vector, the wide-and-deep and
  tabular MLPs concatenate; no set feeds each pairwise interaction of
  the embeddings to an MLP.
- `captioner`: a Show-and-Tell image captioner (Vinyals et al. 2015):
  a small CNN (four 3x3 convolutions, 32 to 256, BatchNormalization,
  ReLU, max-pooling) over a 64x64x3 image to a 256-wide image
  embedding fed as the first input of an LSTM of 512, then 20 caption
  tokens embedded (256) as the next inputs, a 1000-way head at each
  token's step (the image's step cropped). The CRNN reads an image's
  columns as a sequence, the encoder-decoders condition on a sequence;
  no set conditions a recurrent language model on an image.

Variants: `base` (Adam) at two batch sizes, and at the larger one one or
two of `adamw` (AdamW, on `bart_tiny`, `gat` and `captioner`),
`sgd_momentum` (SGD, momentum 0.9, on `hrnet_mini` and `capsnet`),
`accumulation=4` (Adam, on `capsnet`, `rwkv7_tiny` and `dlrm`),
`checkpointing=auto` (Adam, on `hrnet_mini`, `resnet_generator` and
`captioner`) and `mixed_bfloat16` (Adam, on `resnet_generator` and
`bart_tiny`). Rough arithmetic behind the batch sizes (float32;
"outputs" is the sum of the layers' outputs per sample, of which the
step keeps most for the gradient):
hrnet_mini about 1.44M weights (22 MiB with Adam), the 64x64x64 stem
maps (1 MiB each), the first stage's 32x32x128 bottleneck outputs (512
KiB), the 32x32x32 branch's maps (128 KiB each), the head's 32x32x224
concatenation (896 KiB) and the 128x128x8 logits (512 KiB), outputs
about 34 MiB per sample; capsnet about 3.41M weights (52 MiB with Adam:
the 9x9 convolution to 128 channels 2.65M, the transformation matrices
0.74M), the 20x20x256 first maps (400 KiB) and `u_hat` and its routing
products (576 x 10 x 16, 360 KiB each), outputs about 3.6 MiB per
sample; resnet_generator about 1.97M weights (30 MiB with Adam), the
64x64x32 maps (512 KiB each, the padded ones larger), the 16x16x128
trunk maps (128 KiB each, about 60 of them with the instance
normalisations' intermediates), outputs about 21 MiB per sample;
bart_tiny about 6.62M weights (101 MiB with Adam), per layer the 4 x 128
x 128 scores (256 KiB, with the softmax and dropout about 1 MiB; the
decoder's layers twice), the 128 x 1024 MLP (512 KiB, more with the
GELU's intermediates) and the 128 x 4000 logits (2 MiB), outputs about
89 MiB per sample; gat about 0.08M weights, per attention layer the 8 x
128 x 128 pair scores (512 KiB each: the sum, the LeakyReLU, the masked
scores, the softmax, the dropout), outputs about 12 MiB per sample;
rwkv7_tiny about 2.17M weights (33 MiB with Adam), per layer and token
the 4 x 64 x 64 state and its update's outer products (64 KiB each, 32
tokens written out), the 32 x 1000 logits, outputs about 27 MiB per
sample; dlrm about 1.31M weights (20 MiB with Adam: the 26000 x 32
table 0.83M), per sample the 27 x 27 interaction and the 512- and
256-wide layers, outputs about 30 KiB per sample; captioner about 2.80M
weights (43 MiB with Adam: the LSTM 1.57M), the 64x64x32 maps (512 KiB
each) and smaller ones after each pooling, the 21 LSTM steps' gates (8
KiB each) and the 20 x 1000 logits (80 KiB), outputs about 5.3 MiB per
sample (the LSTM's loop not counted). "Outputs" here is the sum of the
float outputs of the forward graph's ops at batch 2 less batch 1
(reshapes and identities left out). Weights with Adam plus outputs
times the larger batch: hrnet_mini 434 MiB at 12, capsnet 284 at 64,
resnet_generator 374 at 16, bart_tiny 633 at 6, gat 394 at 32,
rwkv7_tiny 465 at 16, dlrm 294 at 8192, captioner 384 at 64; for the
ninth set's models the same sum at their larger batch was 1.3 to 5.3
times the measured peak (the peak 0.19 to 0.75 of the sum), so these peaks
should fall between about 50 and 400 MiB, and at the smaller batch
between about 20 and 200 MiB.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT10 = {
    "hrnet_mini": [
        ("base", 4),
        ("base", 12),
        ("checkpointing=auto", 12),
        ("sgd_momentum", 12),
    ],
    "capsnet": [
        ("base", 16),
        ("base", 64),
        ("accumulation=4", 64),
        ("sgd_momentum", 64),
    ],
    "resnet_generator": [
        ("base", 4),
        ("base", 16),
        ("checkpointing=auto", 16),
        ("mixed_bfloat16", 16),
    ],
    "bart_tiny": [
        ("base", 2),
        ("base", 6),
        ("adamw", 6),
        ("mixed_bfloat16", 6),
    ],
    "gat": [
        ("base", 8),
        ("base", 32),
        ("adamw", 32),
    ],
    "rwkv7_tiny": [
        ("base", 4),
        ("base", 16),
        ("accumulation=4", 16),
    ],
    "dlrm": [
        ("base", 2048),
        ("base", 8192),
        ("accumulation=4", 8192),
    ],
    "captioner": [
        ("base", 16),
        ("base", 64),
        ("checkpointing=auto", 64),
        ("adamw", 64),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data); BART's vocabulary is larger.
VOCAB = 1000


def _layers():
    """The custom layers of the set: squash and dynamic routing
    (CapsNet), reflection padding (the ResNet generator), graph
    attention (GAT), DLRM's field offsets and pairwise interaction."""
    import keras
    from keras import layers
    from keras import ops

    def squash(s, axis=-1):
        n2 = ops.sum(ops.square(s), axis=axis, keepdims=True)
        return n2 / (1 + n2) * s / ops.sqrt(n2 + 1e-7)

    class Squash(layers.Layer):
        def call(self, s):
            return squash(s)

    class DigitCaps(layers.Layer):
        """u_hat = W u per (primary, digit) pair, routed by agreement."""

        def __init__(self, caps, dim, iterations=3, **kwargs):
            super().__init__(**kwargs)
            self.caps, self.dim, self.iterations = caps, dim, iterations

        def build(self, input_shape):
            _, n, d = input_shape
            self.w = self.add_weight(
                shape=(n, self.caps, self.dim, d),
                initializer=keras.initializers.RandomNormal(stddev=0.1),
                name="w",
            )

        def call(self, u):
            # (B, n, caps, dim): one prediction per pair.
            u_hat = ops.einsum("ncdk,bnk->bncd", self.w, u)
            logits = ops.zeros(ops.shape(u_hat)[:3])
            for i in range(self.iterations):
                c = ops.softmax(logits, axis=2)
                v = squash(ops.sum(c[..., None] * u_hat, axis=1))
                if i + 1 < self.iterations:
                    logits = logits + ops.sum(u_hat * v[:, None], axis=-1)
            return v

    class Length(layers.Layer):
        def call(self, v):
            return ops.sqrt(ops.sum(ops.square(v), axis=-1) + 1e-7)

    class ReflectionPad(layers.Layer):
        def __init__(self, pad, **kwargs):
            super().__init__(**kwargs)
            self.pad = pad

        def call(self, x):
            p = self.pad
            return ops.pad(x, [[0, 0], [p, p], [p, p], [0, 0]], mode="reflect")

    class GraphAttention(layers.Layer):
        """One multi-head GAT layer on dense graphs (x, adjacency)."""

        def __init__(self, heads, units, concat=True, **kwargs):
            super().__init__(**kwargs)
            self.heads, self.units, self.concat = heads, units, concat
            self.proj = layers.Dense(heads * units, use_bias=False)
            self.dropout = layers.Dropout(0.6)

        def build(self, input_shape):
            shape = (self.heads, self.units)
            init = keras.initializers.GlorotUniform()
            self.a_src = self.add_weight(shape=shape, initializer=init)
            self.a_dst = self.add_weight(shape=shape, initializer=init)

        def call(self, x, adjacency, training=None):
            n = ops.shape(x)[1]
            h = self.proj(x)
            h = ops.reshape(h, (-1, n, self.heads, self.units))
            src = ops.einsum("bnhu,hu->bhn", h, self.a_src)
            dst = ops.einsum("bnhu,hu->bhn", h, self.a_dst)
            e = ops.leaky_relu(src[..., :, None] + dst[..., None, :], 0.2)
            edges = ops.logical_or(
                adjacency > 0.9, ops.eye(n, dtype="bool")[None]
            )
            e = ops.where(edges[:, None], e, -1e9)
            alpha = self.dropout(ops.softmax(e, axis=-1), training=training)
            out = ops.einsum("bhnm,bmhu->bnhu", alpha, h)
            if self.concat:
                return ops.reshape(out, (-1, n, self.heads * self.units))
            return ops.mean(out, axis=2)

    class FieldOffsets(layers.Layer):
        """Field i's ids + i * vocab: one table for all the fields."""

        def __init__(self, vocab, **kwargs):
            super().__init__(**kwargs)
            self.vocab = vocab

        def call(self, ids):
            fields = ops.shape(ids)[-1]
            return ids + ops.arange(fields, dtype=ids.dtype) * self.vocab

    class PairwiseDots(layers.Layer):
        """The dot products of every pair of the vectors (below the
        diagonal), as DLRM's interaction."""

        def call(self, bottom, embedded):
            t = ops.concatenate([bottom[:, None], embedded], axis=1)
            n = t.shape[1]
            z = ops.matmul(t, ops.transpose(t, (0, 2, 1)))
            z = ops.reshape(z, (-1, n * n))
            idx = [i * n + j for i in range(n) for j in range(i)]
            return ops.take(z, ops.convert_to_tensor(idx, "int32"), axis=1)

    return (
        Squash,
        DigitCaps,
        Length,
        ReflectionPad,
        GraphAttention,
        FieldOffsets,
        PairwiseDots,
    )


def _conv_bn(x, filters, size, strides=1):
    from keras import layers

    x = layers.Conv2D(
        filters, size, strides=strides, padding="same", use_bias=False
    )(x)
    x = layers.BatchNormalization()(x)
    return layers.Activation("relu")(x)


def _basic(x, filters):
    """HRNet's basic block: two 3x3 convolutions and the residual."""
    from keras import layers

    h = _conv_bn(x, filters, 3)
    h = layers.BatchNormalization()(
        layers.Conv2D(filters, 3, padding="same", use_bias=False)(h)
    )
    return layers.Activation("relu")(layers.Add()([h, x]))


def _bottleneck(x, filters):
    """HRNet's first-stage bottleneck block (4x expansion)."""
    from keras import layers

    skip = x
    if x.shape[-1] != 4 * filters:
        skip = layers.BatchNormalization()(
            layers.Conv2D(4 * filters, 1, use_bias=False)(x)
        )
    h = _conv_bn(x, filters, 1)
    h = _conv_bn(h, filters, 3)
    h = layers.BatchNormalization()(
        layers.Conv2D(4 * filters, 1, use_bias=False)(h)
    )
    return layers.Activation("relu")(layers.Add()([h, skip]))


def _exchange(branches, widths):
    """HRNet's exchange unit: each branch gets the sum of all of them."""
    from keras import layers

    out = []
    for i, width in enumerate(widths):
        terms = []
        for j, x in enumerate(branches):
            if j == i:
                terms.append(x)
            elif j > i:  # coarser: 1x1, upsample
                h = layers.BatchNormalization()(
                    layers.Conv2D(width, 1, use_bias=False)(x)
                )
                terms.append(layers.UpSampling2D(2 ** (j - i))(h))
            else:  # finer: strided 3x3 convolutions
                h = x
                for k in range(i - j):
                    last = k == i - j - 1
                    h = layers.Conv2D(
                        width if last else widths[j],
                        3,
                        strides=2,
                        padding="same",
                        use_bias=False,
                    )(h)
                    h = layers.BatchNormalization()(h)
                    if not last:
                        h = layers.Activation("relu")(h)
                terms.append(h)
        out.append(layers.Activation("relu")(layers.Add()(terms)))
    return out


def _hrnet_mini():
    """(inputs, per-pixel logits) of an HRNet-like net at 128x128."""
    import keras
    from keras import layers

    widths = (32, 64, 128)
    inp = keras.Input((128, 128, 3))
    x = _conv_bn(inp, 64, 3, strides=2)  # 64x64
    x = _conv_bn(x, 64, 3, strides=2)  # 32x32
    x = _bottleneck(_bottleneck(x, 32), 32)  # 32x32x128
    branches = [_conv_bn(x, widths[0], 3), _conv_bn(x, widths[1], 3, 2)]
    for stage in (2, 3):
        if stage == 3:  # a new, coarser branch
            branches.append(_conv_bn(branches[-1], widths[2], 3, 2))
        branches = [
            _basic(_basic(b, w), w)
            for b, w in zip(branches, widths, strict=False)
        ]
        branches = _exchange(branches, widths[: len(branches)])
    up = [branches[0]] + [
        layers.UpSampling2D(2**i, interpolation="bilinear")(b)
        for i, b in enumerate(branches[1:], 1)
    ]
    x = _conv_bn(layers.Concatenate()(up), 128, 1)
    x = layers.Conv2D(8, 1)(x)
    x = layers.UpSampling2D(4, interpolation="bilinear")(x)
    return inp, x


def _capsnet():
    """(inputs, capsule lengths) of a CapsNet on 28x28x1."""
    import keras
    from keras import layers

    squash, digit_caps, length, *_ = _layers()
    inp = keras.Input((28, 28, 1))
    x = layers.Conv2D(256, 9, activation="relu")(inp)  # 20x20
    x = layers.Conv2D(16 * 8, 9, strides=2)(x)  # 6x6
    u = squash()(layers.Reshape((6 * 6 * 16, 8))(x))
    return inp, length()(digit_caps(10, 16)(u))


def _resnet_generator():
    """(inputs, image) of a CycleGAN / fast style transfer generator."""
    import keras
    from keras import layers

    _, _, _, pad, *_ = _layers()

    def norm_relu(x, relu=True):
        x = layers.GroupNormalization(groups=x.shape[-1])(x)
        return layers.Activation("relu")(x) if relu else x

    inp = keras.Input((64, 64, 3))
    x = norm_relu(layers.Conv2D(32, 7)(pad(3)(inp)))
    x = norm_relu(layers.Conv2D(64, 3, strides=2, padding="same")(x))
    x = norm_relu(layers.Conv2D(128, 3, strides=2, padding="same")(x))
    for _ in range(6):  # 16x16x128
        h = norm_relu(layers.Conv2D(128, 3)(pad(1)(x)))
        h = norm_relu(layers.Conv2D(128, 3)(pad(1)(h)), relu=False)
        x = layers.Add()([x, h])
    for filters in (64, 32):
        x = layers.Conv2DTranspose(filters, 3, strides=2, padding="same")(x)
        x = norm_relu(x)
    x = layers.Conv2D(3, 7, activation="tanh")(pad(3)(x))
    return inp, layers.Activation("linear", dtype="float32")(x)


def _gat():
    """(inputs, per-node logits) of a graph attention network."""
    import keras
    from keras import layers

    *_, graph_attention, _, _ = _layers()
    nodes = keras.Input((128, 64), name="nodes")
    adjacency = keras.Input((128, 128), name="adjacency")
    x = layers.Dropout(0.6)(nodes)
    for _ in range(2):
        x = graph_attention(8, 32)(x, adjacency)
        x = layers.Dropout(0.6)(layers.Activation("elu")(x))
    logits = graph_attention(1, 7, concat=False)(x, adjacency)
    return [nodes, adjacency], logits


def _dlrm():
    """(inputs, logits) of DLRM on 13 numeric and 26 categorical fields."""
    import keras
    from keras import layers

    *_, field_offsets, pairwise_dots = _layers()
    dense = keras.Input((13,), name="numeric")
    sparse = keras.Input((26,), dtype="int32", name="categorical")
    b = dense
    for units in (512, 256, 32):
        b = layers.Dense(units, activation="relu")(b)
    e = layers.Embedding(26 * VOCAB, 32)(field_offsets(VOCAB)(sparse))
    x = layers.Concatenate()([b, pairwise_dots()(b, e)])
    for units in (512, 256):
        x = layers.Dense(units, activation="relu")(x)
    return [dense, sparse], layers.Dense(2)(x)


def _captioner():
    """(inputs, per-token logits) of a Show-and-Tell captioner."""
    import keras
    from keras import layers

    image = keras.Input((64, 64, 3), name="image")
    tokens = keras.Input((20,), dtype="int32", name="tokens")
    x = image
    for filters in (32, 64, 128, 256):
        x = layers.MaxPooling2D()(_conv_bn(x, filters, 3))
    x = layers.Dense(256)(layers.GlobalAveragePooling2D()(x))
    words = layers.Embedding(VOCAB, 256)(tokens)
    seq = layers.Concatenate(axis=1)([layers.Reshape((1, 256))(x), words])
    h = layers.LSTM(512, return_sequences=True)(seq)
    h = layers.Cropping1D((1, 0))(h)  # the image's step
    return [image, tokens], layers.Dense(VOCAB)(h)


def build_heldout10(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "hrnet_mini":
        inp, logits = _hrnet_mini()
        return inp, layers.Activation("linear", dtype="float32")(logits), True
    if name == "capsnet":
        inp, lengths = _capsnet()
        return inp, lengths, True
    if name == "resnet_generator":
        inp, image = _resnet_generator()
        return inp, image, False
    if name == "bart_tiny":
        import keras_hub

        backbone = keras_hub.models.BartBackbone(
            vocabulary_size=VOCAB * 4,
            num_layers=3,
            num_heads=4,
            hidden_dim=256,
            intermediate_dim=1024,
            dropout=0.1,
            max_sequence_length=128,
        )
        inputs = {
            kind: keras.Input((128,), dtype="int32", name=kind)
            for kind in (
                "encoder_token_ids",
                "encoder_padding_mask",
                "decoder_token_ids",
                "decoder_padding_mask",
            )
        }
        h = backbone(inputs)["decoder_sequence_output"]
        logits = backbone.token_embedding(h, reverse=True)
        logits = layers.Activation("linear", dtype="float32")(logits)
        return inputs, logits, True
    if name == "gat":
        inputs, logits = _gat()
        return inputs, logits, True
    if name == "rwkv7_tiny":
        import keras_hub

        backbone = keras_hub.models.RWKV7Backbone(
            hidden_size=256,
            head_size=64,
            num_layers=2,
            vocabulary_size=VOCAB,
            intermediate_dim=1024,
            gate_lora=32,
            mv_lora=16,
            aaa_lora=16,
            decay_lora=16,
        )
        inputs = {
            kind: keras.Input((32,), dtype="int32", name=kind)
            for kind in ("token_ids", "padding_mask")
        }
        logits = layers.Activation("linear", dtype="float32")(backbone(inputs))
        return inputs, logits, True
    if name == "dlrm":
        inputs, logits = _dlrm()
        return inputs, logits, True
    if name == "captioner":
        inputs, logits = _captioner()
        return inputs, logits, True
    raise ValueError(name)
