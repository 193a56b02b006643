"""The estimator's sixteenth held-out set (issue #23).

The first fifteen held-out sets (`_estimator_heldout.py` to
`_estimator_heldout15.py`) have each been seen or measured, so none
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
IndRNN, FiBiNET, a FlowNetSimple-like net, GIN) and the fifteenth (an
SKNet-like net, a CBAM ResNet, keras-hub's Phi-3, a Set Transformer, a
QRNN, Caser, a context encoder, a self-normalizing MLP). It was fixed
in this file and committed before any case was measured; its batch
sizes come from the models' arithmetic (weights, layer outputs per
sample, a hand count of what the layers hold inside), not from the
estimate. Its cases are measured without an estimate; the set is
estimated once (`--heldout16 --reestimate`) after the estimator's rules
are final. The families were chosen for kind and for a first step that
is fast on a CPU, not for what the estimator might get right or wrong.
Why each family is new:

- `cspdarknet_tiny`: keras-hub's `CSPNetBackbone` (CSPDarkNet, Wang et
  al. 2020) from a small config (no download: a 3x3 stem of 32, four
  cross-stage-partial stages of 1, 2, 2 and 1 dark blocks, 64, 128, 256
  and 512 channels, each stage's first convolution of stride 2,
  BatchNormalization, leaky ReLU) on 64x64x3, global pooling and a
  10-way head. The Tiny-YOLO-v2-like detector is a plain DarkNet-style
  stack and the ResNets, DenseNet and ResNeXt pass every channel
  through their blocks; no set splits a stage's channels so that one
  part bypasses its blocks and is concatenated back (cross stage
  partial connections).
- `fcn8s`: an FCN-8s-like segmentation net (Long et al. 2015) on
  64x64x3 with 21 classes: a VGG-style encoder (2, 2, 3, 3 and 3 3x3
  ReLU convolutions of 32, 64, 128, 256 and 256, each group max-pooled,
  to 2x2), fc6 and fc7 as convolutions of 512 with dropout, a 1x1 class
  score, upsampled by learned 2x transposed convolutions and added to
  the 1x1 class scores of the fourth and third pools, and an 8x
  transposed convolution to per-pixel logits at 64x64 (a sparse label
  per pixel). The U-Net, FPN, PSPNet and DeepLabV3+ fuse feature maps
  and upsample by resizing or concatenation; no set fuses class-score
  maps upsampled by learned transposed convolutions.
- `qwen2_tiny`: keras-hub's `Qwen2Backbone` from a tiny config (no
  download: 4 layers, 8 query and 2 key-value heads, 256 wide, 768 in
  the MLP, a 4000-token vocabulary) over 128 tokens with a padding mask,
  and a dense language-model head to the 4000 tokens at every token
  (float32 logits). GPT-2, BLOOM, Falcon, Gemma, Llama, Mixtral, OPT,
  GPT-NeoX and Phi-3 are other decoders; no set has Qwen2 (its own
  decoder layer, with biases on the query, key and value projections
  only, grouped-query attention and RMS normalisation).
- `funnel_transformer`: a Funnel-Transformer-like text classifier (Dai
  et al. 2020) over 256 tokens: a 256-wide token and learned position
  embedding, three blocks of two post-norm encoder layers (4 heads, a
  1024-wide GELU feed-forward layer, dropout), the first layer of the
  second and third block attending from the sequence average-pooled by
  2 (the query) to the full-length sequence (keys and values), so 256,
  128 and 64 tokens, mean pooling and a 10-way head. The encoders of
  the sets keep their sequence length (the Perceiver and the Set
  Transformer attend from learned latents or seeds, Swin merges image
  patches); no set shortens a token sequence between its layers by
  pooling the sequence itself.
- `mamba_lm`: a Mamba-like language model (Gu and Dao 2023) over 128
  tokens: a 128-wide embedding, two residual blocks (LayerNormalization,
  an input projection to 2 x 256, a causal depthwise convolution of
  width 4 with SiLU, input-dependent step sizes (a rank-8 dense and a
  softplus dense to 256), B and C (dense to 16 each), a selective scan
  over a 256 x 16 state per token (h = exp(dt A) h + dt x B, y = h C +
  D x; a custom cell in `keras.layers.RNN`), gated by SiLU of the other
  half, projected back), a final LayerNormalization and a 1000-word
  head at each token. The LSTMs, GRUs, Elman RNN, IndRNN and QRNN keep
  one state vector per layer with fixed or convolutional gates, RWKV-7
  is keras-hub's own; no set has a selective state-space scan with an
  input-dependent step size and a state matrix per token.
- `node_tabular`: a NODE-like net (Popov et al. 2019) on 64 numeric
  features: BatchNormalization, two densely connected layers of 128
  differentiable oblivious decision trees of depth 6 with a 10-wide
  response per leaf (a softmax over the features picks each level's
  feature, a sigmoid compares it with a learned threshold, the 64
  leaves are weighted by the product of the levels' choices; softmax
  and sigmoid in place of the paper's entmax), the second layer reading
  the features and the first layer's responses, and the mean of all
  256 trees' responses as the 10 logits. TabNet, the three-head tabular
  MLP and the recommenders are attention, MLP or interaction models; no
  set has differentiable decision trees.
- `ddpm_unet`: a DDPM-like denoising U-Net (Ho et al. 2020) on
  32x32x3 with an integer timestep: a sinusoidal timestep embedding
  (64) through two dense layers (128, SiLU), residual blocks
  (GroupNormalization, SiLU, 3x3 convolutions, the embedding projected
  and added to every block) of 32, 64 and 128 channels at 32x32, 16x16
  and 8x8 with stride-2 convolutions down, 4-head self-attention at
  8x8, a middle of two blocks around an attention, and an up path of
  one block per level on the concatenated skip, each followed by
  nearest upsampling and a convolution to half the channels, to the
  predicted 32x32x3 noise (MSE).
  The U-Net, autoencoders, DnCNN, the context encoder and the
  generators take no conditioning; no set conditions every block of a
  network on a diffusion timestep.
- `fastkan`: a FastKAN net (Kolmogorov-Arnold network with Gaussian
  radial basis functions, Li 2024) on 784 features: three KAN layers
  (784 to 256, 256 to 256, 256 to 10), each the sum of a spline path
  (LayerNormalization, each input expanded into 8 Gaussian bumps on a
  grid over [-2, 2], a dense layer from the 8 x inputs values, no bias)
  and a base path (SiLU, a dense layer). The MLPs of the design set and
  the sets apply a fixed activation per unit; no set learns a function
  per input and output from a basis expansion (a KAN).

Variants: `base` (Adam) at two batch sizes, and at the larger one one
of `adamw` (AdamW, on `funnel_transformer`), `sgd_momentum` (SGD,
momentum 0.9, on `node_tabular`), `accumulation=4` (Adam, on
`mamba_lm` and `fastkan`), `checkpointing=auto` (Adam, on
`cspdarknet_tiny`, `fcn8s` and `ddpm_unet`) and `mixed_bfloat16`
(Adam, on `qwen2_tiny`); 24 cases. Rough arithmetic behind the batch
sizes (float32; weights from `count_params()`, "outputs" the sum of
the Keras layers' outputs per sample, the layers inside a keras-hub
backbone counted except where said, plus a hand count where given;
Adam keeps 4 words per weight with the gradient): cspdarknet_tiny
4.36M weights (66 MiB with Adam), outputs 14.4 MiB per sample (111
outputs inside the backbone; the first stage's 32x32x128 maps, 512
KiB, with their BatchNormalization, activations and concatenation,
and the 66x66x32 padded stem); fcn8s 5.27M weights (80 MiB), outputs
2.7 MiB per sample (the 64x64x32 maps, 512 KiB, twice, the 64x64x21
logits, 336 KiB), about 5.5 MiB by hand with the ReLUs inside the
convolutions and the loss's softmax over the 64x64x21 logits;
qwen2_tiny 5.07M weights (77 MiB: the token embedding and the head
1.02M each), outputs 4.7 MiB per sample with the backbone as one (the
128 x 4000 logits, 2 MiB, twice with the Activation), about 19 MiB by
hand (per layer the 8 x 128 x 128 scores, 512 KiB, a few times, the
MLP's 128 x 768 maps, 384 KiB, about four times, the projections and
rotary products: about 3.5 MiB a layer, and the logits with the
loss's softmax); funnel_transformer 5.00M weights (76 MiB), outputs
10.6 MiB per sample (the 256 x 1024 feed-forward maps, 1 MiB each),
about 19 MiB by hand with the attentions' 4-head scores (4 x 256 x
256, 1 MiB, in the first two layers, then 512, 256, 128 and 64 KiB),
each with its softmax and dropout; mamba_lm 0.49M weights (7 MiB),
outputs 4.3 MiB per sample (the 128 x 1000 logits, 500 KiB, the
scan's 128 x 544 inputs, 272 KiB), about 16 MiB by hand (at each of
the 128 steps the 256 x 16 state, 16 KiB, with its decay and input
product kept for the backward pass: about 6 MiB a layer);
node_tabular 1.25M weights (19 MiB), outputs 0.03 MiB per sample,
about 1.6 MiB by hand (per layer the 6 x 64 x 128 choice tensor, 192
KiB, about four times with its two products and the product's
gradient, and the 64 x 128 leaf weights); ddpm_unet 1.98M weights
(30 MiB), outputs 7.1 MiB per sample (132 outputs; at 32x32 the
64-channel maps, 256 KiB, with their GroupNormalization and SiLU; the
4 x 64 x 64 scores, 64 KiB, are small); fastkan 2.42M
weights (37 MiB), outputs 0.06 MiB per sample, about 0.15 MiB by hand
(the first layer's 784 x 8 expansion, 24.5 KiB, with its differences,
squares and exponent). Weights with Adam plus outputs (by hand where
given) times the larger batch: cspdarknet_tiny about 411 MiB at 24,
fcn8s 432 at 64, qwen2_tiny 305 at 12, funnel_transformer 380 at 16,
mamba_lm 263 at 16, node_tabular 224 at 128, ddpm_unet 256 at 32,
fastkan 344 at 2048; set 15's measured peaks were 0.66 to 1.3 times
such sums where the hand count held (sknet_mini 175.6 MiB against 265,
cbam_resnet 349.4 against 377, phi3_tiny 436.0 against 335) and 5.4
times where it was low (set_transformer, 1178.5 against 217), so
these peaks should mostly fall between about 30 and 450 MiB, and at
the smaller batch lower. A 2-step smoke run of every case at a batch
of 4 (64 for node_tabular and fastkan), without reading memory and
with no estimate, took 1.3 to 14.7 s to build, compile and run the
first step on this CPU (ddpm_unet the slowest, 12.4 s and 14.7 s
checkpointed; two earlier versions of it, of 10.9M and 2.7M weights
with two up blocks per level, took 16.5 to 21.3 s and were cut before
any measurement); a second step at that batch took 0.03 to 0.32 s.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT16 = {
    "cspdarknet_tiny": [
        ("base", 8),
        ("base", 24),
        ("checkpointing=auto", 24),
    ],
    "fcn8s": [
        ("base", 16),
        ("base", 64),
        ("checkpointing=auto", 64),
    ],
    "qwen2_tiny": [
        ("base", 4),
        ("base", 12),
        ("mixed_bfloat16", 12),
    ],
    "funnel_transformer": [
        ("base", 4),
        ("base", 16),
        ("adamw", 16),
    ],
    "mamba_lm": [
        ("base", 4),
        ("base", 16),
        ("accumulation=4", 16),
    ],
    "node_tabular": [
        ("base", 32),
        ("base", 128),
        ("sgd_momentum", 128),
    ],
    "ddpm_unet": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "fastkan": [
        ("base", 512),
        ("base", 2048),
        ("accumulation=4", 2048),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data); the diffusion net's timesteps too.
VOCAB = 1000


def _layers():
    """The custom layers of the set: Mamba's selective scan cell, NODE's
    oblivious trees, the diffusion net's timestep embedding and FastKAN's
    radial basis expansion."""
    import math

    from keras import layers
    from keras import ops

    class SelectiveScanCell(layers.Layer):
        """Mamba's selective scan (Gu and Dao 2023) as a recurrent cell:
        from the step's input x (d), step size dt (d), B (n) and C (n),
        h = exp(dt * A) * h + (dt * x) B, y = h C + D x; the state h is
        d x n."""

        def __init__(self, d, n, **kwargs):
            super().__init__(**kwargs)
            self.d = d
            self.n = n
            self.state_size = d * n
            self.output_size = d

        def build(self, shape):
            self.a_log = self.add_weight(
                shape=(self.d, self.n), initializer="zeros"
            )
            self.skip = self.add_weight(shape=(self.d,), initializer="ones")

        def call(self, inputs, states):
            h = states[0] if isinstance(states, (list, tuple)) else states
            d, n = self.d, self.n
            x, dt, b, c = ops.split(inputs, [d, 2 * d, 2 * d + n], axis=-1)
            h = ops.reshape(h, (-1, d, n))
            decay = ops.exp(dt[:, :, None] * -ops.exp(self.a_log))
            h = decay * h + (dt * x)[:, :, None] * b[:, None, :]
            y = ops.sum(h * c[:, None, :], axis=-1) + self.skip * x
            return y, [ops.reshape(h, (-1, d * n))]

    class ObliviousTrees(layers.Layer):
        """NODE's layer of oblivious decision trees (Popov et al. 2019),
        with softmax feature selection and sigmoid splits in place of
        entmax: each of `trees` trees of `depth` levels picks one soft
        feature per level, compares it with a learned threshold, and
        mixes its 2**depth leaves' `dim`-wide responses by the product of
        the levels' choices."""

        def __init__(self, trees, depth, dim, **kwargs):
            super().__init__(**kwargs)
            self.trees, self.depth, self.dim = trees, depth, dim

        def build(self, shape):
            t, d = self.trees, self.depth
            self.select = self.add_weight(
                shape=(shape[-1], d * t), initializer="random_uniform"
            )
            self.threshold = self.add_weight(
                shape=(d, t), initializer="random_normal"
            )
            self.log_temp = self.add_weight(shape=(d, t), initializer="zeros")
            self.response = self.add_weight(
                shape=(t, 2**d, self.dim), initializer="random_normal"
            )
            codes = [
                [(leaf >> level) & 1 for level in range(d)]
                for leaf in range(2**d)
            ]  # (leaves, depth): 1 = right at that level
            self.codes = ops.convert_to_tensor(codes, "float32")

        def call(self, x):
            t, d = self.trees, self.depth
            sel = ops.softmax(
                ops.reshape(self.select, (-1, d, t)), axis=0
            )  # over the features
            f = ops.einsum("bf,fdt->bdt", x, sel)
            right = ops.sigmoid(
                (f - self.threshold) * ops.exp(-self.log_temp)
            )  # (batch, depth, trees)
            codes = ops.cast(self.codes, right.dtype)[None, :, :, None]
            r = right[:, None]  # (batch, 1, depth, trees)
            choice = r * codes + (1.0 - r) * (1.0 - codes)
            leaves = ops.prod(choice, axis=2)  # (batch, leaves, trees)
            return ops.einsum("blt,tlk->btk", leaves, self.response)

    class TimestepEmbedding(layers.Layer):
        """The diffusion net's sinusoidal embedding of the integer
        timestep (Ho et al. 2020), `dim` wide."""

        def __init__(self, dim, **kwargs):
            super().__init__(**kwargs)
            self.dim = dim

        def call(self, t):
            half = self.dim // 2
            freqs = ops.exp(
                -math.log(10000.0) * ops.arange(half, dtype="float32") / half
            )
            arg = ops.cast(t, "float32") * freqs[None, :]
            return ops.concatenate([ops.sin(arg), ops.cos(arg)], axis=-1)

    class RadialBasis(layers.Layer):
        """FastKAN's basis (Li 2024): each input feature expanded into
        `grid` Gaussian bumps on a fixed grid over [-2, 2], flattened."""

        def __init__(self, grid, **kwargs):
            super().__init__(**kwargs)
            self.grid = grid

        def call(self, x):
            g = ops.linspace(-2.0, 2.0, self.grid)
            h = 4.0 / (self.grid - 1)
            z = (x[..., None] - g) / h
            return ops.reshape(ops.exp(-(z * z)), (-1, x.shape[-1] * self.grid))

    return SelectiveScanCell, ObliviousTrees, TimestepEmbedding, RadialBasis


def _cspdarknet():
    """(inputs, logits) of keras-hub's CSPNet (CSPDarkNet) from a small
    config on 64x64x3."""
    import keras
    import keras_hub
    from keras import layers

    backbone = keras_hub.models.CSPNetBackbone(
        stem_filters=32,
        stem_kernel_size=3,
        stem_strides=1,
        stackwise_depth=[1, 2, 2, 1],
        stackwise_strides=[2, 2, 2, 2],
        stackwise_num_filters=[64, 128, 256, 512],
        block_type="dark_block",
        stage_type="csp",
        bottle_ratio=[0.5],
        block_ratio=[1.0],
        expand_ratio=[2.0],
        stem_padding="same",
        image_shape=(64, 64, 3),
    )
    inp = keras.Input((64, 64, 3))
    x = backbone(inp)
    x = layers.GlobalAveragePooling2D()(x)
    return inp, layers.Dense(10)(x)


def _fcn8s():
    """(inputs, per-pixel logits) of an FCN-8s-like net on 64x64x3."""
    import keras
    from keras import layers

    inp = keras.Input((64, 64, 3))
    x = inp
    pools = []
    for filters, convs in ((32, 2), (64, 2), (128, 3), (256, 3), (256, 3)):
        for _ in range(convs):
            x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D(2)(x)
        pools.append(x)  # 32, 16, 8, 4, 2
    x = layers.Conv2D(512, 3, padding="same", activation="relu")(x)  # fc6
    x = layers.Dropout(0.5)(x)
    x = layers.Conv2D(512, 1, activation="relu")(x)  # fc7
    x = layers.Dropout(0.5)(x)
    classes = 21
    score = layers.Conv2D(classes, 1)(x)  # 2x2
    up = layers.Conv2DTranspose(classes, 4, 2, "same", use_bias=False)(score)
    up = layers.Add()([up, layers.Conv2D(classes, 1)(pools[3])])  # 4x4
    up = layers.Conv2DTranspose(classes, 4, 2, "same", use_bias=False)(up)
    up = layers.Add()([up, layers.Conv2D(classes, 1)(pools[2])])  # 8x8
    out = layers.Conv2DTranspose(classes, 16, 8, "same", use_bias=False)(up)
    return inp, out  # 64x64x21


def _funnel():
    """(inputs, logits) of a Funnel-Transformer-like text classifier over
    256 tokens."""
    import keras
    from keras import layers

    width, heads = 256, 4
    inp = keras.Input((256,), dtype="int32")
    x = layers.Embedding(VOCAB, width)(inp)
    pos = layers.Embedding(256, width)(keras.ops.arange(256)[None])
    x = layers.Add()([x, pos])
    x = layers.LayerNormalization()(x)

    def layer(x, q):
        h = layers.MultiHeadAttention(heads, width // heads, dropout=0.1)(q, x)
        x = layers.LayerNormalization()(layers.Add()([q, h]))
        h = layers.Dense(4 * width, activation="gelu")(x)
        h = layers.Dropout(0.1)(layers.Dense(width)(h))
        return layers.LayerNormalization()(layers.Add()([x, h]))

    for block in range(3):  # 256, 128, 64 tokens
        if block:  # the query pooled, the keys and values full length
            q = layers.AveragePooling1D(2)(x)
            x = layer(x, q)
        else:
            x = layer(x, x)
        x = layer(x, x)
    x = layers.GlobalAveragePooling1D()(x)
    return inp, layers.Dense(10)(x)


def _mamba():
    """(inputs, logits) of a Mamba-like language model over 128 tokens."""
    import keras
    from keras import layers
    from keras import ops

    scan_cell, *_ = _layers()
    model, inner, state = 128, 256, 16
    inp = keras.Input((128,), dtype="int32")
    x = layers.Embedding(VOCAB, model)(inp)
    for _ in range(2):
        h = layers.LayerNormalization()(x)
        xz = layers.Dense(2 * inner, use_bias=False)(h)
        xs, z = ops.split(xz, 2, axis=-1)
        xs = layers.ZeroPadding1D((3, 0))(xs)  # causal, width 4
        xs = layers.Activation("silu")(layers.DepthwiseConv1D(4)(xs))
        dt = layers.Dense(inner, activation="softplus")(layers.Dense(8)(xs))
        b = layers.Dense(state, use_bias=False)(xs)
        c = layers.Dense(state, use_bias=False)(xs)
        y = layers.RNN(scan_cell(inner, state), return_sequences=True)(
            layers.Concatenate()([xs, dt, b, c])
        )
        y = layers.Multiply()([y, layers.Activation("silu")(z)])
        x = layers.Add()([x, layers.Dense(model, use_bias=False)(y)])
    x = layers.LayerNormalization()(x)
    return inp, layers.Dense(VOCAB)(x)


def _node():
    """(inputs, logits) of a NODE-like net on 64 numeric features."""
    import keras
    from keras import layers
    from keras import ops

    _, trees, *_ = _layers()
    inp = keras.Input((64,))
    x = layers.BatchNormalization()(inp)
    outs = []
    for _ in range(2):  # densely connected: each layer sees x and all before
        o = trees(128, 6, 10)(x)  # (batch, 128 trees, 10)
        outs.append(o)
        x = layers.Concatenate()([x, layers.Flatten()(o)])
    logits = ops.mean(layers.Concatenate(axis=1)(outs), axis=1)
    return inp, logits


def _ddpm():
    """((noisy image, timestep), predicted noise) of a DDPM-like U-Net on
    32x32x3."""
    import keras
    from keras import layers

    *_, t_embed, _ = _layers()
    image = keras.Input((32, 32, 3), name="image")
    t = keras.Input((1,), dtype="int32", name="timestep")
    temb = t_embed(64)(t)
    temb = layers.Dense(128, activation="silu")(temb)
    temb = layers.Dense(128)(temb)

    def res(x, ch):
        h = layers.Activation("silu")(layers.GroupNormalization(8)(x))
        h = layers.Conv2D(ch, 3, padding="same")(h)
        e = layers.Dense(ch)(layers.Activation("silu")(temb))
        h = layers.Add()([h, layers.Reshape((1, 1, ch))(e)])
        h = layers.Activation("silu")(layers.GroupNormalization(8)(h))
        h = layers.Conv2D(ch, 3, padding="same")(layers.Dropout(0.1)(h))
        if x.shape[-1] != ch:
            x = layers.Conv2D(ch, 1)(x)
        return layers.Add()([x, h])

    def attention(x):
        s, ch = x.shape[1], x.shape[-1]
        h = layers.Reshape((s * s, ch))(layers.GroupNormalization(8)(x))
        h = layers.MultiHeadAttention(4, ch // 4)(h, h)
        return layers.Add()([x, layers.Reshape((s, s, ch))(h)])

    x = layers.Conv2D(32, 3, padding="same")(image)
    skips = []
    for level, ch in enumerate((32, 64, 128)):  # 32, 16, 8
        x = res(x, ch)
        if ch == 128:
            x = attention(x)
        skips.append(x)
        if level < 2:
            x = layers.Conv2D(ch, 3, 2, "same")(x)
    x = attention(res(x, 128))  # the middle, 8x8
    x = res(x, 128)
    for level, ch in enumerate((128, 64, 32)):  # 8, 16, 32
        x = res(layers.Concatenate()([x, skips.pop()]), ch)
        if ch == 128:
            x = attention(x)
        if level < 2:
            x = layers.UpSampling2D(2)(x)
            x = layers.Conv2D(ch // 2, 3, padding="same")(x)
    x = layers.Activation("silu")(layers.GroupNormalization(8)(x))
    return {"image": image, "timestep": t}, layers.Conv2D(3, 3, padding="same")(
        x
    )


def _fastkan():
    """(inputs, logits) of a FastKAN net on 784 features."""
    import keras
    from keras import layers

    *_, basis = _layers()
    inp = keras.Input((784,))
    x = inp
    for width in (256, 256, 10):
        h = layers.LayerNormalization()(x)
        spline = layers.Dense(width, use_bias=False)(basis(8)(h))
        base = layers.Dense(width)(layers.Activation("silu")(x))
        x = layers.Add()([spline, base])
    return inp, x


def build_heldout16(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "cspdarknet_tiny":
        inp, logits = _cspdarknet()
        return inp, logits, True
    if name == "fcn8s":
        inp, logits = _fcn8s()
        return inp, logits, True
    if name == "qwen2_tiny":
        import keras_hub

        backbone = keras_hub.models.Qwen2Backbone(
            vocabulary_size=VOCAB * 4,
            num_layers=4,
            num_query_heads=8,
            num_key_value_heads=2,
            hidden_dim=256,
            intermediate_dim=768,
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
    if name == "funnel_transformer":
        inp, logits = _funnel()
        return inp, logits, True
    if name == "mamba_lm":
        inp, logits = _mamba()
        return inp, logits, True
    if name == "node_tabular":
        inp, logits = _node()
        return inp, logits, True
    if name == "ddpm_unet":
        inputs, noise = _ddpm()
        return inputs, noise, False
    if name == "fastkan":
        inp, logits = _fastkan()
        return inp, logits, True
    raise ValueError(name)
