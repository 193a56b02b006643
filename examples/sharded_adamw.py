"""AdamW with its state partitioned across replicas (ZeRO stage 1), on CPU.

The CPU is split into 4 logical devices so that `MirroredStrategy` has 4
replicas on any machine. The same model trains twice, with AdamW unwrapped
and wrapped in `tfmemopt.ShardedOptimizer`; the script prints the optimizer
state each device holds and how far apart the two final models are. Then it
saves the sharded model, loads it on one device and trains on.

    python examples/sharded_adamw.py
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tempfile  # noqa: E402

import tensorflow as tf  # noqa: E402

REPLICAS = 4
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfmemopt  # noqa: E402


def state_bytes_per_device(optimizer, strategy):
    """Bytes of optimizer state on each device, over all components."""
    if isinstance(optimizer, tfmemopt.ShardedOptimizer):
        variables = optimizer.state_variables
    else:
        variables = optimizer.variables
    per_device = {}
    for v in variables:
        for c in strategy.experimental_local_results(v.value):
            n = int(np.prod(c.shape)) * c.dtype.size
            per_device[c.device] = per_device.get(c.device, 0) + n
    return max(per_device.values())


def train(strategy, sharded, x, y):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(255, activation="gelu"),
                keras.layers.Dense(127, activation="gelu"),
                keras.layers.Dense(10),
            ]
        )
        optimizer = keras.optimizers.AdamW(1e-3, weight_decay=0.01)
        if sharded:
            optimizer = tfmemopt.ShardedOptimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    return model


def main():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 64)).astype("float32")
    y = rng.integers(0, 10, size=(512,))
    strategy = tf.distribute.MirroredStrategy(
        [f"CPU:{i}" for i in range(REPLICAS)]
    )
    plain = train(strategy, False, x, y)
    sharded = train(strategy, True, x, y)
    plain_bytes = state_bytes_per_device(plain.optimizer, strategy)
    sharded_bytes = state_bytes_per_device(sharded.optimizer, strategy)
    diff = max(
        float(np.max(np.abs(a.numpy() - b.numpy())))
        for a, b in zip(plain.weights, sharded.weights)
    )
    print(f"replicas: {REPLICAS}")
    print(f"AdamW state per device, unwrapped: {plain_bytes} bytes")
    print(f"AdamW state per device, sharded:   {sharded_bytes} bytes")
    print(f"ratio: {sharded_bytes / plain_bytes:.3f}")
    print(f"largest weight difference: {diff:.3g}")

    # The checkpoint holds the whole state: it loads on one device too.
    path = os.path.join(tempfile.mkdtemp(), "sharded.keras")
    sharded.save(path)
    one_device = keras.saving.load_model(path)
    loss = one_device.evaluate(x, y, verbose=0)
    one_device.fit(x, y, batch_size=64, epochs=1, verbose=0)
    print(
        f"reloaded on one device: loss {loss:.4f}, iterations "
        f"{int(one_device.optimizer.iterations.numpy())}"
    )


if __name__ == "__main__":
    main()
