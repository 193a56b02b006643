"""Cloud TPU recipe: tfmemopt.Model with bfloat16 and steps_per_execution.

UNTESTED HERE: the project's machines have no TPU. This is the recipe we
would run on a Cloud TPU VM (`python examples/tpu.py`); elsewhere it stops
with "No TPU was found". What it relies on is tested on CPU:
`auto_strategy(tpu="local")` fails cleanly without a TPU, accumulation is
exact under `mixed_bfloat16`, and `steps_per_execution` is checked under
MirroredStrategy.

- `auto_strategy(tpu="local")`: a TPU VM's own chips; pass a TPU name or a
  `grpc://` address for a TPU node (tfmemopt never contacts one unasked).
- `mixed_bfloat16`: TPUs compute in bfloat16 natively; no loss scaling.
  Variables, gradients and optimizer slots stay float32.
- `steps_per_execution`: several steps per host round trip, which TPUs need
  to stay busy.
- Static shapes: `drop_remainder=True`, and a global batch that divides by
  replicas x accumulation_steps (and by 8 per core for the MXU).
"""

from __future__ import annotations

import os

# oneDNN's allocator keeps the CPU's memory statistics (when this runs on a
# CPU); TensorFlow enables it by default only on some CPUs (not on AMD).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfmemopt  # noqa: E402


def main():
    strategy = tfmemopt.distribute.auto_strategy(tpu="local")
    print(tfmemopt.distribute.describe(strategy))
    keras.config.set_dtype_policy("mixed_bfloat16")
    replicas = strategy.num_replicas_in_sync
    accumulation = 4
    global_batch = 128 * replicas  # 128 per core, 4 micro-batches of 32
    with strategy.scope():
        inputs = keras.Input((784,))
        h = keras.layers.Dense(1024, activation="relu")(inputs)
        h = keras.layers.Dense(1024, activation="relu")(h)
        outputs = keras.layers.Dense(10, dtype="float32")(h)
        model = tfmemopt.Model(inputs, outputs, accumulation_steps=accumulation)
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=32,
        )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(global_batch * 64, 784)).astype("float32")
    y = rng.integers(0, 10, size=(len(x),))
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(4096)
        .batch(global_batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    model.fit(data, epochs=2)


if __name__ == "__main__":
    main()
