"""The estimator's twentieth held-out set (issue #23).

The first nineteen held-out sets (`_estimator_heldout.py` to
`_estimator_heldout19.py`) have each been seen or measured, so none
judges the rules unseen any more. This set is their successor: model
families in none of the design set or the earlier sets. The design
set's and the first seventeen sets' families are listed in
`_estimator_heldout18.py`'s docstring, the eighteenth set's there too
and the nineteenth set's in `_estimator_heldout19.py`'s: a spatial
transformer network, a RedNet-like involution net, keras-hub's ViTDet
and ESM-2, a pointer network, a field-aware factorization machine,
ConvE and a Fourier neural operator. This set was fixed in this file
and committed before any case was measured; its batch sizes come from
the models' arithmetic (weights, layer outputs per sample, a hand
count of what the layers hold inside), not from the estimate. Its
cases are measured without an estimate; the set is estimated once
(`--heldout20 --reestimate`) after the estimator's rules are final.
The families were chosen for kind and for a first step that is fast
on a CPU, not for what the estimator might get right or wrong. Why
each family is new:

- `repvgg_mini`: a RepVGG-like net (Ding et al. 2021) in its training
  form on 64x64x3: every block a 3x3 and a 1x1 convolution, each with
  BatchNormalization, plus a BatchNormalization of the identity where
  the shapes allow, summed and ReLU'd (48 channels at 32x32, then 2
  blocks of 64 at 16x16, 4 of 128 at 8x8 and 1 of 256 at 4x4, the
  first of each stride 2), global average pooling and 10 logits. The
  residual nets of the sets add one convolutional branch to a plain
  shortcut; none sums parallel 3x3, 1x1 and identity branches, each
  normalized on its own, in every block of a VGG-like stack.
- `erfnet_mini`: an ERFNet-like segmentation net (Romera et al. 2017)
  on 128x128x3 with 5 classes: downsampler blocks (a stride-2 3x3
  convolution concatenated with max pooling of the input,
  BatchNormalization, ReLU) to 16, 64 and 128 channels at 64x64, 32x32
  and 16x16, factorized residual blocks (3x1 and 1x3 convolutions,
  twice, the second pair dilated by 1 at 32x32 and by 2, 4, 8 and 2 at
  16x16, with BatchNormalization and dropout), two transposed
  convolutions back up with one factorized block each, and a
  transposed convolution to the 128x128x5 logits (a sparse label per
  pixel). No set factorizes its 3x3 convolutions into 3x1 and 1x3
  ones, nor downsamples by concatenating a convolution with pooling.
- `octconv_net`: a classifier of octave convolutions (Chen et al.
  2019, alpha 0.5) on 64x64x3: half of each layer's channels kept at
  half the resolution, each octave convolution four 3x3 convolutions
  (high to high, low to high upsampled, high average-pooled to low,
  low to low) summed per resolution with BatchNormalization and ReLU;
  32, 64 and 64 channels at 64x64 / 32x32, max pooling, 128 and 128
  at 32x32 / 16x16, max pooling, a last one to 256 channels at 16x16
  only, global average pooling and 10 logits. The multi-resolution
  nets of the sets (HRNet, FPN, the hourglass) keep whole branches
  per scale; none splits every layer's channels between two
  resolutions that exchange information in each convolution.
- `deit_tiny`: keras-hub's `DeiTBackbone` from a tiny config (no
  download: 8x8 patches of a 96x96x3 image, 4 layers, 3 heads, 192
  wide, 768 in the MLP) and DeiT's two heads (a dense layer to 10
  logits on the class token and one on the distillation token,
  averaged). No set has DeiT's encoder, nor a vision transformer with
  a distillation token and a head on it.
- `qwen3_tiny`: keras-hub's `Qwen3Backbone` from a tiny config (no
  download: 4 layers, 8 query heads and 2 key-value heads of 32, 256
  wide, 768 in the gated feed-forward layer, a 1000-token vocabulary)
  over 128 tokens with a padding mask, and the language-model head
  tied to the token embedding (float32 logits at every token). The
  decoders of the sets (GPT-2, Gemma, Falcon, Mixtral, Llama, OPT,
  GPT-NeoX, Phi-3, Qwen2, Mistral and others) normalize no queries and
  keys; Qwen3 applies an RMS norm to each head's queries and keys
  before the rotary positions.
- `clockwork_rnn`: a clockwork RNN (Koutnik et al. 2014) over 128
  steps of 32 features: a custom cell in `keras.layers.RNN` of 256
  tanh units in 8 modules of 32 with periods 1, 2, 4, ..., 128, a
  module updating only at the steps its period divides and reading
  itself and the slower modules (a block upper-triangular recurrent
  matrix), and a dense layer from the last state to 10 logits. The
  recurrent nets of the sets (LSTM, GRU, Elman, IndRNN, QRNN,
  ConvLSTM, Mamba, RWKV and others) update every unit at every step
  with Keras's or their own cells; none keeps units unchanged on a
  schedule.
- `schnet`: SchNet (Schuett et al. 2017) on molecules of 32 atoms (a
  type id per atom, a 1000-row embedding of 64 since the harness draws
  ids from [0, 1000), and 3-D positions scaled to 0-8 A): the 32 x 32
  interatomic distances expanded in 64 Gaussians to 10 A with a cosine
  cutoff, 3 interaction blocks (a continuous-filter convolution, the
  filter from the expansion by two dense layers with shifted softplus,
  the neighbours' projected features weighted by it and summed, then
  atom-wise dense layers and a residual add), atom-wise dense layers
  to one energy per atom, summed (MSE). The graph nets of the sets
  (GCN, GAT, GIN, DGCNN) and PointNet take a given adjacency or learn
  from coordinates directly; none builds its filters from expanded
  distances.
- `autorec`: U-AutoRec (Sedhain et al. 2015): a user's ratings of 4000
  items through a sigmoid layer of 500 and a linear one back to the
  4000 items (MSE; the mask of observed ratings is left out, the
  harness trains one output with MSE). The recommenders of the sets
  (NCF, two towers, DeepFM, DIN, GRU4Rec, SASRec, Caser and others)
  embed ids; none reconstructs a user's whole rating vector.

Variants: `base` (Adam) at two batch sizes, and at the larger one one
of `adamw` (AdamW, on `deit_tiny`), `sgd_momentum` (SGD, momentum 0.9,
on `autorec`), `accumulation=4` (Adam, on `clockwork_rnn` and
`schnet`), `checkpointing=auto` (Adam, on `repvgg_mini`, `erfnet_mini`
and `octconv_net`) and `mixed_bfloat16` (Adam, on `qwen3_tiny`); 24
cases. Rough arithmetic behind the batch sizes (float32; weights from
`count_params()`, "outputs" the sum of the Keras layers' outputs per
sample, a keras-hub backbone or a custom layer or cell counted as one
layer, plus a hand count where given; Adam keeps 4 words per weight
with the gradient, SGD with momentum 3): repvgg_mini 0.99M weights (15
MiB with Adam), outputs 2.9 MiB per sample; erfnet_mini 1.12M weights
(17 MiB), outputs 21.5 MiB per sample; octconv_net 0.58M weights (9
MiB), outputs 12.6 MiB per sample; deit_tiny 1.85M weights (28 MiB
with AdamW too), outputs 0.21 MiB per sample with the backbone as one,
about 14 MiB by hand (146 tokens: per layer the 3 x 146 x 146 scores,
250 KiB, about three times, the 146 x 768 MLP map, 438 KiB, about
three times, the 146 x 576 projection and the 146 x 192 maps, 110 KiB,
about ten times: about 3.5 MiB a layer); qwen3_tiny 3.27M weights (50
MiB), outputs 0.74 MiB per sample with the backbone as one (the 128 x
1000 logits, 500 KiB), about 23 MiB by hand (per layer the 8 x 128 x
128 scores, 512 KiB, about four times, the 128 x 768 gate, up,
activation and product, 384 KiB each, and the 128 x 256 projections,
norms, rotary products and residuals, 128 KiB, about fourteen times:
about 5.3 MiB a layer, and the head and the loss's softmax);
clockwork_rnn 0.08M weights (1.3 MiB), outputs 0.02 MiB per sample
with the RNN as one, about 1.25 MiB by hand (about ten 256-wide
vectors a step kept for the backward pass, 10 KiB, at each of the 128
steps) plus the masked recurrent matrix, 256 KiB, possibly kept at
each step (32 MiB whatever the batch); schnet 0.13M weights (2 MiB),
outputs 0.36 MiB per sample with each continuous-filter convolution as
one layer, about 6.5 MiB by hand (the 32 x 32 x 64 expansion, 256 KiB,
about four times with its pieces, and per interaction block the two
filter layers with their shifted softplus and the weighted
neighbours, 256 KiB each, about seven times: about 1.8 MiB a block);
autorec 4.00M weights (61 MiB with Adam, 46 with SGD), outputs 0.03
MiB per sample, about 0.05 MiB by hand with the loss's difference and
square. Weights with Adam plus outputs (by hand where given) times the
larger batch: repvgg_mini about 155 MiB at 48, erfnet_mini 189 at 8,
octconv_net 210 at 16, deit_tiny 168 at 10, qwen3_tiny 280 at 10,
clockwork_rnn 161 (193 with the matrices) at 128, schnet 210 at 32,
autorec 163 at 2048; what TensorFlow's graph makes (BatchNormalization's
and GELU's pieces, the dilated convolutions' padding) is larger, so
these peaks should mostly fall between about 30 and 400 MiB, and at
the smaller batch lower. A 2-step smoke run of every family in every
variant at a batch of 4, without reading memory and with no estimate,
took 1.0 to 17.9 s to build, compile and run the first step on this
CPU while another job used one of its two cores (erfnet_mini the
slowest, 14.6 s and 17.9 s with checkpointing; the keras-hub backbones
7.0 to 9.3 s); a second step at that batch took 0.01 to 0.44 s.
"""

from __future__ import annotations

# name -> [(variant, batch), ...]
HELDOUT20 = {
    "repvgg_mini": [
        ("base", 12),
        ("base", 48),
        ("checkpointing=auto", 48),
    ],
    "erfnet_mini": [
        ("base", 2),
        ("base", 8),
        ("checkpointing=auto", 8),
    ],
    "octconv_net": [
        ("base", 4),
        ("base", 16),
        ("checkpointing=auto", 16),
    ],
    "deit_tiny": [
        ("base", 3),
        ("base", 10),
        ("adamw", 10),
    ],
    "qwen3_tiny": [
        ("base", 4),
        ("base", 10),
        ("mixed_bfloat16", 10),
    ],
    "clockwork_rnn": [
        ("base", 32),
        ("base", 128),
        ("accumulation=4", 128),
    ],
    "schnet": [
        ("base", 8),
        ("base", 32),
        ("accumulation=4", 32),
    ],
    "autorec": [
        ("base", 512),
        ("base", 2048),
        ("sgd_momentum", 2048),
    ],
}

# Integer ids are drawn from [0, VOCAB) (the inputs' data in
# estimator_accuracy._data).
VOCAB = 1000


def _repvgg_mini():
    """(inputs, logits) of a RepVGG-like net in its training form on
    64x64x3: blocks of a 3x3 and a 1x1 convolution, each with
    BatchNormalization, and an identity BatchNormalization where the
    shapes allow, summed and ReLU'd."""
    import keras
    from keras import layers

    def block(x, filters, stride=1):
        a = layers.Conv2D(filters, 3, stride, "same", use_bias=False)(x)
        b = layers.Conv2D(filters, 1, stride, use_bias=False)(x)
        branches = [
            layers.BatchNormalization()(a),
            layers.BatchNormalization()(b),
        ]
        if stride == 1 and x.shape[-1] == filters:
            branches.append(layers.BatchNormalization()(x))
        return layers.ReLU()(layers.Add()(branches))

    inp = keras.Input((64, 64, 3))
    x = block(inp, 48, 2)  # 32x32
    for filters, depth in ((64, 2), (128, 4), (256, 1)):  # 16, 8, 4
        x = block(x, filters, 2)
        for _ in range(depth - 1):
            x = block(x, filters)
    x = layers.GlobalAveragePooling2D()(x)
    return inp, layers.Dense(10)(x)


def _erfnet_mini():
    """(inputs, per-pixel logits) of an ERFNet-like segmentation net on
    128x128x3 with 5 classes: downsampler blocks and factorized
    (3x1, 1x3) residual blocks, transposed convolutions back up."""
    import keras
    from keras import layers

    def down(x, filters):
        conv = layers.Conv2D(filters - x.shape[-1], 3, 2, "same")(x)
        pool = layers.MaxPooling2D(2)(x)
        x = layers.Concatenate()([conv, pool])
        return layers.ReLU()(layers.BatchNormalization(epsilon=1e-3)(x))

    def non_bt_1d(x, dilation, drop):
        c = x.shape[-1]
        h = layers.Conv2D(c, (3, 1), padding="same", activation="relu")(x)
        h = layers.Conv2D(c, (1, 3), padding="same")(h)
        h = layers.ReLU()(layers.BatchNormalization(epsilon=1e-3)(h))
        h = layers.Conv2D(
            c,
            (3, 1),
            padding="same",
            dilation_rate=(dilation, 1),
            activation="relu",
        )(h)
        h = layers.Conv2D(
            c, (1, 3), padding="same", dilation_rate=(1, dilation)
        )(h)
        h = layers.BatchNormalization(epsilon=1e-3)(h)
        if drop:
            h = layers.Dropout(drop)(h)
        return layers.ReLU()(layers.Add()([h, x]))

    def up(x, filters):
        x = layers.Conv2DTranspose(filters, 3, 2, "same")(x)
        return layers.ReLU()(layers.BatchNormalization(epsilon=1e-3)(x))

    inp = keras.Input((128, 128, 3))
    x = down(inp, 16)  # 64x64
    x = down(x, 64)  # 32x32
    for _ in range(3):
        x = non_bt_1d(x, 1, 0.03)
    x = down(x, 128)  # 16x16
    for dilation in (2, 4, 8, 2):
        x = non_bt_1d(x, dilation, 0.3)
    x = up(x, 64)  # 32x32
    x = non_bt_1d(x, 1, 0)
    x = up(x, 16)  # 64x64
    x = non_bt_1d(x, 1, 0)
    return inp, layers.Conv2DTranspose(5, 2, 2)(x)  # 128x128x5


def _octconv_net():
    """(inputs, logits) of a classifier of octave convolutions (half the
    channels at half the resolution) on 64x64x3."""
    import keras
    from keras import layers

    def octconv(high, low, filters, low_out=True):
        """Chen et al. 2019: high->high and low->high (upsampled), and
        high->low (average pooled) and low->low, alpha 0.5; each output
        with BatchNormalization and ReLU."""
        f_low = filters // 2 if low_out else 0
        f_high = filters - f_low
        h = layers.Conv2D(f_high, 3, padding="same", use_bias=False)(high)
        if low is not None:
            lh = layers.Conv2D(f_high, 3, padding="same", use_bias=False)(low)
            h = layers.Add()([h, layers.UpSampling2D(2)(lh)])
        h = layers.ReLU()(layers.BatchNormalization()(h))
        if not low_out:
            return h, None
        pooled = layers.AveragePooling2D(2)(high)
        lo = layers.Conv2D(f_low, 3, padding="same", use_bias=False)(pooled)
        if low is not None:
            ll = layers.Conv2D(f_low, 3, padding="same", use_bias=False)(low)
            lo = layers.Add()([lo, ll])
        lo = layers.ReLU()(layers.BatchNormalization()(lo))
        return h, lo

    inp = keras.Input((64, 64, 3))
    h, lo = octconv(inp, None, 32)  # high 64x64, low 32x32
    h, lo = octconv(h, lo, 64)
    h, lo = octconv(h, lo, 64)
    h, lo = layers.MaxPooling2D(2)(h), layers.MaxPooling2D(2)(lo)  # 32, 16
    h, lo = octconv(h, lo, 128)
    h, lo = octconv(h, lo, 128)
    h, lo = layers.MaxPooling2D(2)(h), layers.MaxPooling2D(2)(lo)  # 16, 8
    h, _ = octconv(h, lo, 256, low_out=False)
    x = layers.GlobalAveragePooling2D()(h)
    return inp, layers.Dense(10)(x)


def _clockwork_rnn():
    """(inputs, logits) of a clockwork RNN (Koutnik et al. 2014) over
    128 steps of 32 features: 256 units in 8 modules of 32 with periods
    1, 2, 4, ..., 128; a module updates only at steps its period
    divides and reads itself and the slower modules."""
    import keras
    import numpy as np
    from keras import layers
    from keras import ops

    units, modules = 256, 8
    size = units // modules
    periods = 2 ** np.arange(modules)

    class ClockworkCell(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.state_size = [units, 1]
            self.output_size = units

        def build(self, shape):
            self.w_x = self.add_weight(shape=(shape[-1], units))
            self.w_h = self.add_weight(
                shape=(units, units), initializer="orthogonal"
            )
            self.b = self.add_weight(shape=(units,), initializer="zeros")
            # W_h[j, i] is kept when module(j) is as slow as module(i) or
            # slower (block upper triangular)
            block = np.arange(units) // size
            mask = (block[:, None] >= block[None, :]).astype("float32")
            self.mask = ops.convert_to_tensor(mask)
            self.periods = ops.convert_to_tensor(
                np.repeat(periods, size).astype("float32")
            )

        def call(self, x, states):
            h, t = states
            cand = ops.tanh(
                ops.matmul(x, self.w_x)
                + ops.matmul(h, self.w_h * self.mask)
                + self.b
            )
            active = ops.cast(
                ops.equal(ops.mod(t, self.periods[None, :]), 0.0), h.dtype
            )
            h = active * cand + (1.0 - active) * h
            return h, [h, t + 1.0]

    inp = keras.Input((128, 32))
    h = layers.RNN(ClockworkCell())(inp)
    return inp, layers.Dense(10)(h)


def _schnet():
    """(inputs, energy) of SchNet (Schuett et al. 2017) on molecules of
    32 atoms: 64-wide atom embeddings, 3 interaction blocks of
    continuous-filter convolutions over the 32 x 32 interatomic
    distances (64 Gaussians to 10 A, a cosine cutoff), atom-wise layers
    and the atoms' contributions summed."""
    import math

    import keras
    from keras import layers
    from keras import ops

    atoms, width, gaussians, cutoff = 32, 64, 64, 10.0

    def ssp(x):  # shifted softplus
        return ops.softplus(x) - math.log(2.0)

    class Distances(layers.Layer):
        """The Gaussian expansion of the interatomic distances times a
        cosine cutoff: (batch, atoms, atoms, gaussians)."""

        def call(self, pos):
            pos = pos * 8.0  # the harness's [0, 1) to 0-8 A
            diff = pos[:, :, None, :] - pos[:, None, :, :]
            d = ops.sqrt(ops.sum(diff * diff, axis=-1) + 1e-9)
            centres = ops.linspace(0.0, cutoff, gaussians)
            rbf = ops.exp(-10.0 * (d[..., None] - centres) ** 2)
            cut = 0.5 * (ops.cos(d * math.pi / cutoff) + 1.0)
            return rbf * cut[..., None]

        def compute_output_shape(self, shape):
            return (shape[0], atoms, atoms, gaussians)

    class CFConv(layers.Layer):
        """sum_j x_j * W(r_ij), the filter W from the expanded distance
        by two dense layers."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.f1 = layers.Dense(width, activation=ssp)
            self.f2 = layers.Dense(width, activation=ssp)
            self.in2f = layers.Dense(width, use_bias=False)

        def call(self, x, rbf):
            w = self.f2(self.f1(rbf))  # (batch, atoms, atoms, width)
            xj = self.in2f(x)
            return ops.sum(xj[:, None, :, :] * w, axis=2)

        def compute_output_shape(self, x_shape, rbf_shape):
            return x_shape[:-1] + (width,)

    types = keras.Input((atoms,), dtype="int32", name="types")
    positions = keras.Input((atoms, 3), name="positions")
    x = layers.Embedding(VOCAB, width)(types)
    rbf = Distances()(positions)
    for _ in range(3):
        v = CFConv()(x, rbf)
        v = layers.Dense(width, activation=ssp)(v)
        x = layers.Add()([x, layers.Dense(width)(v)])
    x = layers.Dense(width // 2, activation=ssp)(x)
    energy = ops.sum(layers.Dense(1)(x), axis=1)  # (batch, 1)
    return {"types": types, "positions": positions}, energy


def _autorec():
    """(inputs, reconstruction) of U-AutoRec (Sedhain et al. 2015): a
    user's ratings of 4000 items through a sigmoid layer of 500 and back
    to the 4000 items."""
    import keras
    from keras import layers

    items = 4 * VOCAB
    inp = keras.Input((items,))
    h = layers.Dense(500, activation="sigmoid")(inp)
    return inp, layers.Dense(items)(h)


def build_heldout20(name):
    """(inputs, outputs, sparse labels?) for the held-out model `name`."""
    import keras
    from keras import layers

    if name == "repvgg_mini":
        inp, logits = _repvgg_mini()
        return inp, logits, True
    if name == "erfnet_mini":
        inp, logits = _erfnet_mini()
        return inp, logits, True
    if name == "octconv_net":
        inp, logits = _octconv_net()
        return inp, logits, True
    if name == "deit_tiny":
        import keras_hub

        backbone = keras_hub.models.DeiTBackbone(
            image_shape=(96, 96, 3),
            patch_size=8,
            num_layers=4,
            num_heads=3,
            hidden_dim=192,
            intermediate_dim=768,
        )
        inp = keras.Input((96, 96, 3), name="images")
        h = backbone(inp)  # the class and distillation tokens, 144 patches
        cls = layers.Dense(10)(h[:, 0])
        dist = layers.Dense(10)(h[:, 1])
        return inp, layers.Average()([cls, dist]), True
    if name == "qwen3_tiny":
        import keras_hub

        backbone = keras_hub.models.Qwen3Backbone(
            vocabulary_size=VOCAB,
            num_layers=4,
            num_query_heads=8,
            num_key_value_heads=2,
            head_dim=32,
            hidden_dim=256,
            intermediate_dim=768,
        )
        token_ids = keras.Input((128,), dtype="int32", name="token_ids")
        mask = keras.Input((128,), dtype="int32", name="padding_mask")
        h = backbone({"token_ids": token_ids, "padding_mask": mask})
        # the language-model head tied to the token embedding
        logits = layers.Activation("linear", dtype="float32")(
            backbone.token_embedding(h, reverse=True)
        )
        return {"token_ids": token_ids, "padding_mask": mask}, logits, True
    if name == "clockwork_rnn":
        inp, logits = _clockwork_rnn()
        return inp, logits, True
    if name == "schnet":
        inp, energy = _schnet()
        return inp, energy, False
    if name == "autorec":
        inp, out = _autorec()
        return inp, out, False
    raise ValueError(name)
