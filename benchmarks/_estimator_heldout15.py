"""The estimator's fifteenth held-out set (issue #23).

The first fourteen held-out sets (`_estimator_heldout.py` to
`_estimator_heldout14.py`) have each been seen, so none judges the rules
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
xDeepFM, an EDSR-like super-resolution net, keras-io's ConvMixer), the
thirteenth (a PSPNet-like net, a GhostNet-like net, LeNet-5,
keras-hub's OPT, a masked autoencoder, an ELMo-like biLSTM language
model, SASRec, MMoE) and the fourteenth (Network in Network, a
Res2Net-like net, keras-hub's GPT-NeoX, a linear-attention transformer,
IndRNN, FiBiNET, a FlowNetSimple-like net, GIN). It was fixed in this
file and committed before any case was measured; its batch sizes come
from the models' arithmetic (weights, layer outputs per sample), not
from the estimate. Its cases are measured without an estimate; the set
is estimated once (`--heldout15 --reestimate`) after the estimator's
rules are final. The families were chosen for kind and for a first step
that is fast on a CPU, not for what the estimator might get right or
wrong. Why each family is new:

- `sknet_mini`: an SKNet-like net (Li et al. 2019) on 64x64x3: a 3x3
  stem (32, BatchNormalization, ReLU), 2x2 max pooling to 32x32, five
  bottlenecks (a 1x1 convolution to w channels; two branches, a 3x3
  convolution and a 5x5 field as two 3x3 convolutions, the second of
  stride 2 where the block downsamples; their sum pooled, a dense
  squeeze, one dense layer per branch, a softmax across the two
  branches per channel, the branches weighted and summed; a 1x1
  convolution, a projection shortcut where the shape changes) of 128,
  128, 256, 256 and 512 channels, global pooling and a 10-way head.
  Inception's, ResNeXt's and Res2Net's branches are concatenated or
  summed as they are; no set weights branches of different receptive
  fields by an attention over the branches (selective kernels).
- `cbam_resnet`: a ResNet-18-like net with CBAM (Woo et al. 2018) on
  64x64x3: a 3x3 stem of 64, max pooling to 32x32, five basic blocks
  (64, 64, 128 at stride 2, 128, 256 at stride 2), each block's output
  reweighted by a channel attention (a shared two-layer MLP on its
  average and max pooled vectors, summed, sigmoid) and then a spatial
  attention (the channels' mean and max at each pixel, a 7x7 sigmoid
  convolution), global pooling and a 10-way head. MobileNetV3 and the
  EfficientNets have squeeze-excitation from average pooling alone; no
  set has CBAM's max-pooled channel branch nor a spatial attention map.
- `phi3_tiny`: keras-hub's `Phi3Backbone` from a tiny config (no
  download: 4 layers, 8 query and 8 key-value heads, 256 wide, 1024 in
  the MLP, a 4000-token vocabulary, 128 positions) over 128 tokens with
  a padding mask, and a dense language-model head to the 4000 tokens
  at every token (float32 logits). GPT-2, BLOOM, Falcon, Gemma, Llama,
  Mixtral, OPT and GPT-NeoX are other decoders; no set has Phi-3 (its
  own decoder layer with fused query-key-value and gate-up projections,
  RMS normalisation and its rotary embedding).
- `set_transformer`: a Set Transformer (Lee et al. 2019) classifying
  sets of 256 points of 3 features: a dense embedding to 256, two
  induced set attention blocks (32 learned inducing points attend to
  the set, the set attends to their result; each a 4-head attention,
  residual, LayerNormalization and a dense ReLU feed-forward layer),
  pooling by multihead attention with one learned seed, and a 10-way
  head. PointNet pools points by a max, the Perceiver cross-attends a
  fixed latent array once per layer; no set has inducing points that
  summarise a set and are read back by it, nor attention pooling by a
  seed.
- `qrnn`: a QRNN language model (Bradbury et al. 2017) over 128 tokens:
  a 256-wide embedding, three layers of a causal width-2 1-D
  convolution to 3 x 512 (candidate tanh, forget and output gates
  sigmoid) and fo-pooling (c = f * c + (1 - f) * z, h = o * c; a custom
  cell in `keras.layers.RNN`) with dropout, and a 1000-word head at
  each token. The LSTMs, GRUs, the Elman RNN and IndRNN compute their
  gates from the previous state inside the recurrence; no set computes
  every gate by a convolution ahead of a gate-only recurrence.
- `caser`: Caser (Tang and Wang 2018), next-item logits over a
  1000-item catalogue from a user id and the last 16 items: 64-wide item
  embeddings as a 16 x 64 image, horizontal convolutions (16 filters of
  each height 1 to 8, full width, ReLU, max-pooled over time) and a
  vertical convolution (4 filters over the 16 steps), concatenated, a
  dense 64 (ReLU) with dropout, concatenated with a 64-wide user
  embedding, and a 1000-way head. GRU4Rec, SASRec and DIN read a
  history by a recurrence, self-attention or target attention; no set
  convolves over a history's embeddings as an image.
- `context_encoder`: a context encoder (Pathak et al. 2016) on 64x64x3:
  an encoder of four stride-2 4x4 convolutions (64, 128, 256, 512,
  BatchNormalization, LeakyReLU 0.2) to 4x4, a channel-wise fully
  connected layer (each of the 512 channels' 16 values mapped by its
  own 16 x 16 matrix) with dropout, a 1x1 convolution, a decoder of four
  stride-2 transposed convolutions (256, 128, 64, BatchNormalization,
  ReLU; 3 with tanh) back to a 64x64x3 image, MSE. The convolutional
  autoencoder, the VAE and the masked autoencoder pass a dense or
  convolutional bottleneck; no set has a channel-wise fully connected
  bottleneck.
- `snn_mlp`: a self-normalizing network (Klambauer et al. 2017) on 784
  features: eight dense layers of 768 with SELU and LeCun-normal
  initialisation, each followed by AlphaDropout (0.05), and a 10-way
  head. The MLPs of the design set and the sets use ReLU or GELU with
  Dropout or BatchNormalization; no set has SELU nor AlphaDropout.

Variants: `base` (Adam) at two batch sizes, and at the larger one one
of `adamw` (AdamW, on `set_transformer`), `sgd_momentum` (SGD, momentum
0.9, on `caser`), `accumulation=4` (Adam, on `qrnn` and `snn_mlp`),
`checkpointing=auto` (Adam, on `sknet_mini`, `cbam_resnet` and
`context_encoder`) and `mixed_bfloat16` (Adam, on `phi3_tiny`); 24
cases. Rough arithmetic behind the batch sizes (float32; weights from
`count_params()`, "outputs" the sum of the Keras layers' outputs per
sample, a backbone counted as one layer, plus a hand count where given;
Adam keeps 4 words per weight with the gradient): sknet_mini 1.11M
weights (17 MiB with Adam), outputs 15.5 MiB per sample (at 32x32 the
blocks' 32-channel branches and 128-channel maps with their
BatchNormalization and ReLU); cbam_resnet 1.63M weights (25 MiB),
outputs 11.0 MiB per sample (the 32x32x64 maps, 256 KiB, many times
with BatchNormalization, ReLU and the attentions' products);
phi3_tiny 7.27M weights (111 MiB: the token embedding and the head
1.02M each), layer outputs 3.9 MiB per sample with the backbone as one
(the 128 x 4000 logits, 2 MiB, twice with the Activation), about 14 MiB
by hand as for set 14's GPT-NeoX of the same width (per layer the 8 x
128 x 128 scores, 512 KiB, a few times, the MLP's 128 x 1024 maps);
set_transformer 1.67M weights (25 MiB), outputs 0.88 MiB per sample,
about 1.5 MiB by hand with the attentions' 4 x 32 x 256 scores (128
KiB) in each induced block; qrnn 4.71M weights (72 MiB), outputs 9.5
MiB per sample (per layer the 128 x 1536 convolution, 768 KiB, with its
split and activations, and the 128 x 512 states; the 128 x 1000
logits, 500 KiB); caser 0.32M weights (5 MiB), outputs 0.02 MiB per
sample (the 1000 logits, 4 KiB, and the convolutions' maps);
context_encoder 5.92M weights (90 MiB: the channel-wise layer 0.13M, the 4x4
convolutions of 512 2.1M), outputs 2.9 MiB per sample (the 32x32x64
maps, 256 KiB, three times in each half, and the 64x64x3 output);
snn_mlp 4.74M weights (72 MiB), outputs 0.05 MiB per sample (eight 768
activations and their dropout). Weights with Adam plus outputs (by hand
where given) times the larger batch: sknet_mini about 265 MiB at 16,
cbam_resnet 377 at 32, phi3_tiny 335 at 16, set_transformer 217 at
128, qrnn 376 at 32, caser 87 at 4096, context_encoder 183 at 32,
snn_mlp 264 at 4096; set 10's docstring found such a sum 1.3 to 5.3
times the measured peak for the ninth set's models, so these peaks
should fall between about 30 and 400 MiB, and at the smaller batch
lower. A 2-step smoke run of every case at a batch of 4 (64 for caser
and snn_mlp), without reading memory, took 1.5 to 12.4 s to build,
compile and run the first step on this CPU (sknet_mini the slowest,
9.7 to 12.4 s); a second step at that batch took 0.03 to 0.24 s.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT15 = {
    "sknet_mini": [
        ("base", 4),
        ("base", 16),
        ("checkpointing=auto", 16),
    ],
    "cbam_resnet": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "phi3_tiny": [
        ("base", 4),
        ("base", 16),
        ("mixed_bfloat16", 16),
    ],
    "set_transformer": [
        ("base", 32),
        ("base", 128),
        ("adamw", 128),
    ],
    "qrnn": [
        ("base", 8),
        ("base", 32),
        ("accumulation=4", 32),
    ],
    "caser": [
        ("base", 1024),
        ("base", 4096),
        ("sgd_momentum", 4096),
    ],
    "context_encoder": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "snn_mlp": [
        ("base", 1024),
        ("base", 4096),
        ("accumulation=4", 4096),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data).
VOCAB = 1000


def _layers():
    """The custom layers of the set: the selective-kernel fusion, CBAM's
    spatial attention, the Set Transformer's attention blocks, the QRNN's
    fo-pooling cell, Caser's convolutions and the channel-wise fully
    connected layer."""
    from keras import layers
    from keras import ops

    class SKFuse(layers.Layer):
        """SKNet's fusion of two branches (Li et al. 2019): their sum
        pooled, a dense squeeze, one dense per branch, a softmax across
        the branches, the branches weighted and summed."""

        def __init__(self, channels, reduced, **kwargs):
            super().__init__(**kwargs)
            self.squeeze = layers.Dense(reduced, activation="relu")
            self.select = [layers.Dense(channels) for _ in range(2)]

        def build(self, shapes):
            c = shapes[0][-1]
            self.squeeze.build((None, c))
            for d in self.select:
                d.build((None, self.squeeze.units))

        def call(self, branches):
            a, b = branches
            s = self.squeeze(ops.mean(a + b, axis=(1, 2)))
            w = ops.softmax(
                ops.stack([d(s) for d in self.select], axis=1), axis=1
            )  # (batch, 2, channels)
            w = w[:, :, None, None, :]
            return w[:, 0] * a + w[:, 1] * b

    class SpatialAttention(layers.Layer):
        """CBAM's spatial attention (Woo et al. 2018): the channels' mean
        and max at each pixel, a 7x7 convolution to one sigmoid map, the
        features multiplied by it."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.conv = layers.Conv2D(
                1, 7, padding="same", activation="sigmoid"
            )

        def build(self, shape):
            self.conv.build(shape[:-1] + (2,))

        def call(self, x):
            pooled = ops.concatenate(
                [
                    ops.mean(x, axis=-1, keepdims=True),
                    ops.max(x, axis=-1, keepdims=True),
                ],
                axis=-1,
            )
            return x * self.conv(pooled)

    class MAB(layers.Layer):
        """The Set Transformer's multihead attention block (Lee et al.
        2019): H = LN(X + MHA(X, Y)), out = LN(H + rFF(H))."""

        def __init__(self, width, heads, **kwargs):
            super().__init__(**kwargs)
            self.att = layers.MultiHeadAttention(heads, width // heads)
            self.ff = layers.Dense(width, activation="relu")
            self.ln1 = layers.LayerNormalization()
            self.ln2 = layers.LayerNormalization()

        def call(self, x, y):
            h = self.ln1(x + self.att(x, y))
            return self.ln2(h + self.ff(h))

    class Seeds(layers.Layer):
        """`count` learned vectors (inducing points or PMA seeds), tiled
        over the batch."""

        def __init__(self, count, width, **kwargs):
            super().__init__(**kwargs)
            self.count = count
            self.width = width

        def build(self, shape):
            self.seeds = self.add_weight(
                shape=(self.count, self.width), initializer="glorot_uniform"
            )

        def call(self, x):
            return ops.broadcast_to(
                self.seeds[None], (ops.shape(x)[0], self.count, self.width)
            )

    class FoPoolCell(layers.Layer):
        """The QRNN's fo-pooling (Bradbury et al. 2017): from the
        convolution's candidate z, forget gate f and output gate o,
        c = f * c + (1 - f) * z, h = o * c; element-wise."""

        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.state_size = units
            self.output_size = units

        def call(self, x, states):
            c = states[0] if isinstance(states, (list, tuple)) else states
            z, f, o = ops.split(x, 3, axis=-1)
            c = f * c + (1.0 - f) * z
            return o * c, [c]

    class ChannelWiseDense(layers.Layer):
        """The context encoder's channel-wise fully connected layer
        (Pathak et al. 2016): each channel's h*w map mapped to h*w by its
        own matrix, no mixing across channels."""

        def build(self, shape):
            _, h, w, c = shape
            self.w = self.add_weight(
                shape=(c, h * w, h * w), initializer="glorot_uniform"
            )
            self.b = self.add_weight(shape=(c, h * w), initializer="zeros")

        def call(self, x):
            _, h, w, c = x.shape
            t = ops.transpose(ops.reshape(x, (-1, h * w, c)), (0, 2, 1))
            t = ops.einsum("bcp,cpq->bcq", t, self.w) + self.b
            return ops.reshape(ops.transpose(t, (0, 2, 1)), (-1, h, w, c))

    return SKFuse, SpatialAttention, MAB, Seeds, FoPoolCell, ChannelWiseDense


def _sknet():
    """(inputs, logits) of an SKNet-like net on 64x64x3."""
    import keras
    from keras import layers

    sk_fuse, *_ = _layers()

    def bn_relu(x, relu=True):
        x = layers.BatchNormalization()(x)
        return layers.ReLU()(x) if relu else x

    def block(x, width, out, strides):
        h = bn_relu(layers.Conv2D(width, 1, use_bias=False)(x))
        a = bn_relu(layers.Conv2D(width, 3, strides, "same", use_bias=False)(h))
        b = bn_relu(
            layers.Conv2D(width, 3, strides, "same", use_bias=False)(
                layers.Conv2D(width, 3, 1, "same", use_bias=False)(h)
            )
        )  # a 5x5 field as two 3x3 convolutions
        h = sk_fuse(width, max(32, width // 4))([a, b])
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
        (32, 128, 1),
        (32, 128, 1),
        (64, 256, 2),  # 16x16
        (64, 256, 1),
        (128, 512, 2),  # 8x8
    ):
        x = block(x, width, out, strides)
    x = layers.GlobalAveragePooling2D()(x)
    return inp, layers.Dense(10)(x)


def _cbam_resnet():
    """(inputs, logits) of a ResNet-18-like net with CBAM on 64x64x3."""
    import keras
    from keras import layers

    _, spatial_attention, *_ = _layers()

    def bn(x, relu=True):
        x = layers.BatchNormalization()(x)
        return layers.ReLU()(x) if relu else x

    def cbam(x):
        c = x.shape[-1]
        mlp1 = layers.Dense(c // 8, activation="relu")
        mlp2 = layers.Dense(c)
        avg = mlp2(mlp1(layers.GlobalAveragePooling2D()(x)))
        mx = mlp2(mlp1(layers.GlobalMaxPooling2D()(x)))
        gate = layers.Activation("sigmoid")(layers.Add()([avg, mx]))
        x = layers.Multiply()([x, layers.Reshape((1, 1, c))(gate)])
        return spatial_attention()(x)

    def block(x, filters, strides):
        h = bn(layers.Conv2D(filters, 3, strides, "same", use_bias=False)(x))
        h = bn(layers.Conv2D(filters, 3, 1, "same", use_bias=False)(h), False)
        h = cbam(h)
        if strides > 1 or x.shape[-1] != filters:
            x = bn(layers.Conv2D(filters, 1, strides, use_bias=False)(x), False)
        return layers.ReLU()(layers.Add()([x, h]))

    inp = keras.Input((64, 64, 3))
    x = bn(layers.Conv2D(64, 3, 1, "same", use_bias=False)(inp))
    x = layers.MaxPooling2D(2)(x)  # 32x32
    for filters, strides in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2)):
        x = block(x, filters, strides)
    x = layers.GlobalAveragePooling2D()(x)
    return inp, layers.Dense(10)(x)


def _set_transformer():
    """(inputs, logits) of a Set Transformer classifying sets of 256
    points of 3 features."""
    import keras
    from keras import layers

    _, _, mab, seeds, *_ = _layers()
    width = 256
    inp = keras.Input((256, 3))
    x = layers.Dense(width)(inp)
    for _ in range(2):  # ISAB with 32 inducing points
        i = seeds(32, width)(x)
        h = mab(width, 4)(i, x)
        x = mab(width, 4)(x, h)
    s = seeds(1, width)(x)  # PMA with one seed
    x = mab(width, 4)(s, x)
    x = layers.Flatten()(x)
    return inp, layers.Dense(10)(x)


def _qrnn():
    """(inputs, logits) of a QRNN language model over 128 tokens."""
    import keras
    from keras import layers

    *_, fo_pool, _ = _layers()
    inp = keras.Input((128,), dtype="int32")
    x = layers.Embedding(VOCAB, 256)(inp)
    for _ in range(3):
        g = layers.ZeroPadding1D((1, 0))(x)  # causal, width 2
        g = layers.Conv1D(3 * 512, 2)(g)
        z, f, o = keras.ops.split(g, 3, axis=-1)
        g = layers.Concatenate()(
            [
                layers.Activation("tanh")(z),
                layers.Activation("sigmoid")(f),
                layers.Activation("sigmoid")(o),
            ]
        )
        x = layers.RNN(fo_pool(512), return_sequences=True)(g)
        x = layers.Dropout(0.2)(x)
    return inp, layers.Dense(VOCAB)(x)


def _caser():
    """(inputs, logits) of Caser over the last 16 items."""
    import keras
    from keras import layers

    items = keras.Input((16,), dtype="int32", name="items")
    user = keras.Input((1,), dtype="int32", name="user")
    e = layers.Embedding(VOCAB, 64)(items)  # (16, 64)
    img = layers.Reshape((16, 64, 1))(e)
    horizontal = []
    for h in range(1, 9):  # 16 filters of each height, full width
        c = layers.Conv2D(16, (h, 64), activation="relu")(img)
        horizontal.append(
            layers.Flatten()(layers.MaxPooling2D((16 - h + 1, 1))(c))
        )
    vertical = layers.Flatten()(layers.Conv2D(4, (16, 1))(img))  # 4 x 64
    x = layers.Concatenate()(horizontal + [vertical])
    x = layers.Dropout(0.5)(layers.Dense(64, activation="relu")(x))
    u = layers.Flatten()(layers.Embedding(VOCAB, 64)(user))
    x = layers.Concatenate()([x, u])
    return [items, user], layers.Dense(VOCAB)(x)


def _context_encoder():
    """(inputs, image) of a context encoder on 64x64x3."""
    import keras
    from keras import layers

    *_, channel_wise = _layers()

    def down(x, filters):
        x = layers.Conv2D(filters, 4, 2, "same")(x)
        return layers.LeakyReLU(0.2)(layers.BatchNormalization()(x))

    def up(x, filters):
        x = layers.Conv2DTranspose(filters, 4, 2, "same")(x)
        return layers.ReLU()(layers.BatchNormalization()(x))

    inp = keras.Input((64, 64, 3))
    x = inp
    for filters in (64, 128, 256, 512):  # 32, 16, 8, 4
        x = down(x, filters)
    x = layers.Dropout(0.5)(channel_wise()(x))
    x = layers.Conv2D(512, 1)(x)  # mixes the channels
    for filters in (256, 128, 64):  # 8, 16, 32
        x = up(x, filters)
    x = layers.Conv2DTranspose(3, 4, 2, "same", activation="tanh")(x)
    return inp, x


def _snn_mlp():
    """(inputs, logits) of a self-normalizing network on 784 features."""
    import keras
    from keras import layers

    inp = keras.Input((784,))
    x = inp
    for _ in range(8):
        x = layers.Dense(
            768, activation="selu", kernel_initializer="lecun_normal"
        )(x)
        x = layers.AlphaDropout(0.05)(x)
    return inp, layers.Dense(10)(x)


def build_heldout15(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "sknet_mini":
        inp, logits = _sknet()
        return inp, logits, True
    if name == "cbam_resnet":
        inp, logits = _cbam_resnet()
        return inp, logits, True
    if name == "phi3_tiny":
        import keras_hub

        backbone = keras_hub.models.Phi3Backbone(
            vocabulary_size=VOCAB * 4,
            num_layers=4,
            hidden_dim=256,
            intermediate_dim=1024,
            num_query_heads=8,
            num_key_value_heads=8,
            max_sequence_length=128,
            pretraining_sequence_length=128,
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
    if name == "set_transformer":
        inp, logits = _set_transformer()
        return inp, logits, True
    if name == "qrnn":
        inp, logits = _qrnn()
        return inp, logits, True
    if name == "caser":
        inputs, logits = _caser()
        return inputs, logits, True
    if name == "context_encoder":
        inp, image = _context_encoder()
        return inp, image, False
    if name == "snn_mlp":
        inp, logits = _snn_mlp()
        return inp, logits, True
    raise ValueError(name)
