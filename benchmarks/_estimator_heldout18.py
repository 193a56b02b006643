"""The estimator's eighteenth held-out set (issue #23).

The first seventeen held-out sets (`_estimator_heldout.py` to
`_estimator_heldout17.py`) have each been seen or measured, so none
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
QRNN, Caser, a context encoder, a self-normalizing MLP), the sixteenth
(keras-hub's CSPNet / CSPDarkNet, an FCN-8s-like net, keras-hub's
Qwen2, a Funnel-Transformer-like classifier, a Mamba-like language
model, a NODE-like net, a DDPM-like U-Net, FastKAN) and the
seventeenth (a LinkNet-like net, a multi-column crowd-counting CNN,
keras-hub's Mistral and RoBERTa, an LSTNet-like forecaster, IPNN,
DGCNN, a highway network). It was fixed in this file and committed
before any case was measured; its batch sizes come from the models'
arithmetic (weights, layer outputs per sample, a hand count of what
the layers hold inside), not from the estimate. Its cases are measured
without an estimate; the set is estimated once (`--heldout18
--reestimate`) after the estimator's rules are final. The families were
chosen for kind and for a first step that is fast on a CPU, not for
what the estimator might get right or wrong. Why each family is new:

- `patchgan`: pix2pix's PatchGAN discriminator (Isola et al. 2017) on a
  pair of 128x128x3 images (the condition and the image, concatenated
  to 6 channels): 4x4 stride-2 convolutions of 64 (no normalization),
  128 and 256 with BatchNormalization, each followed by a leaky ReLU
  (0.2), to 16x16, then zero padding, a 4x4 convolution of 512 (15x15)
  with BatchNormalization and leaky ReLU, zero padding and a 4x4
  convolution to a real / fake logit pair per 14x14 patch (a sparse
  label per patch). The GAN models of the sets are generators (DCGAN,
  the CycleGAN ResNet generator); no set has a discriminator, nor one
  that scores overlapping patches of an image pair.
- `eigen_depth`: Eigen et al.'s coarse-to-fine depth net (2014) on
  96x128x3: a coarse net (an 11x11 stride-4 convolution of 64, max
  pooling, a 5x5 convolution of 192, max pooling, 3x3 convolutions of
  256, 256 and 192 at 6x8, a fully connected layer of 512 with dropout
  and one to a 24x32 depth map), and a fine net (a 9x9 stride-2
  convolution of 63, max pooling to 24x32, the coarse map concatenated
  as a 64th channel, a 5x5 convolution of 64 and one to the 24x32x1
  depth map; MSE). The image-to-image nets of the sets (U-Net,
  autoencoders, DnCNN, EDSR, ESPCN, the colorization net, the context
  encoder, FlowNetS, the hourglass, the DDPM U-Net) are convolutional
  throughout; no set regresses a dense map through a fully connected
  layer and refines it with a second net on the image.
- `ssd_lite`: an SSD-like single-shot detector (Liu et al. 2016) on
  128x128x3 with 21 classes: five stages of two 3x3 convolutions with
  BatchNormalization and ReLU (the first of stride 2) of 32, 64, 128,
  256 and 256 channels at 64x64 to 4x4, and on each of the 16x16, 8x8
  and 4x4 maps a 3x3 convolution to 4 anchors x 21 class logits,
  reshaped and concatenated to 1344 anchors (a sparse label per
  anchor; the box offsets are left out, the harness trains one
  output). The Tiny-YOLO-like detector predicts from one map, the FPN
  and the segmentation nets predict per pixel at one resolution; no set
  concatenates anchor predictions from several scales.
- `roformer_v2_tiny`: keras-hub's `RoformerV2Backbone` from a tiny
  config (no download: 4 layers, 8 heads of 32, 256 wide, 1024 in the
  ReLU feed-forward layer, dropout 0.1, a 4000-token vocabulary) over
  128 tokens with segment ids, and a masked-language-model head tied to
  the token embedding (the embedding reversed: logits over the 4000
  tokens at every token, float32). The keras-hub encoders of the sets
  are ALBERT, DeBERTa-v3, DistilBERT, ELECTRA, RoBERTa, XLNet and the
  encoders inside T5, BART and Whisper; no set has RoFormer's encoder
  (rotary positions in a post-norm encoder, RMS norms, no biases) nor
  an encoder trained with a tied head at every token.
- `dinov2_tiny`: keras-hub's `DINOV2Backbone` from a tiny config (no
  download: 8x8 patches of a 64x64x3 image, 4 layers, 3 heads, 192
  wide, 768 in the MLP, 4 register tokens, layer scale, a mask token)
  and a dense head on the class token to 10 logits. The vision
  transformers of the sets are keras-io's ViT, the patch transformer,
  MobileViT, CCT, ViViT, the masked autoencoder, keras-hub's Swin and
  SegFormer; no set has DINOv2's encoder (register tokens and layer
  scale on every residual branch).
- `deepar`: a DeepAR-like forecaster (Salinas et al. 2020) over 96
  steps: per step the lagged value and 7 covariates, a 16-wide
  embedding of the series id (1000 series) repeated along the steps,
  two LSTM layers of 128 returning every step, and a dense layer to the
  next value at every step (MSE; the likelihood's scale is left out,
  the harness trains one output with MSE). The LSTMs of the sets
  classify, encode or decode tokens or frames, LSTNet forecasts the
  next step with a GRU; no set has a stacked LSTM that regresses a
  value at every step of a time series with a learned series
  embedding.
- `afm`: an attentional factorization machine (Xiao et al. 2017) on 26
  categorical fields: a 16-wide embedding per field (26 x 1000 rows),
  the 325 element-wise products of the field embeddings in pairs, an
  attention net over the pairs (a dense layer of 32 with ReLU, one
  score per pair, softmax), the attention-weighted sum of the products
  with dropout and a dense layer to 2 logits, plus a first-order term
  (a 2-wide embedding per field row, summed). DeepFM sums the pairwise
  products, IPNN feeds their inner products to an MLP, FiBiNET,
  xDeepFM and AutoInt use bilinear, compressed and self-attention
  interactions; no set weighs each pair's product by an attention net
  and pools them.
- `memn2n`: an end-to-end memory network (Sukhbaatar et al. 2015) on a
  story of 50 sentences of 12 words and a 12-word question (a
  1000-word vocabulary): 4 embeddings of 64 with adjacent weight tying
  (hop k's output embedding is hop k+1's input one, the question
  embedded with the first), position encoding of the words and a
  learned vector per sentence, 3 hops (softmax of the question state
  against the memories, the weighted sum of the output memories added
  to the state) and a dense layer to the 1000 answer words. The
  attention models of the sets attend over tokens, patches, points or
  latents with learned projections; no set reads a bag-of-words memory
  in several hops with no projection between them.

Variants: `base` (Adam) at two batch sizes, and at the larger one one
of `adamw` (AdamW, on `dinov2_tiny`), `sgd_momentum` (SGD, momentum
0.9, on `afm`), `accumulation=4` (Adam, on `deepar` and `memn2n`),
`checkpointing=auto` (Adam, on `patchgan`, `eigen_depth` and
`ssd_lite`) and `mixed_bfloat16` (Adam, on `roformer_v2_tiny`); 24
cases. Rough arithmetic behind the batch sizes (float32; weights from
`count_params()`, "outputs" the sum of the Keras layers' outputs per
sample, a keras-hub backbone counted as one layer, plus a hand count
where given; Adam keeps 4 words per weight with the gradient): patchgan
2.78M weights (42 MiB with Adam), outputs 7.2 MiB per sample (17
layers: the 64x64x64 convolution and leaky ReLU, 1 MiB each, the
32x32x128 ones, 512 KiB each three times, the padded 18x18x256 and
17x17x512 maps, 324 and 578 KiB, the 15x15x512 convolution,
BatchNormalization and leaky ReLU, 450 KiB each), about 8 MiB by hand
with the loss; eigen_depth 7.04M weights (107 MiB: the 9216 x 512
fully connected layer 4.7M), outputs 2.0 MiB per sample, about 3.1 MiB
by hand (each ReLU convolution holds its input to the activation too:
the fine net's 48x64x63 map, 756 KiB, twice, the coarse net's 24x32x64
and 12x16x192 maps, 192 and 144 KiB, twice, the concatenation and the
fine 5x5 convolution's 24x32x64, 192 KiB, three times); ssd_lite 2.84M
weights (43 MiB), outputs 6.2 MiB per sample (38 layers: the 64x64x32
maps, 512 KiB, six times with BatchNormalization and ReLU, the
32x32x64 ones, 256 KiB, six times, and so on at a half each stage),
about 6.5 MiB by hand with the loss's softmax over the 1344 x 21
logits; roformer_v2_tiny 4.17M weights (64 MiB), outputs 2.0 MiB per
sample with the backbone as one (the 128 x 4000 logits, 2 MiB), about
26 MiB by hand (per layer the 8 x 128 x 128 scores, 512 KiB, about
four times with the mask, softmax and dropout, the 128 x 1024
feed-forward map, 512 KiB, about three times, and the 128 x 256
projections, rotary products, norms and residuals, 128 KiB, about
twelve times: about 5 MiB a layer, and the logits, their float32 copy
and the loss's softmax, 2 MiB each); dinov2_tiny 1.85M weights (28
MiB), outputs 0.1 MiB per sample with the backbone as one, about 6.5
MiB by hand (69 tokens: per layer the 3 x 69 x 69 scores, 56 KiB,
about four times, the 69 x 768 MLP map, 207 KiB, three times, and the
69 x 192 maps, 52 KiB, about fourteen times with the norms, layer
scales and residuals: about 1.55 MiB a layer, and the patch embedding);
deepar 0.23M weights (3 MiB), outputs 0.11 MiB per sample, about 0.8
MiB by hand (each LSTM keeps its gates and states at each of the 96
steps, about 8 x 128 words a step, 384 KiB a layer); afm 0.47M weights
(7 MiB), outputs 0.04 MiB per sample, about 0.16 MiB by hand (the two
gathered 325 x 16 embeddings and their product, 20 KiB each, the
attention net's 325 x 32 map, 41 KiB, twice, the weighted products, 20
KiB); memn2n 0.33M weights (5 MiB), outputs 0.5 MiB per sample, about
1.25 MiB by hand (each of the 4 lookups of the story, 50 x 12 x 64,
150 KiB, and its product with the position encoding, 150 KiB).
Weights with Adam plus outputs (by hand where given) times the larger
batch: patchgan about 298 MiB at 32, eigen_depth 206 at 32, ssd_lite
251 at 32, roformer_v2_tiny 324 at 10, dinov2_tiny 236 at 32, deepar
208 at 256, afm 257 at 1536, memn2n 245 at 192; sets 15 and 16 each
had one family 1.5 to 3 times over such sums, so these peaks should
mostly fall between about 30 and 450 MiB, and at the smaller batch
lower. A 2-step smoke run of every family in every variant at a batch
of 4, without reading memory and with no estimate, took 1.3 to 7.7 s
to build, compile and run the first step on this CPU (dinov2_tiny the
slowest, 7.1 s and 7.7 s with AdamW); a second step at that batch took
under 0.01 to 0.21 s.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT18 = {
    "patchgan": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "eigen_depth": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "ssd_lite": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "roformer_v2_tiny": [
        ("base", 4),
        ("base", 10),
        ("mixed_bfloat16", 10),
    ],
    "dinov2_tiny": [
        ("base", 8),
        ("base", 32),
        ("adamw", 32),
    ],
    "deepar": [
        ("base", 64),
        ("base", 256),
        ("accumulation=4", 256),
    ],
    "afm": [
        ("base", 512),
        ("base", 1536),
        ("sgd_momentum", 1536),
    ],
    "memn2n": [
        ("base", 64),
        ("base", 192),
        ("accumulation=4", 192),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data).
VOCAB = 1000


def _patchgan():
    """(inputs, per-patch logits) of pix2pix's PatchGAN discriminator on
    a pair of 128x128x3 images."""
    import keras
    from keras import layers

    inputs = [keras.Input((128, 128, 3)), keras.Input((128, 128, 3))]
    x = layers.Concatenate()(inputs)  # (condition, image)
    for filters, norm in ((64, False), (128, True), (256, True)):
        x = layers.Conv2D(filters, 4, 2, "same", use_bias=not norm)(x)
        if norm:
            x = layers.BatchNormalization()(x)
        x = layers.LeakyReLU(0.2)(x)  # 64, 32, 16
    x = layers.ZeroPadding2D()(x)  # 18
    x = layers.Conv2D(512, 4, use_bias=False)(x)  # 15
    x = layers.LeakyReLU(0.2)(layers.BatchNormalization()(x))
    x = layers.ZeroPadding2D()(x)  # 17
    return inputs, layers.Conv2D(2, 4)(x)  # 14x14 patches, real / fake


def _eigen_depth():
    """(inputs, depth map) of Eigen et al.'s coarse-to-fine depth net on
    96x128x3."""
    import keras
    from keras import layers

    inp = keras.Input((96, 128, 3))
    # the coarse net: convolutions, then fully connected to a depth map
    x = layers.Conv2D(64, 11, 4, "same", activation="relu")(inp)  # 24x32
    x = layers.MaxPooling2D(2)(x)  # 12x16
    x = layers.Conv2D(192, 5, padding="same", activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)  # 6x8
    for filters in (256, 256, 192):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(0.5)(layers.Dense(512, activation="relu")(x))
    coarse = layers.Reshape((24, 32, 1))(layers.Dense(24 * 32)(x))
    # the fine net: the image's own features with the coarse map
    f = layers.Conv2D(63, 9, 2, "same", activation="relu")(inp)  # 48x64
    f = layers.MaxPooling2D(2)(f)  # 24x32
    f = layers.Concatenate()([f, coarse])
    f = layers.Conv2D(64, 5, padding="same", activation="relu")(f)
    return inp, layers.Conv2D(1, 5, padding="same")(f)  # 24x32x1


def _ssd_lite():
    """(inputs, class logits per anchor) of an SSD-like detector on
    128x128x3 with 21 classes and 4 anchors per cell."""
    import keras
    from keras import layers

    def cbr(x, filters, strides=1):
        x = layers.Conv2D(filters, 3, strides, "same", use_bias=False)(x)
        return layers.ReLU()(layers.BatchNormalization()(x))

    inp = keras.Input((128, 128, 3))
    x = inp
    heads = []
    for i, filters in enumerate((32, 64, 128, 256, 256)):  # 64 ... 4
        x = cbr(cbr(x, filters, 2), filters)
        if i >= 2:  # the 16x16, 8x8 and 4x4 maps each predict
            h = layers.Conv2D(4 * 21, 3, padding="same")(x)
            heads.append(layers.Reshape((-1, 21))(h))
    return inp, layers.Concatenate(axis=1)(heads)  # 1344 anchors


def _deepar():
    """(inputs, next values) of a DeepAR-like LSTM forecaster over 96
    steps."""
    import keras
    from keras import layers
    from keras import ops

    steps = 96
    values = keras.Input((steps, 8), name="values")  # lagged value, covariates
    series = keras.Input((1,), dtype="int32", name="series")
    e = layers.Embedding(VOCAB, 16)(series)  # (batch, 1, 16)
    e = ops.repeat(e, steps, axis=1)
    x = layers.Concatenate()([values, e])
    x = layers.LSTM(128, return_sequences=True)(x)
    x = layers.LSTM(128, return_sequences=True)(x)
    return {"values": values, "series": series}, layers.Dense(1)(x)


def _afm():
    """(inputs, logits) of an attentional factorization machine on 26
    categorical fields."""
    import itertools

    import keras
    from keras import layers
    from keras import ops

    fields, dim = 26, 16
    inp = keras.Input((fields,), dtype="int32")
    ids = inp + ops.arange(fields, dtype="int32")[None] * VOCAB
    e = layers.Embedding(fields * VOCAB, dim)(ids)  # (batch, 26, 16)
    left, right = zip(*itertools.combinations(range(fields), 2))
    pairs = ops.take(e, list(left), axis=1) * ops.take(e, list(right), axis=1)
    a = layers.Dense(32, activation="relu")(pairs)  # (batch, 325, 32)
    a = ops.softmax(ops.squeeze(layers.Dense(1)(a), -1), axis=-1)
    pooled = ops.sum(pairs * a[:, :, None], axis=1)  # (batch, 16)
    pooled = layers.Dropout(0.2)(pooled)
    first = ops.sum(layers.Embedding(fields * VOCAB, 2)(ids), axis=1)
    return inp, layers.Add()([layers.Dense(2)(pooled), first])


def _memn2n():
    """(inputs, answer logits) of an end-to-end memory network: 50
    sentences of 12 words, a 12-word question, 3 hops."""
    import keras
    import numpy as np
    from keras import layers
    from keras import ops

    sentences, words, dim, hops = 50, 12, 64, 3
    story = keras.Input((sentences, words), dtype="int32", name="story")
    query = keras.Input((words,), dtype="int32", name="query")
    # position encoding (Sukhbaatar et al. 2015, section 4.1)
    j = np.arange(1, words + 1)[:, None] / words
    k = np.arange(1, dim + 1)[None, :] / dim
    enc = ops.convert_to_tensor((1 - j) - k * (1 - 2 * j), "float32")

    class Temporal(layers.Layer):  # a learned vector per sentence
        def build(self, shape):
            self.vectors = self.add_weight(
                shape=(sentences, dim), initializer="zeros"
            )

        def call(self, m):
            return m + self.vectors[None]

        def compute_output_shape(self, shape):
            return shape

    def memory(emb):
        m = ops.sum(emb(story) * enc, axis=2)  # (batch, 50, 64)
        return Temporal()(m)

    # adjacent tying: hop k's output embedding is hop k+1's input one
    embs = [layers.Embedding(VOCAB, dim) for _ in range(hops + 1)]
    u = ops.sum(embs[0](query) * enc, axis=1)  # B = A_1
    mems = [memory(e) for e in embs]
    for hop in range(hops):
        p = ops.softmax(ops.einsum("bsd,bd->bs", mems[hop], u), axis=-1)
        u = u + ops.einsum("bs,bsd->bd", p, mems[hop + 1])
    return {"story": story, "query": query}, layers.Dense(VOCAB)(u)


def build_heldout18(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "patchgan":
        inp, logits = _patchgan()
        return inp, logits, True
    if name == "eigen_depth":
        inp, depth = _eigen_depth()
        return inp, depth, False
    if name == "ssd_lite":
        inp, logits = _ssd_lite()
        return inp, logits, True
    if name == "roformer_v2_tiny":
        import keras_hub

        backbone = keras_hub.models.RoformerV2Backbone(
            vocabulary_size=VOCAB * 4,
            num_layers=4,
            num_heads=8,
            hidden_dim=256,
            intermediate_dim=1024,
            head_size=32,
        )
        inputs = {
            kind: keras.Input((128,), dtype="int32", name=kind)
            for kind in ("token_ids", "segment_ids")
        }
        h = backbone(inputs)
        # the masked-LM head, tied: the token embedding reversed, at
        # every token
        logits = backbone.token_embedding(h, reverse=True)
        logits = layers.Activation("linear", dtype="float32")(logits)
        return inputs, logits, True
    if name == "dinov2_tiny":
        import keras_hub

        backbone = keras_hub.models.DINOV2Backbone(
            patch_size=8,
            num_layers=4,
            hidden_dim=192,
            num_heads=3,
            intermediate_dim=768,
            num_register_tokens=4,
            image_shape=(64, 64, 3),
            position_embedding_shape=(64, 64, 3),
        )
        inp = keras.Input((64, 64, 3), name="images")
        h = backbone({"images": inp})
        return inp, layers.Dense(10)(h[:, 0]), True  # the class token
    if name == "deepar":
        inp, values = _deepar()
        return inp, values, False
    if name == "afm":
        inp, logits = _afm()
        return inp, logits, True
    if name == "memn2n":
        inp, logits = _memn2n()
        return inp, logits, True
    raise ValueError(name)
