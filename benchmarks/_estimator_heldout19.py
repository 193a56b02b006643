"""The estimator's nineteenth held-out set (issue #23).

The first eighteen held-out sets (`_estimator_heldout.py` to
`_estimator_heldout18.py`) have each been seen or measured, so none
judges the rules unseen any more. This set is their successor: model
families in none of the design set or the earlier sets. The design
set's and the first seventeen sets' families are listed in
`_estimator_heldout18.py`'s docstring; the eighteenth set's are
pix2pix's PatchGAN discriminator, Eigen et al.'s coarse-to-fine depth
net, an SSD-like detector, keras-hub's RoFormerV2 and DINOv2, a
DeepAR-like LSTM, AFM and an end-to-end memory network. This set was
fixed in this file and committed before any case was measured; its
batch sizes come from the models' arithmetic (weights, layer outputs
per sample, a hand count of what the layers hold inside), not from the
estimate. Its cases are measured without an estimate; the set is
estimated once (`--heldout19 --reestimate`) after the estimator's
rules are final. The families were chosen for kind and for a first
step that is fast on a CPU, not for what the estimator might get right
or wrong (keras-hub's HGNetV2 and Qwen3.5, first considered, were left
out because their first training step took 25 to 35 s on this CPU at a
batch of 4). Why each family is new:

- `stn`: a spatial transformer network (Jaderberg et al. 2015) on
  96x96x3: a localization net (max pooling, 5x5 convolutions of 32 and
  64 with max pooling to 12x12, a dense layer of 64 and one to the 6
  affine parameters, starting at the identity), an affine grid of
  64x64 points and a bilinear sampler (the four neighbours of each
  point gathered from the flattened image and weighted), then a
  classifier (3x3 convolutions of 64, 128 and 256 with
  BatchNormalization and ReLU, max pooling between, global average
  pooling, 10 logits). No set samples its own input at coordinates a
  layer computes; the sets gather only embedding rows, patches or
  points at fixed indices.
- `rednet_mini`: a RedNet-like net (Li et al. 2021) on 64x64x3: a
  stem (a stride-2 3x3 convolution of 32 and a 3x3 convolution of 64
  with BatchNormalization and ReLU, 3x3 max pooling to 16x16) and four
  bottlenecks (1x1 convolution, involution, 1x1 convolution; 32 wide
  to 128 at 16x16, 64 wide to 256 at 8x8, the first of those of stride
  2), then global average pooling and 10 logits. Each involution
  generates a 7x7 kernel per pixel and group of 16 channels from the
  pixel (a 1x1 reduction by 4 with BatchNormalization and ReLU, a 1x1
  convolution to 49 weights a group) and applies it to the pixel's
  neighbourhood (keras-io's Involution layer, the 49 shifted slices
  stacked instead of `extract_patches`). The convolutional nets of the
  sets share their kernels over the image (dynamic ones only as
  attention over channels or branches, in SKNet and CBAM); none
  computes a spatial kernel for each pixel.
- `vitdet_tiny`: keras-hub's `ViTDetBackbone` from a tiny config (no
  download: 8x8 patches of a 128x128x3 image, 4 layers, 3 heads, 192
  wide, 768 in the MLP, 8x8 windows in layers 0 and 2 and global
  attention in layers 1 and 3, decomposed relative positions, a
  convolutional neck to 128 channels), global average pooling and 10
  logits. keras-io's ViT and the sets' other vision transformers
  attend globally, Swin attends in shifted windows of a hierarchy; no
  set has a plain single-scale ViT that alternates unshifted windows
  with global blocks and adds relative position terms per axis.
- `esm2_tiny`: keras-hub's `ESM2Backbone` (the protein language model)
  from a tiny config (no download: 4 layers, 8 heads, 256 wide, 1024
  in the GELU feed-forward layer, pre-layer-norm, rotary positions,
  dropout 0.1, a 1000-token vocabulary: the harness draws ids from
  [0, 1000)) over 128 tokens, and ESM's masked-LM head shape (a dense
  layer of 256 with GELU, a layer norm and a dense layer to the 1000
  tokens, untied) at every token, float32 logits. No set has ESM's
  encoder; the rotary encoder of set 18, RoFormerV2, is post-norm with
  RMS norms and no biases.
- `pointer_net`: a pointer network (Vinyals et al. 2015) on 32 points
  in the plane: an LSTM encoder of 256, an LSTM decoder of 256 started
  from the encoder's state and fed the previous point of the target
  order (teacher forcing), and additive attention (the decoder and
  encoder states projected to 128, summed for every pair, tanh and one
  score) whose 32 x 32 scores are the logits over the input positions
  (a sparse label per decoder step). The encoder-decoders of the sets
  attend to build a context and predict tokens from a vocabulary; none
  outputs the attention scores themselves as the prediction.
- `ffm`: a field-aware factorization machine (Juan et al. 2016) on 26
  categorical fields: per feature a 4-wide vector for each of the 26
  fields (one 104-wide embedding row, 26 x 1000 rows), the inner
  product of feature i's vector for field j with feature j's vector
  for field i for each of the 325 pairs (the lookups times their
  transpose, the upper triangle summed), a first-order term (a 1-wide
  embedding per field row, summed) and a dense layer from the score to
  2 logits. DeepFM, AFM, IPNN and the other factorization models of the
  sets give each feature one vector for all pairs; none gives a
  feature a vector per field it meets.
- `conve`: ConvE (Dettmers et al. 2018), a knowledge-graph link
  predictor: a subject entity's and a relation's 200-wide embeddings
  (4000 entities, 1000 relations) reshaped to 10x20 and stacked to a
  20x20 image, BatchNormalization and dropout, a 3x3 convolution of 32
  (18x18) with BatchNormalization, ReLU and dropout, a dense layer to
  200 with dropout, BatchNormalization and ReLU, and scores against
  every entity's embedding (the entity table reversed, tied) plus a
  bias per entity: logits over the 4000 entities. The sets' embedding
  models classify, rank items or interact fields; none scores a
  relation against every entity of a table, nor convolves reshaped
  embeddings.
- `fno`: a 2-D Fourier neural operator (Li et al. 2021) on a 64x64
  grid (a coefficient field and the two coordinates): a dense lift to
  32 channels, 4 Fourier layers (the 2-D FFT of the channels, the 12 x
  12 lowest modes at both signs of the first frequency each multiplied
  by a learned complex 32 x 32 matrix, the other modes zero, the
  inverse FFT's real part; plus a 1x1 dense path; GELU between) and a
  dense projection through 128 to the solution field (MSE). FNet mixes
  tokens by a fixed FFT; no set learns weights in the frequency domain
  or maps a field to a field through its spectrum.

Variants: `base` (Adam) at two batch sizes, and at the larger one one
of `adamw` (AdamW, on `fno`), `sgd_momentum` (SGD, momentum 0.9, on
`ffm`), `accumulation=4` (Adam, on `pointer_net` and `conve`),
`checkpointing=auto` (Adam, on `stn`, `rednet_mini` and
`vitdet_tiny`) and `mixed_bfloat16` (Adam, on `esm2_tiny`); 24 cases.
Rough arithmetic behind the batch sizes (float32; weights from
`count_params()`, "outputs" the sum of the Keras layers' outputs per
sample, a keras-hub backbone or a custom layer counted as one layer,
plus a hand count where given; Adam keeps 4 words per weight with the
gradient): stn 1.02M weights (16 MiB with Adam), outputs 6.3 MiB per
sample (the 64x64x64 convolution, BatchNormalization and ReLU, 1 MiB
each, the 32x32x128 ones, 512 KiB each, the 16x16x256 ones, 256 KiB
each, the localization net's 48x48x32 and 24x24x64 maps, 288 and 144
KiB), about 6.6 MiB by hand with the sampler's four
gathered 64x64x3 images and their weights, 48 KiB each;
rednet_mini 0.15M weights (2 MiB), outputs 3.8 MiB per sample with
each involution as one layer, about 13 MiB by hand (each
involution's 49 stacked slices and their product with the kernels,
1.53 MiB each at 16x16 with 32 channels and 0.77 MiB at 8x8 with 64,
9.2 MiB for the four); vitdet_tiny 2.05M weights (31 MiB), outputs
0.13 MiB per sample with the backbone as one, about 18 MiB by hand
(256 tokens: per windowed layer the 3 x 4 windows x 64 x 64 scores,
192 KiB, about three times, the 256 x 576 projection, 576 KiB, the
256 x 768 MLP map, 768 KiB, twice, and the 256 x 192 maps, 192 KiB,
about eight times: about 3.5 MiB; per global layer the 3 x 256 x 256
scores, 768 KiB, about three times more: about 5.3 MiB; the neck's
16x16x128 maps); esm2_tiny 3.74M weights (57 MiB), outputs 1.35 MiB
per sample with the backbone as one (the 128 x 1000 logits and their
float32 copy, 500 KiB each), about 22 MiB by hand (per layer the 8 x
128 x 128 scores, 512 KiB, about four times with the mask, softmax and
dropout, the 128 x 1024 feed-forward map, 512 KiB, about three times,
and the 128 x 256 projections, rotary products, norms and residuals,
128 KiB, about twelve times: about 5 MiB a layer, and the head and
the loss's softmax); pointer_net 0.60M weights (9 MiB), outputs 1.14
MiB per sample (the 32 x 32 x 128 sum and its tanh, 512 KiB each),
about 1.6 MiB by hand with each LSTM's gates and states at each of
the 32 steps (about 8 x 256 words a step, 256 KiB a layer); ffm 2.73M
weights (42 MiB), outputs 0.05 MiB per sample (the 26 x 104 lookups,
their transpose and product, 10.6 KiB each), about 0.06 MiB by hand
with the lookups' sparse gradient; conve 3.08M weights (47 MiB),
outputs 0.24 MiB per sample (the 18x18x32 maps, 40.5 KiB, four times
with BatchNormalization, ReLU and dropout, the flattened copy, and the
4000 logits, 15.6 KiB, with the bias); fno 2.37M weights (36 MiB with
AdamW too), outputs 10.0 MiB per sample with each spectral
convolution as one layer (the 64x64x32 maps, 512 KiB each), about 50
MiB by hand (per spectral convolution the transposes, 512 KiB each,
the complex input and output of each FFT, 1 MiB each, their real and
imaginary parts and the two padded corners' spectra, 512 KiB each:
about 10 MiB). Weights with Adam plus outputs (by hand where given)
times the larger batch: stn about 227 MiB at 32, rednet_mini 314 at
24, vitdet_tiny 175 at 8, esm2_tiny 277 at 10, pointer_net 316 at 192,
ffm 288 at 4096, conve 231 at 768, fno 336 at 6; a sum of every
forward op's float output at a batch of 1 (what TensorFlow's graph
makes, GELU's and BatchNormalization's pieces included) is larger for
the transformers and the FNO (vitdet_tiny 58, esm2_tiny 51, fno 83 MiB
per sample), so their batches were kept lower; these peaks should
mostly fall between about 30 and 450 MiB, and at the smaller batch
lower. A 2-step smoke run of every family in every variant at a batch
of 4, without reading memory and with no estimate, took 0.5 to 15.0 s
to build, compile and run the first step on this CPU while another
job used one of its two cores (rednet_mini the slowest, 13.6 s and
15.0 s with checkpointing); a second step at that batch took 0.01 to
0.43 s.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT19 = {
    "stn": [
        ("base", 8),
        ("base", 32),
        ("checkpointing=auto", 32),
    ],
    "rednet_mini": [
        ("base", 8),
        ("base", 24),
        ("checkpointing=auto", 24),
    ],
    "vitdet_tiny": [
        ("base", 2),
        ("base", 8),
        ("checkpointing=auto", 8),
    ],
    "esm2_tiny": [
        ("base", 4),
        ("base", 10),
        ("mixed_bfloat16", 10),
    ],
    "pointer_net": [
        ("base", 64),
        ("base", 192),
        ("accumulation=4", 192),
    ],
    "ffm": [
        ("base", 1024),
        ("base", 4096),
        ("sgd_momentum", 4096),
    ],
    "conve": [
        ("base", 256),
        ("base", 768),
        ("accumulation=4", 768),
    ],
    "fno": [
        ("base", 2),
        ("base", 6),
        ("adamw", 6),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data).
VOCAB = 1000


def _stn():
    """(inputs, logits) of a spatial transformer network: a localization
    net, an affine grid and a bilinear sampler from 96x96x3 to 64x64x3,
    then a classifier CNN."""
    import keras
    import numpy as np
    from keras import layers
    from keras import ops

    size_in, size_out = 96, 64

    class BilinearSampler(layers.Layer):
        """Samples `image` at the affine grid `theta` (batch, 6) maps
        the output's normalized coordinates to (Jaderberg et al. 2015)."""

        def call(self, image, theta):
            batch = ops.shape(image)[0]
            lin = np.linspace(-1.0, 1.0, size_out)
            gx, gy = np.meshgrid(lin, lin)
            grid = np.stack([gx.ravel(), gy.ravel(), np.ones(gx.size)])
            grid = ops.convert_to_tensor(grid, "float32")  # (3, 4096)
            t = ops.einsum("bij,jn->bin", ops.reshape(theta, (-1, 2, 3)), grid)
            x = (t[:, 0] + 1.0) * (size_in - 1) / 2.0  # (batch, 4096)
            y = (t[:, 1] + 1.0) * (size_in - 1) / 2.0
            x0, y0 = ops.floor(x), ops.floor(y)
            x1, y1 = x0 + 1.0, y0 + 1.0
            top = size_in - 1.0
            x0, x1 = ops.clip(x0, 0.0, top), ops.clip(x1, 0.0, top)
            y0, y1 = ops.clip(y0, 0.0, top), ops.clip(y1, 0.0, top)
            flat = ops.reshape(image, (-1, 3))  # (batch * 96 * 96, 3)
            offset = ops.arange(batch, dtype="int32")[:, None] * size_in**2

            def pixels(yy, xx):
                idx = ops.cast(yy * size_in + xx, "int32") + offset
                return ops.take(flat, idx, axis=0)  # (batch, 4096, 3)

            out = (
                pixels(y0, x0) * ((x1 - x) * (y1 - y))[..., None]
                + pixels(y1, x0) * ((x1 - x) * (y - y0))[..., None]
                + pixels(y0, x1) * ((x - x0) * (y1 - y))[..., None]
                + pixels(y1, x1) * ((x - x0) * (y - y0))[..., None]
            )
            return ops.reshape(out, (-1, size_out, size_out, 3))

        def compute_output_shape(self, image_shape, theta_shape):
            return (image_shape[0], size_out, size_out, 3)

    inp = keras.Input((size_in, size_in, 3))
    # the localization net, its last layer starting at the identity
    loc = layers.MaxPooling2D(2)(inp)  # 48
    loc = layers.Conv2D(32, 5, padding="same", activation="relu")(loc)
    loc = layers.MaxPooling2D(2)(loc)  # 24
    loc = layers.Conv2D(64, 5, padding="same", activation="relu")(loc)
    loc = layers.MaxPooling2D(2)(loc)  # 12
    loc = layers.Dense(64, activation="relu")(layers.Flatten()(loc))
    theta = layers.Dense(
        6,
        kernel_initializer="zeros",
        bias_initializer=keras.initializers.Constant([1, 0, 0, 0, 1, 0]),
    )(loc)
    x = BilinearSampler()(inp, theta)  # 64x64x3
    for filters in (64, 128, 256):  # 64, 32, 16
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
        x = layers.ReLU()(layers.BatchNormalization()(x))
        if filters != 256:
            x = layers.MaxPooling2D(2)(x)
    x = layers.GlobalAveragePooling2D()(x)
    return inp, layers.Dense(10)(x)


def _rednet_mini():
    """(inputs, logits) of a RedNet-like net of involution bottlenecks
    (7x7 kernels, 16 channels a group, reduction 4) on 64x64x3."""
    import keras
    from keras import layers
    from keras import ops

    k, group_channels = 7, 16

    class Involution(layers.Layer):
        """Li et al. 2021: a k x k kernel per pixel and group, generated
        from the pixel, applied to its neighbourhood (keras-io's
        Involution layer, the patches taken by shifted slices)."""

        def __init__(self, channels, stride=1, **kwargs):
            super().__init__(**kwargs)
            self.channels, self.stride = channels, stride
            self.groups = channels // group_channels
            self.reduce = layers.Conv2D(channels // 4, 1, use_bias=False)
            self.norm = layers.BatchNormalization()
            self.span = layers.Conv2D(k * k * self.groups, 1)
            self.pool = layers.AveragePooling2D(stride) if stride > 1 else None

        def call(self, x):
            h, w = x.shape[1] // self.stride, x.shape[2] // self.stride
            g = self.pool(x) if self.pool else x
            kernel = self.span(ops.relu(self.norm(self.reduce(g))))
            kernel = ops.reshape(kernel, (-1, h, w, k * k, self.groups, 1))
            pad = k // 2
            xp = ops.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
            s = self.stride
            patches = ops.stack(
                [
                    xp[:, dy : dy + h * s : s, dx : dx + w * s : s]
                    for dy in range(k)
                    for dx in range(k)
                ],
                axis=3,
            )  # (batch, h, w, k * k, channels)
            patches = ops.reshape(
                patches, (-1, h, w, k * k, self.groups, group_channels)
            )
            out = ops.sum(kernel * patches, axis=3)
            return ops.reshape(out, (-1, h, w, self.channels))

        def compute_output_shape(self, shape):
            s = self.stride
            return (shape[0], shape[1] // s, shape[2] // s, self.channels)

    def bottleneck(x, mid, out, stride=1):
        shortcut = x
        if stride > 1 or x.shape[-1] != out:
            if stride > 1:
                shortcut = layers.AveragePooling2D(stride)(shortcut)
            shortcut = layers.Conv2D(out, 1, use_bias=False)(shortcut)
            shortcut = layers.BatchNormalization()(shortcut)
        h = layers.Conv2D(mid, 1, use_bias=False)(x)
        h = layers.ReLU()(layers.BatchNormalization()(h))
        h = Involution(mid, stride)(h)
        h = layers.ReLU()(layers.BatchNormalization()(h))
        h = layers.Conv2D(out, 1, use_bias=False)(h)
        h = layers.BatchNormalization()(h)
        return layers.ReLU()(layers.Add()([h, shortcut]))

    inp = keras.Input((64, 64, 3))
    x = layers.Conv2D(32, 3, 2, "same", use_bias=False)(inp)  # 32
    x = layers.ReLU()(layers.BatchNormalization()(x))
    x = layers.Conv2D(64, 3, padding="same", use_bias=False)(x)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    x = layers.MaxPooling2D(3, 2, "same")(x)  # 16
    x = bottleneck(x, 32, 128)
    x = bottleneck(x, 32, 128)
    x = bottleneck(x, 64, 256, stride=2)  # 8
    x = bottleneck(x, 64, 256)
    x = layers.GlobalAveragePooling2D()(x)
    return inp, layers.Dense(10)(x)


def _pointer_net():
    """(inputs, logits over the input positions at each decoder step) of
    a pointer network on 32 points in the plane."""
    import keras
    from keras import layers
    from keras import ops

    n = 32
    points = keras.Input((n, 2), name="points")
    # teacher forcing: the points in the target order, one step behind
    previous = keras.Input((n, 2), name="previous")
    enc, h, c = layers.LSTM(256, return_sequences=True, return_state=True)(
        points
    )
    dec = layers.LSTM(256, return_sequences=True)(
        previous, initial_state=[h, c]
    )
    e = layers.Dense(128, use_bias=False)(enc)  # W1 e_j
    d = layers.Dense(128, use_bias=False)(dec)  # W2 d_i
    u = ops.tanh(d[:, :, None, :] + e[:, None, :, :])  # (batch, 32, 32, 128)
    logits = ops.squeeze(layers.Dense(1, use_bias=False)(u), -1)
    return {"points": points, "previous": previous}, logits


def _ffm():
    """(inputs, logits) of a field-aware factorization machine on 26
    categorical fields, 4 factors per field pair."""
    import keras
    import numpy as np
    from keras import layers
    from keras import ops

    fields, factors = 26, 4
    inp = keras.Input((fields,), dtype="int32")
    ids = inp + ops.arange(fields, dtype="int32")[None] * VOCAB
    # row i of a sample: feature i's vector for each of the 26 fields
    v = layers.Embedding(fields * VOCAB, fields * factors)(ids)
    v = ops.reshape(v, (-1, fields, fields, factors))
    # <v_{i, field j}, v_{j, field i}> for every pair, i < j counted
    pairs = ops.sum(v * ops.transpose(v, (0, 2, 1, 3)), axis=-1)
    upper = ops.convert_to_tensor(np.triu(np.ones((fields, fields)), 1))
    second = ops.sum(pairs * ops.cast(upper, pairs.dtype), axis=(1, 2))
    first = ops.sum(layers.Embedding(fields * VOCAB, 1)(ids), axis=(1, 2))
    score = (first + second)[:, None]
    return inp, layers.Dense(2)(score)  # the global bias, 2 logits


def _conve():
    """(inputs, logits over 4000 entities) of ConvE: the subject's and
    the relation's embeddings as a 20x20 image, convolved, projected and
    scored against every entity's embedding."""
    import keras
    from keras import layers

    entities, dim = 4 * VOCAB, 200

    class Bias(layers.Layer):  # a bias per entity
        def build(self, shape):
            self.b = self.add_weight(shape=(shape[-1],), initializer="zeros")

        def call(self, x):
            return x + self.b

    subject = keras.Input((1,), dtype="int32", name="subject")
    relation = keras.Input((1,), dtype="int32", name="relation")
    ent = layers.ReversibleEmbedding(entities, dim)  # tied
    es = layers.Reshape((10, 20, 1))(ent(subject))
    er = layers.Reshape((10, 20, 1))(layers.Embedding(VOCAB, dim)(relation))
    x = layers.Concatenate(axis=1)([es, er])  # 20x20x1
    x = layers.Dropout(0.2)(layers.BatchNormalization()(x))
    x = layers.Conv2D(32, 3)(x)  # 18x18x32
    x = layers.ReLU()(layers.BatchNormalization()(x))
    x = layers.Dropout(0.2)(x)
    x = layers.Dense(dim)(layers.Flatten()(x))
    x = layers.Dropout(0.3)(x)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    logits = Bias()(ent(x, reverse=True))
    return {"subject": subject, "relation": relation}, logits


def _fno():
    """(inputs, solution field) of a 2-D Fourier neural operator on a
    64x64 grid: 4 Fourier layers of width 32 keeping 12 x 12 modes."""
    import keras
    from keras import layers
    from keras import ops

    width, modes, grid = 32, 12, 64

    class SpectralConv(layers.Layer):
        """The FFT of the channels, the lowest modes (both signs of the
        first frequency, the non-negative second one) multiplied by a
        learned complex matrix each, the rest zero, the inverse FFT's
        real part (Li et al. 2021)."""

        def build(self, shape):
            size = (2, width, width, modes, modes)  # the two corners
            init = keras.initializers.RandomUniform(0, 1 / width**2)
            self.w_re = self.add_weight(shape=size, initializer=init)
            self.w_im = self.add_weight(shape=size, initializer=init)

        def call(self, x):
            x = ops.transpose(x, (0, 3, 1, 2))  # (batch, c, 64, 64)
            re, im = ops.fft2((x, ops.zeros_like(x)))
            out_re, out_im = [], []
            for corner, rows in enumerate(
                (slice(0, modes), slice(-modes, None))
            ):
                a_re, a_im = re[:, :, rows, :modes], im[:, :, rows, :modes]
                w_re, w_im = self.w_re[corner], self.w_im[corner]
                b_re = ops.einsum("bixy,ioxy->boxy", a_re, w_re) - ops.einsum(
                    "bixy,ioxy->boxy", a_im, w_im
                )
                b_im = ops.einsum("bixy,ioxy->boxy", a_re, w_im) + ops.einsum(
                    "bixy,ioxy->boxy", a_im, w_re
                )
                top = (0, grid - modes) if corner == 0 else (grid - modes, 0)
                pad = [[0, 0], [0, 0], list(top), [0, grid - modes]]
                out_re.append(ops.pad(b_re, pad))
                out_im.append(ops.pad(b_im, pad))
            y, _ = ops.ifft2((out_re[0] + out_re[1], out_im[0] + out_im[1]))
            return ops.transpose(y, (0, 2, 3, 1))

        def compute_output_shape(self, shape):
            return shape[:-1] + (width,)

    inp = keras.Input((grid, grid, 3))  # the coefficient field, x, y
    x = layers.Dense(width)(inp)
    for i in range(4):
        x = layers.Add()([SpectralConv()(x), layers.Dense(width)(x)])
        if i < 3:
            x = layers.Activation("gelu")(x)
    x = layers.Dense(128, activation="gelu")(x)
    return inp, layers.Dense(1)(x)


def build_heldout19(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "stn":
        inp, logits = _stn()
        return inp, logits, True
    if name == "rednet_mini":
        inp, logits = _rednet_mini()
        return inp, logits, True
    if name == "vitdet_tiny":
        import keras_hub

        backbone = keras_hub.models.ViTDetBackbone(
            hidden_size=192,
            num_layers=4,
            intermediate_dim=768,
            num_heads=3,
            global_attention_layer_indices=[1, 3],
            image_shape=(128, 128, 3),
            patch_size=8,
            num_output_channels=128,
            window_size=8,
        )
        inp = keras.Input((128, 128, 3), name="images")
        h = layers.GlobalAveragePooling2D()(backbone(inp))  # 16x16x128
        return inp, layers.Dense(10)(h), True
    if name == "esm2_tiny":
        import keras_hub

        backbone = keras_hub.models.ESM2Backbone(
            vocabulary_size=VOCAB,
            num_layers=4,
            num_heads=8,
            hidden_dim=256,
            intermediate_dim=1024,
            use_pre_layer_norm=True,
            layer_norm_eps=1e-5,
        )
        inp = keras.Input((128,), dtype="int32", name="token_ids")
        h = backbone({"token_ids": inp})
        # ESM's masked-LM head (untied), at every token
        h = layers.Dense(256, activation="gelu")(h)
        h = layers.LayerNormalization(epsilon=1e-5)(h)
        logits = layers.Activation("linear", dtype="float32")(
            layers.Dense(VOCAB)(h)
        )
        return inp, logits, True
    if name == "pointer_net":
        inp, logits = _pointer_net()
        return inp, logits, True
    if name == "ffm":
        inp, logits = _ffm()
        return inp, logits, True
    if name == "conve":
        inp, logits = _conve()
        return inp, logits, True
    if name == "fno":
        inp, field = _fno()
        return inp, field, False
    raise ValueError(name)
