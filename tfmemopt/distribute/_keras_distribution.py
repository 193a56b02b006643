"""Refusing `keras.distribution` on the TensorFlow backend.

`keras.distribution.DataParallel` / `ModelParallel` are implemented for JAX;
with the TensorFlow backend `set_distribution` is accepted and then silently
does nothing: training runs on one device. tfmemopt raises instead.
"""

from __future__ import annotations

import keras


def check_keras_distribution() -> None:
    """Raises ValueError if a `keras.distribution` is set on TensorFlow.

    Raises:
        ValueError: naming the distribution that was set and the
            `tf.distribute` replacement.
    """
    if keras.backend.backend() != "tensorflow":
        return
    dist = keras.distribution.distribution()
    if dist is None:
        return
    raise ValueError(
        f"`keras.distribution` is set to {dist!r}, but with the TensorFlow "
        "backend Keras ignores it and trains on one device. Use "
        "`tf.distribute` instead: `strategy = "
        "tfmemopt.distribute.auto_strategy()` (or "
        "`tf.distribute.MirroredStrategy()`), then build and compile the "
        "model inside `strategy.scope()`; and unset the Keras one with "
        "`keras.distribution.set_distribution(None)`."
    )
