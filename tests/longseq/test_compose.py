"""chunked_loss + attention="chunked" under ShardedOptimizer(AdamW8bit).

One subprocess on 2 logical CPUs (MirroredStrategy): a user's causal
MultiHeadAttention stack with a Dense head (8-bit moments for the embedding
and the head's kernel, 976 values each, min_8bit_size=512), two steps with
`ShardedOptimizer(AdamW8bit)`, wrapped with both options (attention over 3
key blocks, the loss over logits chunks of 40) against plain Keras under
the same strategy. The floor is plain Keras on a permuted batch (the
replicas' split and the all-reduce order change), measured in the same run.
"""

import pytest
from conftest import run_in_subprocess

CODE = """
import numpy as np, keras, tfmemopt
from tfmemopt.distribute import ShardedOptimizer
from tfmemopt.optimizers import AdamW8bit

STRATEGY = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
V, T = 61, 9
rng = np.random.default_rng(0)
X = rng.integers(1, V, size=(8, T))
X[3, -2:] = 0  # padding (mask_zero), merged with the causal mask
Y = rng.integers(0, V, size=(8, T))
SW = rng.uniform(0.5, 2.0, size=(8, T)).astype("float32")

def stack():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(V, 16, mask_zero=True)(inputs)
    a = keras.layers.MultiHeadAttention(2, 8)(h, h, use_causal_mask=True)
    h = keras.layers.LayerNormalization()(h + a)
    return keras.Model(inputs, keras.layers.Dense(V)(h))

def train(options, perm):
    with STRATEGY.scope():
        model = stack()
        if options:
            model = tfmemopt.Model.wrap(model, **options)
            model.long_sequences.block_elements = 2 * 2 * T * 3
            model.long_sequences.chunk_elements = 40 * V
        model.compile(
            ShardedOptimizer(
                AdamW8bit(1e-2, weight_decay=0.01, min_8bit_size=512)
            ),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    w0 = [w.numpy() for w in model.trainable_weights]
    losses = [
        float(model.train_on_batch(X[perm], Y[perm], sample_weight=SW[perm]))
        for _ in range(2)
    ]
    eight = sum(
        1 for v in model.optimizer.inner_optimizer.variables
        if v.dtype == "uint8"
    )
    return w0, [w.numpy() for w in model.trainable_weights], losses, eight

def rel(a, b, w0):
    change = max(float(np.max(np.abs(q - p))) for p, q in zip(w0, b))
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b)) / change

ident, perm = np.arange(8), np.array([5, 2, 7, 0, 3, 6, 1, 4])
w0, plain, plain_loss, eight = train(None, ident)
_, permuted, _, _ = train(None, perm)
both = {"chunked_loss": True, "attention": "chunked"}
_, wrapped, wrapped_loss, _ = train(both, ident)
emit({
    "floor": rel(plain, permuted, w0),
    "wrapped": rel(plain, wrapped, w0),
    "change": max(float(np.max(np.abs(q - p))) for p, q in zip(w0, plain)),
    "losses": [plain_loss, wrapped_loss],
    "uint8_state": eight,
})
"""


@pytest.mark.slow
def test_both_options_compose_with_sharded_adamw8bit():
    out = run_in_subprocess(CODE, n_cpus=2, timeout=300)
    assert out["uint8_state"] > 0, out  # the 8-bit path is the one tested
    assert out["change"] > 1e-3, out
    assert out["wrapped"] <= max(4 * out["floor"], 1e-5), out
    for a, b in zip(*out["losses"]):
        assert abs(a - b) <= 1e-5 * abs(a), out
