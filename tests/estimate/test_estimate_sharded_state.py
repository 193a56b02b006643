"""estimate_memory's optimizer state under ShardedOptimizer.

Each replica keeps 1/R of every slot, cut in whole units: one element for
Keras's optimizers, one block (codes and its scale) for tfmemopt's 8-bit
ones, whose choice of 8-bit or float32 state is made on the whole variable.
"""

import keras
import pytest

import tfmemopt
from tfmemopt.optimizers import AdamW8bit


def _model():
    inputs = keras.Input((37,))
    h = keras.layers.Dense(250)(inputs)
    return keras.Model(inputs, keras.layers.Dense(5)(h))


def _state(optimizer, replicas):
    model = _model()
    return tfmemopt.estimate_memory(
        model, 16, optimizer=optimizer, replicas=replicas
    ).optimizer_state


def _eight_bit():
    return AdamW8bit(1e-3, block_size=64, min_8bit_size=1024)


@pytest.mark.parametrize("replicas", [2, 4])
def test_sharded_8bit_state_is_a_block_aligned_part(replicas):
    whole = _state(_eight_bit(), 1)
    sharded = _state(tfmemopt.ShardedOptimizer(_eight_bit()), replicas)
    # Kernels 37x250 (9250) and 250x5 (1250) are 8-bit: 2 bytes + 8 bytes
    # per block of 64 per element; biases (250, 5) float32 moments.
    assert whole == 2 * (9250 + 4 * 145) + 2 * (1250 + 4 * 20) + 8 * 255
    # At most one unit (a block, or an element) more than 1/R per variable.
    assert whole / replicas <= sharded <= whole / replicas + 4 * 2 * 72
    # Cut as a whole-variable 8-bit state, not as float32 partitions (a
    # 1250-element kernel cut in 4 is below min_8bit_size, yet 8-bit).
    assert sharded < _state(tfmemopt.ShardedOptimizer(_eight_bit()), 1) / 1.9


def test_sharded_keras_state_is_ceil_n_over_r_elements():
    whole = _state(keras.optimizers.Adam(), 1)
    sharded = _state(tfmemopt.ShardedOptimizer(keras.optimizers.Adam()), 3)
    parts = sum(-(-n // 3) for n in (9250, 250, 1250, 5))
    assert whole == 8 * (9250 + 250 + 1250 + 5)
    assert sharded == 8 * parts
