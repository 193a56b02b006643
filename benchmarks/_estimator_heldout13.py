"""The estimator's thirteenth held-out set (issue #23).

The first twelve held-out sets (`_estimator_heldout.py` to
`_estimator_heldout12.py`) have each been seen, so none judges the rules
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
AutoInt, a DCGAN generator, NeRF's MLP) and the twelfth (an
AlexNet-style net, a Tiny-YOLO-v2-like detector, keras-hub's ELECTRA,
keras-io's Compact Convolutional Transformer, an LSTM autoencoder,
xDeepFM, an EDSR-like super-resolution net, keras-io's ConvMixer). It
was fixed in this file and committed before any case was measured; its
batch sizes come from the models' arithmetic (weights, layer outputs per
sample), not from the estimate. Its cases are measured without an
estimate; the set is estimated once (`--heldout13 --reestimate`) after
the estimator's rules are final. The families were chosen for kind and
for a first step that is fast on a CPU, not for what the estimator might
get right or wrong. Why each family is new:

- `pspnet`: a PSPNet-like segmentation net (Zhao et al. 2017) on
  96x96x3: six 3x3 convolutions (32, 32 of stride 2, 64, 64 of stride 2,
  128, 128; BatchNormalization, ReLU) to 24x24x128, a pyramid pooling
  module (average pooling to 1x1, 2x2, 3x3 and 6x6 bins, a 1x1
  convolution of 32 with BatchNormalization and ReLU each, bilinear
  upsampling back to 24x24), the concatenation with the features, a 3x3
  convolution (128) and a 1x1 convolution to 21 classes, upsampled x4
  (bilinear) to per-pixel logits. DeepLabV3+ pools with atrous
  convolutions, the FPN and U-Net merge levels of a pyramid of
  features; no set pools one feature map into several bin grids and
  upsamples them back.
- `ghostnet`: a GhostNet-like classifier (Han et al. 2020) on 64x64x3: a
  3x3 stem of stride 2 (16), eight ghost bottlenecks (each ghost module
  half its maps from a 1x1 convolution, the other half from a 3x3
  depthwise convolution of those, concatenated; stride-2 bottlenecks
  with a depthwise convolution between the two modules and a depthwise +
  1x1 projection shortcut) from 16 to 112 channels down to 4x4, a 1x1
  convolution to 480, global pooling, dense 640 (ReLU), dropout and a
  10-way head. MobileNets expand with a 1x1 convolution and filter
  depthwise, ShuffleNet shuffles channels; no set makes half of a
  layer's maps from the other half by a cheap depthwise operation.
- `lenet5`: LeNet-5 (LeCun et al. 1998) on 32x32x1: 5x5 convolutions
  without padding (6, then 16) with tanh, each followed by 2x2 average
  pooling, then dense 120 and 84 (tanh) and a 10-way head. The other
  classifiers use ReLU-family activations and max or global pooling; no
  set has a tanh convolutional net with average subsampling.
- `opt_tiny`: keras-hub's `OPTBackbone` from a tiny config (no
  download: 4 layers, 4 heads, 256 wide, 1024 in the MLP, a 4000-token
  vocabulary, 128 positions) over 128 tokens with a padding mask, and a
  dense language-model head to the 4000 tokens at every token (float32
  logits). GPT-2, BLOOM, Falcon, Gemma, Llama and Mixtral are other
  decoders; no set has OPT (learned positions, pre-LayerNorm, a ReLU
  MLP), nor an untied dense head over the vocabulary.
- `mae`: a masked autoencoder (He et al. 2022) on 32x32x3: a 4x4 patch
  convolution of stride 4 to 64 tokens of 192 with learned positions,
  random masking per sample (an argsort of uniform noise keeps 16 of
  the 64), four pre-LayerNorm encoder layers (4 heads, a GELU MLP of
  768) on the 16 visible tokens, a dense projection to 128, a learned
  mask token for each masked patch and the tokens put back in order
  (gathered by the inverse permutation), learned positions, two decoder
  layers (4 heads, MLP 512) and a dense layer to each patch's 48 pixels,
  MSE to a patch-sized target. ViT, the patch transformer, Swin and
  the CCT see every token; no set drops tokens per sample before the
  encoder and gathers them back for a decoder.
- `elmo`: an ELMo-like bidirectional language model (Peters et al.
  2018) over 32 words of 16 characters: a 16-wide character embedding,
  a time-distributed 1-D convolution (256, width 3, tanh) with max
  pooling over the characters, two highway layers (a sigmoid gate mixing
  a dense ReLU transform with the input), a projection to 128, two
  bidirectional LSTMs of 256 returning every step, and a 1000-word head
  at each word. The character-level CNN classifies a text, the
  BiLSTM tagger tags words from word embeddings, the stacked LSTMs
  classify; no set builds words from characters for a recurrent
  language model, nor has highway layers.
- `sasrec`: SASRec (Kang and McAuley 2018) over 50 items of a
  1000-item catalogue: 64-wide item embeddings with learned positions,
  dropout, two causal self-attention blocks (one head, queries from the
  LayerNorm of the input, a point-wise feed-forward 64-64 with dropout),
  a final LayerNormalization, and each position's scores for every item
  as its state against the item table (the embedding shared with the
  output). GRU4Rec models a session with a recurrence, DIN attends from
  a candidate over a history; no set predicts the next item at every
  position with causal self-attention and a tied item table.
- `mmoe`: a multi-gate mixture of experts (Ma et al. 2018) for two tasks
  on tabular rows of 64 numeric features and 8 categorical fields
  (16-wide embeddings): six expert MLPs (512, 256, ReLU) on the shared
  input, per task a softmax gate over the experts whose weighted sum
  feeds a tower (128, ReLU) to 2 logits, the two tasks' logits stacked
  (2 x 2, sparse labels per task). The three-head tabular MLP shares one
  trunk between its heads; no set mixes several experts by per-task
  learned gates.

Variants: `base` (Adam) at two batch sizes, and at the larger one one or
two of `adamw` (AdamW, on `opt_tiny` and `sasrec`), `sgd_momentum` (SGD,
momentum 0.9, on `lenet5` and `mmoe`), `accumulation=4` (Adam, on
`elmo` and `sasrec`), `checkpointing=auto` (Adam, on `pspnet`,
`ghostnet` and `mae`) and `mixed_bfloat16` (Adam, on `pspnet` and
`opt_tiny`); 27 cases. Rough arithmetic behind the batch sizes (float32;
weights from `count_params()`, "outputs" the sum of the Keras layers'
outputs per sample, a backbone counted as one layer, plus a hand count
of what such a layer keeps inside it; Adam keeps 4 words per weight with
the gradient): pspnet 0.60M weights (10 MiB with Adam), outputs 7.6 MiB
per sample (the 48x48x32 maps, 288 KiB each, three times with
BatchNormalization and ReLU, and the 96x96x21 logits, 756 KiB, twice);
ghostnet 0.49M weights (8 MiB), outputs 3.3 MiB per sample (the 32x32 maps
of the stem and the first bottleneck, 32 to 64 KiB each, and the
16x16x48 maps of 48 KiB);
lenet5 0.062M weights (1 MiB), outputs 0.036 MiB per sample (the
28x28x6 map, 18 KiB); opt_tiny 5.24M weights (80 MiB: the token
embedding and the head 1.02M each), layer outputs 4.0 MiB per sample
with the backbone as one (the 128 x 4000 logits, 2 MiB, twice with the
Activation), about 14 MiB by hand (per layer the 4 x 128 x 128 scores,
256 KiB, about three times with the softmax and dropout, the 128 x 1024
MLP maps, 512 KiB, twice with ReLU, and about six 128 x 256 maps of 128
KiB, and the loss's softmax over the logits); mae 2.24M weights (34
MiB), outputs 1.4 MiB per sample, about 1.6 MiB by hand with the
decoder's 4 x 64 x 64 scores (64 KiB per layer, about three times);
elmo 3.20M weights (49 MiB: the second bidirectional LSTM 1.57M),
outputs 1.1 MiB per sample (the 32 x 14 x 256 convolution, 448 KiB),
about 1.9 MiB by hand with the four recurrences' per-step gates and
states (32 steps x 6 x 256 words, 192 KiB each); sasrec 0.12M weights
(2 MiB), outputs 0.46 MiB per sample (the 50 x 1000 scores, 195 KiB),
about 0.65 MiB by hand with the loss's softmax; mmoe 1.47M weights (22
MiB: the experts 0.23M each), outputs 0.036 MiB per sample. Weights with
Adam plus outputs (by hand where given) times the larger batch: pspnet
about 252 MiB at 32, ghostnet 219 at 64, lenet5 296 at 8192, opt_tiny
304 at 16, mae 239 at 128, elmo 171 at 64, sasrec 168 at 256, mmoe 169
at 4096; set 10's docstring found such a sum 1.3 to 5.3 times the
measured peak for the ninth set's models, so these peaks should fall
between about 30 and 400 MiB, and at the smaller batch lower. A 2-step
smoke run at a batch of 4 (64 for lenet5, sasrec and mmoe) of every
case, without reading memory, took 0.6 to 18 s per case on this CPU
(ghostnet the slowest, 14 to 18 s).
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT13 = {
    "pspnet": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
        ("mixed_bfloat16", 32),
    ],
    "ghostnet": [
        ("base", 16),
        ("base", 64),
        ("checkpointing=auto", 64),
    ],
    "lenet5": [
        ("base", 1024),
        ("base", 8192),
        ("sgd_momentum", 8192),
    ],
    "opt_tiny": [
        ("base", 4),
        ("base", 16),
        ("adamw", 16),
        ("mixed_bfloat16", 16),
    ],
    "mae": [
        ("base", 32),
        ("base", 128),
        ("checkpointing=auto", 128),
    ],
    "elmo": [
        ("base", 16),
        ("base", 64),
        ("accumulation=4", 64),
    ],
    "sasrec": [
        ("base", 64),
        ("base", 256),
        ("adamw", 256),
        ("accumulation=4", 256),
    ],
    "mmoe": [
        ("base", 1024),
        ("base", 4096),
        ("sgd_momentum", 4096),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data).
VOCAB = 1000


def _layers():
    """The custom layers of the set: learned positions, the MAE's
    random masking and unshuffling, and SASRec's tied output (scores
    against the item table)."""
    import keras
    from keras import layers
    from keras import ops

    class AddPositions(layers.Layer):
        """A learned position embedding added to a sequence."""

        def build(self, shape):
            self.positions = self.add_weight(
                shape=(1, shape[1], shape[2]), initializer="random_normal"
            )

        def call(self, x):
            return x + ops.cast(self.positions, x.dtype)

    class RandomMask(layers.Layer):
        """MAE's masking: a random permutation of the tokens per sample
        (argsort of uniform noise); returns the `keep` first tokens of it
        and the permutation's inverse (to put the tokens back)."""

        def __init__(self, keep, **kwargs):
            super().__init__(**kwargs)
            self.keep = keep
            self.seed = keras.random.SeedGenerator(1)

        def call(self, x):
            noise = keras.random.uniform(
                (ops.shape(x)[0], x.shape[1]), seed=self.seed
            )
            shuffle = ops.argsort(noise, axis=1)
            restore = ops.argsort(shuffle, axis=1)
            kept = ops.take_along_axis(
                x, ops.expand_dims(shuffle[:, : self.keep], -1), axis=1
            )
            return kept, restore

    class Unshuffle(layers.Layer):
        """MAE's decoder input: the encoded tokens followed by a learned
        mask token for each dropped one, put back in the image's order."""

        def build(self, shapes):
            self.mask_token = self.add_weight(
                shape=(1, 1, shapes[0][-1]), initializer="random_normal"
            )

        def call(self, inputs):
            x, restore = inputs
            n = restore.shape[1]
            masks = ops.broadcast_to(
                ops.cast(self.mask_token, x.dtype),
                (ops.shape(x)[0], n - x.shape[1], x.shape[-1]),
            )
            full = ops.concatenate([x, masks], axis=1)
            return ops.take_along_axis(
                full, ops.expand_dims(restore, -1), axis=1
            )

    class TiedScores(layers.Layer):
        """Each position's scores for every item: its state against the
        item embedding table (SASRec's shared item embeddings)."""

        def __init__(self, embedding, **kwargs):
            super().__init__(**kwargs)
            self.embedding = embedding

        def call(self, x):
            table = ops.cast(self.embedding.embeddings, x.dtype)
            return ops.matmul(x, ops.transpose(table))

    return AddPositions, RandomMask, Unshuffle, TiedScores


def _pspnet():
    """(inputs, per-pixel logits) of a PSPNet-like segmentation net on
    96x96."""
    import keras
    from keras import layers

    def conv(x, filters, strides=1):
        x = layers.Conv2D(filters, 3, strides, "same", use_bias=False)(x)
        return layers.ReLU()(layers.BatchNormalization()(x))

    inp = keras.Input((96, 96, 3))
    x = conv(conv(inp, 32, 2), 32)  # 48x48
    x = conv(conv(x, 64, 2), 64)  # 24x24
    x = conv(conv(x, 128), 128)
    branches = [x]
    for bins in (1, 2, 3, 6):  # the pyramid pooling module
        size = 24 // bins
        b = layers.AveragePooling2D(size)(x)
        b = layers.Conv2D(32, 1, use_bias=False)(b)
        b = layers.ReLU()(layers.BatchNormalization()(b))
        branches.append(layers.UpSampling2D(size, interpolation="bilinear")(b))
    x = conv(layers.Concatenate()(branches), 128)
    x = layers.Conv2D(21, 1)(x)
    x = layers.UpSampling2D(4, interpolation="bilinear")(x)  # 96x96
    return inp, layers.Activation("linear", dtype="float32")(x)


def _ghostnet():
    """(inputs, logits) of a GhostNet-like net on 64x64."""
    import keras
    from keras import layers

    def ghost(x, out, relu=True):
        # half the maps from a 1x1 convolution, half cheaply from them
        primary = layers.BatchNormalization()(
            layers.Conv2D(out // 2, 1, use_bias=False)(x)
        )
        if relu:
            primary = layers.ReLU()(primary)
        cheap = layers.BatchNormalization()(
            layers.DepthwiseConv2D(3, padding="same", use_bias=False)(primary)
        )
        if relu:
            cheap = layers.ReLU()(cheap)
        return layers.Concatenate()([primary, cheap])

    def bottleneck(x, expand, out, strides):
        h = ghost(x, expand)
        if strides > 1:
            h = layers.DepthwiseConv2D(3, strides, "same", use_bias=False)(h)
            h = layers.BatchNormalization()(h)
        h = ghost(h, out, relu=False)
        if strides == 1 and x.shape[-1] == out:
            return layers.Add()([x, h])
        s = layers.DepthwiseConv2D(3, strides, "same", use_bias=False)(x)
        s = layers.BatchNormalization()(s)
        s = layers.BatchNormalization()(
            layers.Conv2D(out, 1, use_bias=False)(s)
        )
        return layers.Add()([s, h])

    inp = keras.Input((64, 64, 3))
    x = layers.Conv2D(16, 3, 2, "same", use_bias=False)(inp)  # 32x32
    x = layers.ReLU()(layers.BatchNormalization()(x))
    for expand, out, strides in (
        (16, 16, 1),
        (48, 24, 2),  # 16x16
        (72, 24, 1),
        (72, 40, 2),  # 8x8
        (120, 40, 1),
        (240, 80, 2),  # 4x4
        (200, 80, 1),
        (480, 112, 1),
    ):
        x = bottleneck(x, expand, out, strides)
    x = layers.ReLU()(
        layers.BatchNormalization()(layers.Conv2D(480, 1, use_bias=False)(x))
    )
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(640, activation="relu")(x)
    return inp, layers.Dense(10)(layers.Dropout(0.2)(x))


def _lenet5():
    """(inputs, logits) of LeNet-5 on 32x32x1."""
    import keras
    from keras import layers

    inp = keras.Input((32, 32, 1))
    x = layers.Conv2D(6, 5, activation="tanh")(inp)  # 28x28
    x = layers.AveragePooling2D(2)(x)  # 14x14
    x = layers.Conv2D(16, 5, activation="tanh")(x)  # 10x10
    x = layers.Flatten()(layers.AveragePooling2D(2)(x))  # 5x5x16
    x = layers.Dense(120, activation="tanh")(x)
    x = layers.Dense(84, activation="tanh")(x)
    return inp, layers.Dense(10)(x)


def _mae():
    """(inputs, reconstructed patches) of a masked autoencoder on
    32x32x3 (64 patches of 4x4x3, 75% masked)."""
    import keras
    from keras import layers

    add_positions, random_mask, unshuffle, _ = _layers()

    def block(x, width, heads):
        h = layers.LayerNormalization(epsilon=1e-6)(x)
        h = layers.MultiHeadAttention(heads, width // heads)(h, h)
        x = layers.Add()([x, h])
        h = layers.LayerNormalization(epsilon=1e-6)(x)
        h = layers.Dense(width * 4, activation="gelu")(h)
        return layers.Add()([x, layers.Dense(width)(h)])

    inp = keras.Input((32, 32, 3))
    x = layers.Conv2D(192, 4, strides=4)(inp)  # the patch embedding
    x = add_positions()(layers.Reshape((64, 192))(x))
    x, restore = random_mask(16)(x)  # 16 visible patches
    for _ in range(4):
        x = block(x, 192, 4)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    x = layers.Dense(128)(x)  # into the decoder
    x = add_positions()(unshuffle()([x, restore]))  # 64 tokens
    for _ in range(2):
        x = block(x, 128, 4)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    return inp, layers.Dense(4 * 4 * 3)(x)  # each patch's pixels


def _elmo():
    """(inputs, next-word logits) of an ELMo-like bidirectional LSTM
    language model over 32 words of 16 characters."""
    import keras
    from keras import layers

    inp = keras.Input((32, 16), dtype="int32")
    chars = layers.Embedding(VOCAB, 16)(inp)  # (32, 16, 16)
    x = layers.TimeDistributed(layers.Conv1D(256, 3, activation="tanh"))(chars)
    x = layers.TimeDistributed(layers.GlobalMaxPooling1D())(x)  # (32, 256)
    for _ in range(2):  # highway layers
        gate = layers.Dense(256, activation="sigmoid")(x)
        h = layers.Dense(256, activation="relu")(x)
        carry = layers.Lambda(lambda g: 1.0 - g)(gate)
        x = layers.Add()(
            [layers.Multiply()([gate, h]), layers.Multiply()([carry, x])]
        )
    x = layers.Dense(128)(x)  # the projection into the LSTMs
    for _ in range(2):
        x = layers.Bidirectional(layers.LSTM(256, return_sequences=True))(x)
    return inp, layers.Dense(VOCAB)(x)


def _sasrec():
    """(inputs, next-item scores) of SASRec over 50 items."""
    import keras
    from keras import layers

    add_positions, *_, tied_scores = _layers()
    inp = keras.Input((50,), dtype="int32")
    items = layers.Embedding(VOCAB, 64)
    x = add_positions()(items(inp))
    x = layers.Dropout(0.2)(x)
    for _ in range(2):
        h = layers.LayerNormalization(epsilon=1e-8)(x)
        a = layers.MultiHeadAttention(1, 64, dropout=0.2)(
            h, x, use_causal_mask=True
        )
        x = layers.Add()([h, a])
        h = layers.LayerNormalization(epsilon=1e-8)(x)
        f = layers.Dense(64, activation="relu")(h)
        f = layers.Dense(64)(layers.Dropout(0.2)(f))
        x = layers.Add()([x, layers.Dropout(0.2)(f)])
    x = layers.LayerNormalization(epsilon=1e-8)(x)
    return inp, tied_scores(items)(x)


def _mmoe():
    """(inputs, two tasks' logits) of MMoE on 64 numeric features and 8
    categorical fields."""
    import keras
    from keras import layers

    dense = keras.Input((64,), name="numeric")
    sparse = keras.Input((8,), dtype="int32", name="categorical")
    cat = layers.Flatten()(layers.Embedding(VOCAB, 16)(sparse))
    x = layers.Concatenate()([dense, cat])  # 192
    experts = [
        layers.Dense(256, activation="relu")(
            layers.Dense(512, activation="relu")(x)
        )
        for _ in range(6)
    ]
    stacked = layers.Concatenate(axis=1)(
        [layers.Reshape((1, 256))(e) for e in experts]
    )  # (6, 256)
    heads = []
    for _ in range(2):  # one gate and tower per task
        gate = layers.Reshape((6, 1))(layers.Dense(6, activation="softmax")(x))
        mixed = layers.Flatten()(layers.Dot(axes=1)([gate, stacked]))  # (256,)
        tower = layers.Dense(128, activation="relu")(mixed)
        heads.append(layers.Reshape((1, 2))(layers.Dense(2)(tower)))
    return [dense, sparse], layers.Concatenate(axis=1)(heads)


def build_heldout13(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "pspnet":
        inp, logits = _pspnet()
        return inp, logits, True
    if name == "ghostnet":
        inp, logits = _ghostnet()
        return inp, logits, True
    if name == "lenet5":
        inp, logits = _lenet5()
        return inp, logits, True
    if name == "opt_tiny":
        import keras_hub

        backbone = keras_hub.models.OPTBackbone(
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
    if name == "mae":
        inp, patches = _mae()
        return inp, patches, False
    if name == "elmo":
        inp, logits = _elmo()
        return inp, logits, True
    if name == "sasrec":
        inp, scores = _sasrec()
        return inp, scores, True
    if name == "mmoe":
        inputs, logits = _mmoe()
        return inputs, logits, True
    raise ValueError(name)
