"""The loss a micro-step computes is chosen once, when `fit` starts (#50).

`Model.fit` picks a `WindowLoss`: Keras's compiled loss split into
window-exact terms (`CompiledLoss`), the model's own `compute_loss`
(`ComputeLoss`), or the chunked head's (`ChunkedLoss`); `train_step`
calls that object on each micro-batch. Exactness of each is tested where
the feature is (test_model.py, longseq/test_chunked_loss.py).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import tfmemopt
from tfmemopt.accumulation import _loss_normalization as ln


def _lm(**options):
    tokens = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(11, 8)(tokens)
    logits = keras.layers.Dense(11, name="head")(h)
    return tfmemopt.Model(tokens, logits, accumulation_steps=2, **options)


class _OwnLoss(tfmemopt.Model):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                     training=True):  # fmt: skip
        return keras.ops.mean(keras.ops.square(y_pred))


def _fit(model):
    model.compile(
        keras.optimizers.SGD(0.1),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    x = rng.integers(0, 11, (4, 6)).astype("int32")
    y = rng.integers(0, 11, (4, 6))
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    return history.history["loss"][0]


@pytest.mark.parametrize(
    "make, kind",
    [
        (lambda: _lm(), ln.CompiledLoss),
        (lambda: _lm(chunked_loss=True), ln.ChunkedLoss),
    ],
    ids=["compiled", "chunked"],
)
def test_fit_chooses_the_loss_once(make, kind):
    model = make()
    assert np.isfinite(_fit(model))
    assert type(model._window_loss) is kind
    assert model._window_loss.needs_forward == (kind is ln.ChunkedLoss)


def test_a_custom_compute_loss_is_the_loss():
    tokens = keras.Input((6,), dtype="int32")
    out = keras.layers.Dense(3)(keras.layers.Embedding(11, 8)(tokens))
    model = _OwnLoss(tokens, out, accumulation_steps=2)
    _fit(model)
    assert type(model._window_loss) is ln.ComputeLoss


def test_a_custom_compute_loss_with_chunked_loss_is_refused():
    tokens = keras.Input((6,), dtype="int32")
    logits = keras.layers.Dense(11)(keras.layers.Embedding(11, 8)(tokens))
    model = _OwnLoss(tokens, logits, accumulation_steps=2, chunked_loss=True)
    with pytest.raises(ValueError, match="overrides `compute_loss`"):
        _fit(model)
