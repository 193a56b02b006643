"""The estimator's seventeenth held-out set (issue #23).

The first sixteen held-out sets (`_estimator_heldout.py` to
`_estimator_heldout16.py`) have each been seen or measured, so none
judges the rules unseen any more. This set is their successor: model
families in none of the design set (`MODELS` in
`estimator_accuracy.py`: MLPs, a BatchNorm CNN, MobileNetV2, ResNet50,
EfficientNetB0, self-attention transformer blocks on dense inputs, a
one-way LSTM classifier, an embedding classifier, keras-io's text
transformer and ViT), the first held-out set (a bidirectional GRU, a
1-D conv net, a U-Net-like net, DenseNet121, MobileNetV3Small,
keras-hub's GPT-2, a wide-and-deep MLP, a convolutional autoencoder),
the second (an LSTM encoder-decoder, a two-tower retrieval model, a
3-D conv net, an MLP-Mixer, a ResNeXt-like net, keras-hub's T5, FNet
and Mixtral), the third (a WaveNet-like net, a CRNN, an Xception-like
net, a VAE, a graph conv net, PointNet, keras-hub's ALBERT and
DeBERTa-v3), the fourth (a patch transformer, a siamese net, a
Conformer, stacked LSTMs, EfficientNetV2B0, keras-hub's Whisper and
Gemma), the fifth (a TCN, a Perceiver, VGG16, ESPCN, DCN, a GRU
encoder-decoder with attention, ConvLSTM, keras-hub's Falcon), the
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
model, SASRec, MMoE), the fourteenth (Network in Network, a
Res2Net-like net, keras-hub's GPT-NeoX, a linear-attention transformer,
IndRNN, FiBiNET, a FlowNetSimple-like net, GIN), the fifteenth (an
SKNet-like net, a CBAM ResNet, keras-hub's Phi-3, a Set Transformer, a
QRNN, Caser, a context encoder, a self-normalizing MLP) and the
sixteenth (keras-hub's CSPNet / CSPDarkNet, an FCN-8s-like net,
keras-hub's Qwen2, a Funnel-Transformer-like classifier, a Mamba-like
language model, a NODE-like net, a DDPM-like U-Net, FastKAN). It was
fixed in this file and committed before any case was measured; its
batch sizes come from the models' arithmetic (weights, layer outputs
per sample, a hand count of what the layers hold inside), not from the
estimate. Its cases are measured without an estimate; the set is
estimated once (`--heldout17 --reestimate`) after the estimator's
rules are final. The families were chosen for kind and for a first
step that is fast on a CPU, not for what the estimator might get right
or wrong. Why each family is new:

- `linknet`: a LinkNet-like segmentation net (Chaurasia and Culurciello
  2017) on 128x128x3 with 12 classes: a 7x7 stride-2 stem of 32 with
  BatchNormalization and ReLU, a 3x3 stride-2 max pool, four
  ResNet-18-style encoder stages (two basic residual blocks each, the
  first of stride 2) of 32, 64, 128 and 256 channels at 16x16 to 2x2,
  four decoder blocks (a 1x1 convolution to a quarter of the channels,
  a 3x3 stride-2 transposed convolution, a 1x1 convolution to the
  stage's channels, each with BatchNormalization and ReLU) whose
  output is added to the encoder's feature map of that size, and two
  transposed convolutions to per-pixel logits at 128x128 (a sparse
  label per pixel). The U-Net concatenates skips; FCN-8s adds
  upsampled class scores; the FPN, PSPNet and DeepLabV3+ resize; no set
  adds bottlenecked, transposed-convolution decoder blocks to a
  residual encoder's feature maps.
- `mcnn_density`: a multi-column CNN for crowd counting (Zhang et al.
  2016) on 128x128x1: three columns of four ReLU convolutions with
  large, middle and small kernels (9, 7, 7, 7 with 16, 32, 16, 8
  filters; 7, 5, 5, 5 with 20, 40, 20, 10; 5, 3, 3, 3 with 24, 48, 24,
  12), max-pooled twice, concatenated and fused by a 1x1 convolution to
  a 32x32x1 density map (MSE). Inception, Res2Net and SKNet mix kernel
  sizes inside a block of one network; no set runs whole parallel
  columns of different receptive fields end to end and regresses a
  density map.
- `mistral_tiny`: keras-hub's `MistralBackbone` from a tiny config (no
  download: 4 layers, 8 query and 2 key-value heads, 256 wide, 768 in
  the MLP, a sliding window of 64 tokens, a 4000-token vocabulary) over
  128 tokens with a padding mask, and a dense language-model head to
  the 4000 tokens at every token (float32 logits). The other decoders
  (GPT-2, BLOOM, Falcon, Gemma, Llama, Mixtral, OPT, GPT-NeoX, Phi-3,
  Qwen2) are other keras-hub layers; no set has Mistral's decoder with
  its sliding-window attention mask.
- `roberta_tiny`: keras-hub's `RobertaBackbone` from a tiny config (no
  download: 4 layers, 4 heads, 256 wide, 1024 in the feed-forward
  layer, dropout 0.1, a 4000-token vocabulary) over 256 tokens with a
  padding mask, and RoBERTa's classification head on the first token
  (a tanh dense layer of 256, dropout, 10 logits). The keras-hub
  encoders of the sets are ALBERT, DeBERTa-v3, DistilBERT, ELECTRA,
  XLNet and the encoders inside T5, BART and Whisper; no set has
  RoBERTa's backbone (a learned token and position embedding and no
  segment embedding, post-norm BERT-style layers) nor its head.
- `lstnet`: an LSTNet-like multivariate forecaster (Lai et al. 2018) on
  a window of 168 steps of 32 series: a Conv1D of 64 (kernel 6, ReLU)
  with dropout, a GRU of 64 over the 163 convolved steps, a skip GRU of
  32 over the last 6 periods of 24 steps (each of the 24 phases one
  sequence of 6 steps, folded into the batch), their concatenation to
  the 32 next values, plus an autoregressive linear model of each
  series' last 24 values (MSE). The TCN, N-BEATS and the transformer
  forecaster are convolutional, fully connected or attention models,
  the recurrent nets of the sets run over tokens or frames; no set
  folds a recurrence's period into the batch (a skip RNN) or adds an
  autoregressive highway.
- `ipnn`: an inner-product-based neural network (PNN, Qu et al. 2016)
  on 26 categorical fields: a 32-wide embedding per field (26 x 1000
  rows), the 325 pairwise inner products of the field embeddings
  (gathered from the 26 x 26 product matrix) and the flattened
  embeddings each projected to 400 and summed, ReLU, three dense layers
  of 400 with dropout and 2 logits. DeepFM sums the pairwise products
  (FM), FiBiNET uses bilinear interactions, DCN, xDeepFM and AutoInt
  crosses, compressed interactions and attention; no set feeds every
  pairwise inner product as a feature of its own to the MLP.
- `dgcnn`: a DGCNN (Wang et al. 2019) on 256 points of 3 coordinates
  with 40 classes: three EdgeConv layers (for each point its 16 nearest
  neighbours in the current feature space, by pairwise squared
  distances and `top_k`, the edge features [x_i, x_j - x_i] through a
  dense layer of 64, 64 and 128, BatchNormalization and leaky ReLU,
  max over the neighbours), their concatenation to 512, global max
  pooling and a dense head. PointNet treats points independently,
  the graph nets (GCN, GAT, GIN) take a fixed adjacency; no set
  rebuilds a k-nearest-neighbour graph from the features in every
  layer.
- `highway_mlp`: a highway network (Srivastava et al. 2015) on 784
  features: a dense layer of 512 and ten highway layers of 512 (a ReLU
  transform H and a sigmoid gate T with bias -2, y = T H + (1 - T) x)
  and 10 logits. The MLPs of the sets are plain, residual,
  self-normalizing or gated by the input (gMLP's spatial gate); no set
  mixes each layer's transform and its input by a learned gate.

Variants: `base` (Adam) at two batch sizes, and at the larger one one
of `adamw` (AdamW, on `roberta_tiny`), `sgd_momentum` (SGD, momentum
0.9, on `ipnn`), `accumulation=4` (Adam, on `lstnet` and
`highway_mlp`), `checkpointing=auto` (Adam, on `linknet`,
`mcnn_density` and `dgcnn`) and `mixed_bfloat16` (Adam, on
`mistral_tiny`); 24 cases. Rough arithmetic behind the batch sizes
(float32; weights from `count_params()`, "outputs" the sum of the
Keras layers' outputs per sample, a keras-hub backbone counted as one
layer, plus a hand count where given; Adam keeps 4 words per weight
with the gradient): linknet 2.90M weights (44 MiB with Adam), outputs
5.9 MiB per sample (116 layers; the 64x64x32 stem's convolution,
BatchNormalization and ReLU, 512 KiB each, the 128x128x12 logits, 768
KiB), about 8 MiB by hand with the loss's softmax over the logits and
the transposed convolutions' inputs; mcnn_density 0.13M weights (2
MiB), outputs 7.6 MiB per sample (the first convolutions' 60 channels
at 128x128, 3.75 MiB, twice with their ReLU inside), about 13 MiB by
hand (with the second convolutions' 120 channels at 64x64, 1.9 MiB,
twice, and the pools); mistral_tiny 6.09M weights (93 MiB: the token
embedding and the head 1.02M each), outputs 3.9 MiB per sample with
the backbone as one (the 128 x 4000 logits, 2 MiB, twice with the
Activation), about 19 MiB by hand (per layer the 8 x 128 x 128
scores, 512 KiB, a few times with the mask and softmax, the MLP's 128
x 768 maps, 384 KiB, about four times, the projections and rotary
products: about 3.5 MiB a layer, and the logits with the loss's
softmax); roberta_tiny 4.32M weights (66 MiB), outputs 0.0 MiB per
sample with the backbone as one, about 38 MiB by hand (per layer the
4 x 256 x 256 scores, 1 MiB, with softmax and dropout about 4 MiB, the
256 x 1024 feed-forward maps, 1 MiB, about three times, and the 256 x
256 projections, 256 KiB, about ten times: about 9.5 MiB a layer);
lstnet 0.07M weights (1 MiB), outputs 0.10 MiB per sample, about 0.5
MiB by hand (the GRU keeps its gates and state at each of the 163
steps, about 8 x 64 words a step, 326 KiB, and the convolution's 163
x 64 maps, 41 KiB, three times); ipnn 1.78M weights (27 MiB), outputs
0.02 MiB per sample, about 25 KiB by hand (the 26 x 32 embeddings,
3.3 KiB, the 26 x 26 products, 2.7 KiB, and the 400-wide layers, 1.6
KiB each, about ten times); dgcnn 0.30M weights (5 MiB), outputs 17.9
MiB per sample (the 256 x 16 x 128 edge features of the second and
third EdgeConv, 2 MiB each, and their dense, BatchNormalization and
leaky ReLU outputs of 1, 1 and 2 MiB), about 27 MiB by hand with what
each edge layer holds inside (the 256 x 256 distances, 256 KiB, a few
times, and the neighbours, centres and differences, 1 MiB each, in
the second and third); highway_mlp 5.66M weights (86 MiB), outputs
0.10 MiB per sample, about 0.18 MiB by hand (per highway layer about
nine 512-wide maps, 2 KiB each, with the activations inside the dense
layers). Weights with Adam plus outputs (by hand where given) times
the larger batch: linknet about 300 MiB at 32, mcnn_density 315 at 24,
mistral_tiny 321 at 12, roberta_tiny 294 at 6, lstnet 257 at 512,
ipnn 227 at 8192, dgcnn 329 at 12, highway_mlp 266 at 1024; sets 15
and 16 each had one family 1.5 to 3 times over such sums, so these
peaks should mostly fall between about 30 and 450 MiB, and at the
smaller batch lower. A 2-step smoke run of every case at a batch of 4,
without reading memory and with no estimate, took 0.9 to 12.3 s to
build, compile and run the first step on this CPU (linknet the
slowest, 10.1 s and 12.3 s checkpointed); a second step at that batch
took 0.01 to 0.37 s.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT17 = {
    "linknet": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "mcnn_density": [
        ("base", 8),
        ("base", 24),
        ("checkpointing=auto", 24),
    ],
    "mistral_tiny": [
        ("base", 4),
        ("base", 12),
        ("mixed_bfloat16", 12),
    ],
    "roberta_tiny": [
        ("base", 2),
        ("base", 6),
        ("adamw", 6),
    ],
    "lstnet": [
        ("base", 128),
        ("base", 512),
        ("accumulation=4", 512),
    ],
    "ipnn": [
        ("base", 2048),
        ("base", 8192),
        ("sgd_momentum", 8192),
    ],
    "dgcnn": [
        ("base", 4),
        ("base", 12),
        ("checkpointing=auto", 12),
    ],
    "highway_mlp": [
        ("base", 256),
        ("base", 1024),
        ("accumulation=4", 1024),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data).
VOCAB = 1000


def _edge_features():
    """DGCNN's EdgeConv input (Wang et al. 2019) as a layer: for each
    point its k nearest neighbours in the current feature space (by the
    pairwise squared distance, `ops.top_k`), the edge features
    [x_i, x_j - x_i], (batch, points, k, 2 x channels)."""
    from keras import layers
    from keras import ops

    class EdgeFeatures(layers.Layer):
        def __init__(self, k, **kwargs):
            super().__init__(**kwargs)
            self.k = k

        def call(self, x):
            n, c = x.shape[1], x.shape[2]
            inner = ops.einsum("bnc,bmc->bnm", x, x)
            sq = ops.sum(x * x, axis=-1)
            dist = sq[:, :, None] - 2.0 * inner + sq[:, None, :]
            _, idx = ops.top_k(-dist, self.k)  # (batch, points, k)
            offsets = ops.arange(ops.shape(x)[0])[:, None, None] * n
            flat = ops.reshape(x, (-1, c))
            neighbours = ops.take(flat, idx + offsets, axis=0)
            centre = ops.repeat(x[:, :, None, :], self.k, axis=2)
            return ops.concatenate([centre, neighbours - centre], axis=-1)

        def compute_output_shape(self, shape):
            return (shape[0], shape[1], self.k, 2 * shape[2])

    return EdgeFeatures


def _linknet():
    """(inputs, per-pixel logits) of a LinkNet-like net on 128x128x3."""
    import keras
    from keras import layers

    def cbr(x, filters, kernel, strides=1):
        x = layers.Conv2D(filters, kernel, strides, "same", use_bias=False)(x)
        return layers.ReLU()(layers.BatchNormalization()(x))

    def encoder(x, filters):  # two residual basic blocks, the first /2
        for strides in (2, 1):
            h = cbr(x, filters, 3, strides)
            h = layers.BatchNormalization()(
                layers.Conv2D(filters, 3, padding="same", use_bias=False)(h)
            )
            if strides == 2 or x.shape[-1] != filters:
                x = layers.BatchNormalization()(
                    layers.Conv2D(filters, 1, strides, use_bias=False)(x)
                )
            x = layers.ReLU()(layers.Add()([x, h]))
        return x

    def decoder(x, filters):  # 1x1 to m/4, 3x3 transposed /2, 1x1 to n
        m = x.shape[-1]
        x = cbr(x, m // 4, 1)
        x = layers.Conv2DTranspose(m // 4, 3, 2, "same", use_bias=False)(x)
        x = layers.ReLU()(layers.BatchNormalization()(x))
        return cbr(x, filters, 1)

    inp = keras.Input((128, 128, 3))
    x = cbr(inp, 32, 7, 2)  # 64x64
    x = layers.MaxPooling2D(3, 2, "same")(x)  # 32x32
    skips = [x]
    for filters in (32, 64, 128, 256):  # 16, 8, 4, 2
        x = encoder(x, filters)
        skips.append(x)
    skips.pop()
    for filters in (128, 64, 32, 32):  # 4, 8, 16, 32; the skip added
        x = layers.Add()([decoder(x, filters), skips.pop()])
    x = layers.Conv2DTranspose(16, 3, 2, "same")(x)  # 64x64
    x = layers.ReLU()(layers.BatchNormalization()(x))
    x = cbr(x, 16, 3)
    return inp, layers.Conv2DTranspose(12, 2, 2)(x)  # 128x128x12


def _mcnn():
    """(inputs, density map) of a multi-column crowd-counting CNN on
    128x128x1."""
    import keras
    from keras import layers

    inp = keras.Input((128, 128, 1))
    columns = []
    for k, widths in (
        (9, (16, 32, 16, 8)),
        (7, (20, 40, 20, 10)),
        (5, (24, 48, 24, 12)),
    ):
        x = inp
        for i, filters in enumerate(widths):
            size = k if i == 0 else k - 2
            x = layers.Conv2D(filters, size, padding="same", activation="relu")(
                x
            )
            if i < 2:
                x = layers.MaxPooling2D(2)(x)  # 64, then 32
        columns.append(x)
    x = layers.Concatenate()(columns)
    return inp, layers.Conv2D(1, 1)(x)  # 32x32x1


def _lstnet():
    """(inputs, next values) of an LSTNet-like forecaster on a window of
    168 steps of 32 series."""
    import keras
    from keras import layers
    from keras import ops

    steps, series, period, skip_steps = 168, 32, 24, 6
    inp = keras.Input((steps, series))
    c = layers.Conv1D(64, 6, activation="relu")(inp)  # 163 steps
    c = layers.Dropout(0.2)(c)
    r = layers.GRU(64)(c)
    # the skip GRU: the last 6 x 24 steps, every 24th step in one sequence
    s = c[:, -skip_steps * period :]
    s = ops.reshape(s, (-1, skip_steps, period, 64))
    s = ops.reshape(ops.transpose(s, (0, 2, 1, 3)), (-1, skip_steps, 64))
    s = layers.GRU(32)(s)
    s = ops.reshape(s, (-1, period * 32))
    y = layers.Dense(series)(layers.Concatenate()([r, s]))
    # the autoregressive highway: a linear model of each series' last 24
    ar = ops.transpose(inp[:, -period:], (0, 2, 1))
    ar = ops.reshape(layers.Dense(1)(ar), (-1, series))
    return inp, layers.Add()([y, ar])


def _ipnn():
    """(inputs, logits) of an inner-product-based neural network on 26
    categorical fields."""
    import itertools

    import keras
    from keras import layers
    from keras import ops

    fields, dim = 26, 32
    inp = keras.Input((fields,), dtype="int32")
    ids = inp + ops.arange(fields, dtype="int32")[None] * VOCAB
    e = layers.Embedding(fields * VOCAB, dim)(ids)  # (batch, 26, 32)
    products = ops.einsum("bfd,bgd->bfg", e, e)
    pairs = [
        i * fields + j for i, j in itertools.combinations(range(fields), 2)
    ]
    products = ops.take(
        ops.reshape(products, (-1, fields * fields)), pairs, axis=1
    )  # the 325 pairs
    linear = layers.Dense(400)(layers.Flatten()(e))
    quadratic = layers.Dense(400, use_bias=False)(products)
    x = layers.ReLU()(layers.Add()([linear, quadratic]))
    for _ in range(3):
        x = layers.Dropout(0.2)(layers.Dense(400, activation="relu")(x))
    return inp, layers.Dense(2)(x)


def _dgcnn():
    """(inputs, logits) of a DGCNN on 256 points."""
    import keras
    from keras import layers
    from keras import ops

    edges = _edge_features()
    inp = keras.Input((256, 3))
    x = inp
    feats = []
    for filters in (64, 64, 128):  # EdgeConv, the graph rebuilt each time
        e = edges(16)(x)
        e = layers.Dense(filters, use_bias=False)(e)
        e = layers.LeakyReLU(0.2)(layers.BatchNormalization()(e))
        x = ops.max(e, axis=2)
        feats.append(x)
    x = layers.Dense(512, use_bias=False)(layers.Concatenate()(feats))
    x = layers.LeakyReLU(0.2)(layers.BatchNormalization()(x))
    x = layers.GlobalMaxPooling1D()(x)
    x = layers.Dropout(0.5)(layers.Dense(256, activation="relu")(x))
    return inp, layers.Dense(40)(x)


def _highway():
    """(inputs, logits) of a highway network on 784 features."""
    import keras
    from keras import layers

    inp = keras.Input((784,))
    x = layers.Dense(512, activation="relu")(inp)
    for _ in range(10):
        h = layers.Dense(512, activation="relu")(x)
        t = layers.Dense(
            512,
            activation="sigmoid",
            bias_initializer=keras.initializers.Constant(-2.0),
        )(x)
        x = layers.Add()(
            [layers.Multiply()([t, h]), layers.Multiply()([1.0 - t, x])]
        )
    return inp, layers.Dense(10)(x)


def build_heldout17(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "linknet":
        inp, logits = _linknet()
        return inp, logits, True
    if name == "mcnn_density":
        inp, density = _mcnn()
        return inp, density, False
    if name == "mistral_tiny":
        import keras_hub

        backbone = keras_hub.models.MistralBackbone(
            vocabulary_size=VOCAB * 4,
            num_layers=4,
            num_query_heads=8,
            num_key_value_heads=2,
            hidden_dim=256,
            intermediate_dim=768,
            sliding_window=64,
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
    if name == "roberta_tiny":
        import keras_hub

        backbone = keras_hub.models.RobertaBackbone(
            vocabulary_size=VOCAB * 4,
            num_layers=4,
            num_heads=4,
            hidden_dim=256,
            intermediate_dim=1024,
            max_sequence_length=256,
        )
        inputs = {
            kind: keras.Input((256,), dtype="int32", name=kind)
            for kind in ("token_ids", "padding_mask")
        }
        h = backbone(inputs)
        x = layers.Dense(256, activation="tanh")(h[:, 0])  # the <s> token
        return inputs, layers.Dense(10)(layers.Dropout(0.1)(x)), True
    if name == "lstnet":
        inp, values = _lstnet()
        return inp, values, False
    if name == "ipnn":
        inp, logits = _ipnn()
        return inp, logits, True
    if name == "dgcnn":
        inp, logits = _dgcnn()
        return inp, logits, True
    if name == "highway_mlp":
        inp, logits = _highway()
        return inp, logits, True
    raise ValueError(name)
