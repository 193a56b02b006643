"""The estimator's fourteenth held-out set (issue #23).

The first thirteen held-out sets (`_estimator_heldout.py` to
`_estimator_heldout13.py`) have each been seen, so none judges the rules
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
a Show-and-Tell captioner), the eleventh (a pre-activation Wide
ResNet 16-4, a dilated colorization net, keras-hub's Llama, a
transformer time-series forecaster, an Elman RNN language model,
AutoInt, a DCGAN generator, NeRF's MLP), the twelfth (an
AlexNet-style net, a Tiny-YOLO-v2-like detector, keras-hub's ELECTRA,
keras-io's Compact Convolutional Transformer, an LSTM autoencoder,
xDeepFM, an EDSR-like super-resolution net, keras-io's ConvMixer) and
the thirteenth (a PSPNet-like net, a GhostNet-like net, LeNet-5,
keras-hub's OPT, a masked autoencoder, an ELMo-like biLSTM language
model, SASRec, MMoE). It was fixed in this file and committed before any
case was measured; its batch sizes come from the models' arithmetic
(weights, layer outputs per sample), not from the estimate. Its cases
are measured without an estimate; the set is estimated once
(`--heldout14 --reestimate`) after the estimator's rules are final. The
families were chosen for kind and for a first step that is fast on a
CPU, not for what the estimator might get right or wrong. Why each
family is new:

- `nin`: Network in Network (Lin et al. 2014) on 32x32x3: three mlpconv
  blocks (a 5x5, 5x5 and 3x3 convolution, each followed by two 1x1
  convolutions, ReLU: 192-160-96, 192-192-192 and 192-192-10), max and
  then average pooling of stride 2 with dropout between the blocks,
  and the last block's ten class maps averaged into the logits (no
  dense layer). SqueezeNet's fire modules squeeze and expand in
  parallel 1x1 and 3x3 branches, the Mixer and ConvMixer mix tokens; no
  set follows each spatial convolution with a stack of 1x1
  convolutions (a per-pixel MLP) at full resolution.
- `res2net_mini`: a Res2Net-like net (Gao et al. 2019) on 64x64x3: a
  3x3 stem (32, BatchNormalization, ReLU), 2x2 max pooling to 32x32, six
  bottlenecks (a 1x1 convolution to 4 groups of w channels; the first
  group passed on, average-pooled at stride 2, each next group a 3x3
  convolution of itself plus the previous group's output, or of itself
  alone at stride 2; the groups concatenated, a 1x1 convolution with
  BatchNormalization, a projection shortcut where the shape changes)
  of 128, 256 and 512 channels at 32x32, 16x16 and 8x8, global pooling
  and a 10-way head. ResNeXt's groups run side by side, Inception's
  branches too; no set feeds one group's convolution into the next
  inside a block (hierarchical residual-like connections).
- `gpt_neox_tiny`: keras-hub's `GPTNeoXBackbone` from a tiny config (no
  download: 4 layers, 4 heads, 256 wide, 1024 in the MLP, a 4000-token
  vocabulary, 128 positions) over 128 tokens with a padding mask, and a
  dense language-model head to the 4000 tokens at every token (float32
  logits). GPT-2, BLOOM, Falcon (ALiBi), Gemma, Llama, Mixtral and OPT
  are other decoders; no set has GPT-NeoX: rotary positions on a
  quarter of each head's dimensions, and the attention and the MLP in
  parallel on one residual (both added to the layer's input).
- `linear_transformer`: a linear-attention transformer (Katharopoulos
  et al. 2020) classifying 512 tokens: 256-wide token embeddings plus
  learned positions, four pre-LayerNorm layers of 8-head linear
  attention (queries and keys through elu + 1, each head's keys'
  summary, a 32 x 32 product of keys and values, read by the queries
  and normalised by their product with the keys' sum; no 512 x 512
  scores) and a GELU MLP of 1024 with dropout, LayerNormalization,
  average pooling and a 10-way head. Every other transformer scores
  tokens with a softmax (FNet mixes by a Fourier transform, the
  Perceiver cross-attends to latents, RWKV-7 is a recurrence); no set
  has kernelised linear attention.
- `indrnn`: an IndRNN classifier (Li et al. 2018) over 100 steps of 16
  features: three recurrent layers of 256 (a custom cell in
  `keras.layers.RNN`: relu(W x + u * h + b), the recurrent weight one
  number per unit), BatchNormalization after each (over every step for
  the first two, which return their sequences), and a 10-way head on
  the last state. The LSTMs, GRUs and the Elman RNN use Keras's
  built-in cells with full recurrent matrices; no set has an
  element-wise recurrence, nor a custom cell run by `keras.layers.RNN`.
- `fibinet`: FiBiNET (Huang et al. 2019) on 13 numeric features and 16
  categorical fields (16-wide embeddings): a squeeze-excitation over
  the fields (each field's mean, dense 5 and 16 with ReLU, the fields
  reweighted), bilinear interactions of all 120 field pairs ((v_i W) *
  v_j, one shared 16 x 16 W) of both the plain and the reweighted
  embeddings, concatenated with the numeric features (3853 values), a
  400-400-400 ReLU MLP and 2 logits. DeepFM, xDeepFM, DCN, AutoInt,
  DLRM and NCF cross fields by inner products, a compressed
  interaction, cross layers, self-attention or dot products; no set
  weights fields by squeeze-excitation nor crosses them bilinearly.
- `flownet_s`: a FlowNetSimple-like optical-flow net (Dosovitskiy et
  al. 2015) on two stacked 64x64 RGB frames (64x64x6): convolutions
  7x7/64, 5x5/128, 5x5/256 (and 3x3/256), 3x3/512 (and 3x3/512), each
  of the first four of stride 2, LeakyReLU(0.1), down to 4x4; a
  refinement from a 2-channel flow predicted at 4x4: at each level a
  transposed convolution of the features (256, 128, 64), the
  encoder's map of that size and the coarser flow upsampled by a
  transposed convolution, concatenated, a new flow predicted from
  them; the 32x32 flow upsampled x2 (bilinear) to a 64x64x2 target,
  MSE. U-Net, the FPN and the hourglass merge skips into a decoder;
  no set regresses motion from a pair of frames, nor feeds each
  level's coarse prediction into the next.
- `gin`: a graph isomorphism network (Xu et al. 2019) on graphs of 64
  nodes of 32 features (a dense 64 x 64 adjacency input): five layers
  of (1 + eps) h + A h (neighbours summed, eps learned) followed by an
  MLP (dense 256, BatchNormalization, ReLU, dense 256, ReLU), a mean
  readout of the input and of every layer's node states, concatenated,
  dense 256 (ReLU), dropout and a 10-way head. The graph conv net
  averages normalised neighbours through one linear map, GAT attends
  over them; no set sums neighbours with a learned self weight and an
  MLP per layer, nor reads out every layer.

Variants: `base` (Adam) at two batch sizes, and at the larger one one or
two of `adamw` (AdamW, on `gpt_neox_tiny`), `sgd_momentum` (SGD,
momentum 0.9, on `fibinet` and `gin`), `accumulation=4` (Adam, on
`linear_transformer` and `indrnn`), `checkpointing=auto` (Adam, on
`nin`, `res2net_mini` and `flownet_s`) and `mixed_bfloat16` (Adam, on
`res2net_mini` and `gpt_neox_tiny`); 26 cases. Rough arithmetic behind
the batch sizes (float32; weights from `count_params()`, "outputs" the
sum of the Keras layers' outputs per sample, a backbone counted as one
layer, plus a hand count of what such a layer keeps inside it; Adam
keeps 4 words per weight with the gradient): nin 0.97M weights (15 MiB
with Adam), outputs 2.7 MiB per sample (the 32x32x192 and 32x32x160
maps, 768 and 640 KiB); res2net_mini 1.08M weights (17 MiB), outputs
19.4 MiB per sample (the stem's 64x64x32 maps, 512 KiB, three times, and
at 32x32 the blocks' 128-channel maps, 512 KiB, with their
BatchNormalization, ReLU, shortcut and sums); gpt_neox_tiny 5.21M
weights (80 MiB: the token embedding and the head 1.02M each), layer
outputs 3.9 MiB per sample with the backbone as one (the 128 x 4000
logits, 2 MiB, twice with the Activation), about 14 MiB by hand as for
set 13's OPT of the same size (per layer the 4 x 128 x 128 scores, 256
KiB, about three times, the 128 x 1024 MLP maps, 512 KiB, twice with
GELU, about six 128 x 256 maps of 128 KiB, and the loss's softmax over
the logits); linear_transformer 3.42M weights (52 MiB), outputs 29.0 MiB
per sample (per layer the 512 x 768 projection, 1.5 MiB, the 512 x 1024
MLP maps, 2 MiB, twice with dropout, and the 512 x 256 maps of 512 KiB),
about 33 MiB by hand with the attention's elu features of the queries
and keys and its unnormalised output (about 1 MiB per layer); indrnn
0.14M weights (2 MiB), outputs 0.40 MiB per sample (the 100 x 256
sequences, 100 KiB, twice each with BatchNormalization), about 1.0 MiB
by hand with each step's input product and state in the three
recurrences (100 steps x 256 x 2 words, 200 KiB each); fibinet 1.88M
weights (29 MiB: the first dense layer 1.54M), outputs 0.051 MiB per
sample (the 3853 concatenated values, 15 KiB, and the 120 x 16 pairs,
7.5 KiB, twice); flownet_s 8.61M weights (131 MiB: the 3x3 512-to-512
convolution 2.36M, the first transposed convolution 2.10M), outputs 3.0
MiB per sample (the 32x32x64 maps, 256 KiB, twice with LeakyReLU, and
the 32x32 concatenation of 130 channels, 520 KiB); gin 0.94M weights (14
MiB), outputs 1.5 MiB per sample (per layer about five 64 x 256 node
maps of 64 KiB). Weights with Adam plus outputs (by hand where given)
times the larger batch: nin about 188 MiB at 64, res2net_mini 327 at 16,
gpt_neox_tiny 304 at 16, linear_transformer 316 at 8, indrnn 258 at 256,
fibinet 233 at 4096, flownet_s 228 at 32, gin 212 at 128; set 10's
docstring found such a sum 1.3 to 5.3 times the measured peak for the
ninth set's models, so these peaks should fall between about 30 and 400
MiB, and at the smaller batch lower. A 2-step smoke run of every case at
a batch of 4 (64 for indrnn's larger batch and for fibinet), without
reading memory, took 0.9 to 12.3 s per case on this CPU (res2net_mini
the slowest, 9.6 to 12.3 s); at each family's larger batch, a step after
the first took 0.34 to 1.4 s.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT14 = {
    "nin": [
        ("base", 16),
        ("base", 64),
        ("checkpointing=auto", 64),
    ],
    "res2net_mini": [
        ("base", 4),
        ("base", 16),
        ("checkpointing=auto", 16),
        ("mixed_bfloat16", 16),
    ],
    "gpt_neox_tiny": [
        ("base", 4),
        ("base", 16),
        ("adamw", 16),
        ("mixed_bfloat16", 16),
    ],
    "linear_transformer": [
        ("base", 2),
        ("base", 8),
        ("accumulation=4", 8),
    ],
    "indrnn": [
        ("base", 64),
        ("base", 256),
        ("accumulation=4", 256),
    ],
    "fibinet": [
        ("base", 1024),
        ("base", 4096),
        ("sgd_momentum", 4096),
    ],
    "flownet_s": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "gin": [
        ("base", 32),
        ("base", 128),
        ("sgd_momentum", 128),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data).
VOCAB = 1000


def _layers():
    """The custom layers of the set: linear attention, the IndRNN cell,
    FiBiNET's bilinear interaction and GIN's aggregation."""
    import keras
    from keras import layers
    from keras import ops

    class LinearAttention(layers.Layer):
        """Multi-head linear attention (Katharopoulos et al. 2020): the
        feature map elu(x) + 1 of queries and keys, each head's keys'
        summary (keys' features x values, d x d) read by the queries,
        normalised by the queries' product with the keys' feature sum;
        no n x n score matrix."""

        def __init__(self, heads, width, **kwargs):
            super().__init__(**kwargs)
            self.heads = heads
            self.width = width
            self.qkv = layers.Dense(3 * width)
            self.out = layers.Dense(width)

        def build(self, shape):
            self.qkv.build(shape)
            self.out.build(shape[:-1] + (self.width,))

        def call(self, x):
            n = x.shape[1]
            d = self.width // self.heads
            qkv = ops.reshape(self.qkv(x), (-1, n, 3, self.heads, d))
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            q = ops.elu(q) + 1.0
            k = ops.elu(k) + 1.0
            kv = ops.einsum("bnhd,bnhe->bhde", k, v)
            norm = ops.einsum("bnhd,bhd->bnh", q, ops.sum(k, axis=1))
            h = ops.einsum("bnhd,bhde->bnhe", q, kv)
            h = h / (ops.expand_dims(norm, -1) + 1e-6)
            return self.out(ops.reshape(h, (-1, n, self.width)))

    class IndRNNCell(layers.Layer):
        """An IndRNN cell (Li et al. 2018): h = relu(W x + u * h + b),
        the recurrent weight one number per unit (element-wise)."""

        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.state_size = units
            self.output_size = units

        def build(self, shape):
            self.kernel = self.add_weight(
                shape=(shape[-1], self.units), initializer="glorot_uniform"
            )
            self.recurrent = self.add_weight(
                shape=(self.units,),
                initializer=keras.initializers.RandomUniform(0.0, 1.0),
            )
            self.bias = self.add_weight(
                shape=(self.units,), initializer="zeros"
            )

        def call(self, x, states):
            h = states[0] if isinstance(states, (list, tuple)) else states
            h = ops.relu(
                ops.matmul(x, self.kernel) + self.recurrent * h + self.bias
            )
            return h, [h]

    class Bilinear(layers.Layer):
        """FiBiNET's bilinear interaction ("field-all": one shared
        d x d matrix W): (v_i W) * v_j for every pair of fields i < j."""

        def build(self, shape):
            fields, d = shape[1], shape[2]
            self.w = self.add_weight(shape=(d, d), initializer="glorot_uniform")
            pairs = [
                (i, j) for i in range(fields) for j in range(i + 1, fields)
            ]
            self.left = [i for i, _ in pairs]
            self.right = [j for _, j in pairs]

        def call(self, v):
            vw = ops.matmul(v, self.w)
            return ops.take(vw, self.left, axis=1) * ops.take(
                v, self.right, axis=1
            )

    class SENet(layers.Layer):
        """FiBiNET's squeeze-excitation over fields: each field's mean,
        two dense layers (reduction 3, ReLU), the fields reweighted."""

        def build(self, shape):
            fields = shape[1]
            self.squeeze = layers.Dense(max(1, fields // 3), activation="relu")
            self.excite = layers.Dense(fields, activation="relu")
            self.squeeze.build((None, fields))
            self.excite.build((None, max(1, fields // 3)))

        def call(self, v):
            weights = self.excite(self.squeeze(ops.mean(v, axis=-1)))
            return v * ops.expand_dims(weights, -1)

    class GINAggregate(layers.Layer):
        """GIN's aggregation (Xu et al. 2019): (1 + eps) * h + A h, the
        neighbours summed by the adjacency, eps learned."""

        def build(self, shapes):
            self.eps = self.add_weight(shape=(), initializer="zeros")

        def call(self, x, adjacency):
            return (1.0 + self.eps) * x + ops.matmul(adjacency, x)

    return LinearAttention, IndRNNCell, Bilinear, SENet, GINAggregate


def _nin():
    """(inputs, logits) of Network in Network on 32x32x3."""
    import keras
    from keras import layers

    def mlpconv(x, size, filters):
        x = layers.Conv2D(filters[0], size, padding="same", activation="relu")(
            x
        )
        for f in filters[1:]:
            x = layers.Conv2D(f, 1, activation="relu")(x)
        return x

    inp = keras.Input((32, 32, 3))
    x = mlpconv(inp, 5, (192, 160, 96))
    x = layers.Dropout(0.5)(layers.MaxPooling2D(3, 2, "same")(x))  # 16x16
    x = mlpconv(x, 5, (192, 192, 192))
    x = layers.Dropout(0.5)(layers.AveragePooling2D(3, 2, "same")(x))  # 8x8
    x = layers.Conv2D(192, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(192, 1, activation="relu")(x)
    x = layers.Conv2D(10, 1)(x)  # a map per class
    return inp, layers.GlobalAveragePooling2D()(x)


def _res2net():
    """(inputs, logits) of a Res2Net-like net on 64x64x3."""
    import keras
    from keras import layers

    def bn_relu(x, relu=True):
        x = layers.BatchNormalization()(x)
        return layers.ReLU()(x) if relu else x

    def block(x, width, out, strides):
        h = bn_relu(layers.Conv2D(4 * width, 1, use_bias=False)(x))
        parts = layers.Lambda(
            lambda t: [t[..., i * width : (i + 1) * width] for i in range(4)]
        )(h)
        ys, prev = [], None
        for i, part in enumerate(parts):
            if i == 0:
                y = (
                    part
                    if strides == 1
                    else layers.AveragePooling2D(3, strides, "same")(part)
                )
            else:
                z = (
                    part
                    if prev is None or strides > 1
                    else layers.Add()([part, prev])
                )
                y = bn_relu(
                    layers.Conv2D(width, 3, strides, "same", use_bias=False)(z)
                )
                prev = y
            ys.append(y)
        h = layers.Concatenate()(ys)
        h = bn_relu(layers.Conv2D(out, 1, use_bias=False)(h), relu=False)
        if strides > 1 or x.shape[-1] != out:
            x = bn_relu(
                layers.Conv2D(out, 1, strides, use_bias=False)(x), relu=False
            )
        return layers.ReLU()(layers.Add()([x, h]))

    inp = keras.Input((64, 64, 3))
    x = bn_relu(layers.Conv2D(32, 3, 1, "same", use_bias=False)(inp))
    x = layers.MaxPooling2D(2)(x)  # 32x32
    for width, out, strides in (
        (16, 128, 1),
        (16, 128, 1),
        (32, 256, 2),  # 16x16
        (32, 256, 1),
        (64, 512, 2),  # 8x8
        (64, 512, 1),
    ):
        x = block(x, width, out, strides)
    x = layers.GlobalAveragePooling2D()(x)
    return inp, layers.Activation("linear", dtype="float32")(
        layers.Dense(10)(x)
    )


def _linear_transformer():
    """(inputs, logits) of a linear-attention transformer classifier
    over 512 tokens."""
    import keras
    from keras import layers

    linear_attention, *_ = _layers()
    inp = keras.Input((512,), dtype="int32")
    x = layers.Embedding(VOCAB, 256)(inp)
    x = x + layers.Embedding(512, 256)(keras.ops.arange(512))
    for _ in range(4):
        h = layers.LayerNormalization(epsilon=1e-6)(x)
        x = layers.Add()([x, linear_attention(8, 256)(h)])
        h = layers.LayerNormalization(epsilon=1e-6)(x)
        h = layers.Dense(1024, activation="gelu")(h)
        x = layers.Add()([x, layers.Dense(256)(layers.Dropout(0.1)(h))])
    x = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(x))
    return inp, layers.Dense(10)(x)


def _indrnn():
    """(inputs, logits) of a three-layer IndRNN classifier over 100
    steps of 16 features."""
    import keras
    from keras import layers

    _, ind_cell, *_ = _layers()
    inp = keras.Input((100, 16))
    x = inp
    for i in range(3):
        x = layers.RNN(ind_cell(256), return_sequences=i < 2)(x)
        x = layers.BatchNormalization()(x)
    return inp, layers.Dense(10)(x)


def _fibinet():
    """(inputs, logits) of FiBiNET on 13 numeric features and 16
    categorical fields."""
    import keras
    from keras import layers

    _, _, bilinear, senet, _ = _layers()
    numeric = keras.Input((13,), name="numeric")
    fields = keras.Input((16,), dtype="int32", name="categorical")
    v = layers.Embedding(VOCAB, 16)(fields)  # (16, 16)
    reweighted = senet()(v)
    p = layers.Flatten()(bilinear()(v))  # 120 pairs x 16
    q = layers.Flatten()(bilinear()(reweighted))
    x = layers.Concatenate()([p, q, numeric])  # 3853
    for _ in range(3):
        x = layers.Dense(400, activation="relu")(x)
    return [numeric, fields], layers.Dense(2)(x)


def _flownet_s():
    """(inputs, flow) of a FlowNetSimple-like net on two stacked 64x64
    RGB frames."""
    import keras
    from keras import layers

    def conv(x, filters, size, strides=1):
        x = layers.Conv2D(filters, size, strides, "same")(x)
        return layers.LeakyReLU(0.1)(x)

    def deconv(x, filters):
        x = layers.Conv2DTranspose(filters, 4, 2, "same")(x)
        return layers.LeakyReLU(0.1)(x)

    inp = keras.Input((64, 64, 6))
    c1 = conv(inp, 64, 7, 2)  # 32x32
    c2 = conv(c1, 128, 5, 2)  # 16x16
    c3 = conv(conv(c2, 256, 5, 2), 256, 3)  # 8x8
    c4 = conv(conv(c3, 512, 3, 2), 512, 3)  # 4x4
    flow = layers.Conv2D(2, 3, padding="same")(c4)
    x = c4
    for skip, filters in ((c3, 256), (c2, 128), (c1, 64)):  # refinement
        up_flow = layers.Conv2DTranspose(2, 4, 2, "same")(flow)
        x = layers.Concatenate()([deconv(x, filters), skip, up_flow])
        flow = layers.Conv2D(2, 3, padding="same")(x)
    flow = layers.UpSampling2D(2, interpolation="bilinear")(flow)  # 64x64
    return inp, flow


def _gin():
    """(inputs, logits) of a graph isomorphism network on 64 nodes."""
    import keras
    from keras import layers

    *_, gin_aggregate = _layers()
    nodes = keras.Input((64, 32), name="nodes")
    adjacency = keras.Input((64, 64), name="adjacency")
    x = nodes
    readouts = [layers.GlobalAveragePooling1D()(x)]
    for _ in range(5):
        x = gin_aggregate()(x, adjacency)
        x = layers.Dense(256)(x)
        x = layers.ReLU()(layers.BatchNormalization()(x))
        x = layers.Dense(256, activation="relu")(x)
        readouts.append(layers.GlobalAveragePooling1D()(x))
    x = layers.Concatenate()(readouts)
    x = layers.Dropout(0.5)(layers.Dense(256, activation="relu")(x))
    return [nodes, adjacency], layers.Dense(10)(x)


def build_heldout14(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "nin":
        inp, logits = _nin()
        return inp, logits, True
    if name == "res2net_mini":
        inp, logits = _res2net()
        return inp, logits, True
    if name == "gpt_neox_tiny":
        import keras_hub

        backbone = keras_hub.models.GPTNeoXBackbone(
            vocabulary_size=VOCAB * 4,
            num_layers=4,
            num_heads=4,
            hidden_dim=256,
            intermediate_dim=1024,
            max_sequence_length=128,
        )
        inputs = {
            kind: keras.Input((128,), dtype="int32", name=kind)
            for kind in ("token_ids", "padding_mask")
        }
        h = backbone(inputs)
        # the language-model head: next-token logits at every token
        logits = layers.Dense(VOCAB * 4)(h)
        logits = layers.Activation("linear", dtype="float32")(logits)
        return inputs, logits, True
    if name == "linear_transformer":
        inp, logits = _linear_transformer()
        return inp, logits, True
    if name == "indrnn":
        inp, logits = _indrnn()
        return inp, logits, True
    if name == "fibinet":
        inputs, logits = _fibinet()
        return inputs, logits, True
    if name == "flownet_s":
        inp, flow = _flownet_s()
        return inp, flow, False
    if name == "gin":
        inputs, logits = _gin()
        return inputs, logits, True
    raise ValueError(name)
