"""How far 8-bit Adam with accumulation lands from whole-batch training.

`tfmemopt.Model(accumulation_steps=4)` sums the micro-batches' gradients in
float32; the whole batch sums the same per-sample terms in another order, so
the two gradients differ by float rounding (~1e-7 relative). Keras's AdamW
carries that difference along; an 8-bit optimizer may flip a moment's code
on it, which moves that moment by one step of the map (up to 1.4% of its
block's maximum). This script measures, per seed and step count,

    max |w - w_full| / max |w_full - w_init|

(the metric of `benchmarks/exactness.py`) for AdamW8bit and Keras's AdamW,
between the whole batch and

- "accumulation": the same batches through `accumulation_steps=4`;
- "reordered": the whole batch with its rows permuted within each batch,
  which changes nothing but the order in which the gradient is summed;
- "reshuffled": the whole batch with the samples dealt into other batches
  (what `shuffle=True` with another seed does): the spread a user already
  accepts between two runs.

If accumulation is exact up to rounding, "accumulation" and "reordered" have
the same size. It also prints the training loss at the end.

Run: `python benchmarks/accumulation_8bit.py [--seeds 5] [--epochs 32]`
(prints the tables quoted in docs/optimizers.md, "Accumulation and 8-bit
state"; ~8 min on 2 busy CPU cores). It writes nothing to BENCHMARKS.md.
"""

import os

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfmemopt  # noqa: E402

N = 4
BATCH = 64
SAMPLES = 512  # 8 updates per epoch

OPTIMIZERS = {
    # default block_size and min_8bit_size: both hidden kernels are 8-bit,
    # the output kernel and the biases keep float32 moments
    "AdamW8bit": lambda: tfmemopt.optimizers.AdamW8bit(1e-3),
    "keras AdamW": lambda: keras.optimizers.AdamW(1e-3),
}


def build(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((32,))
    h = keras.layers.Dense(128, activation="relu")(inputs)
    h = keras.layers.Dense(128, activation="relu")(h)
    return inputs, keras.layers.Dense(10)(h)


def data(seed):
    rng = np.random.default_rng(100 + seed)
    x = rng.normal(size=(SAMPLES, 32)).astype("float32")
    teacher = rng.normal(size=(32, 10)).astype("float32")
    y = np.argmax(x @ teacher + rng.normal(size=(SAMPLES, 10)), axis=1)
    return x, y


def reorder_within_batches(x, y, seed):
    rng = np.random.default_rng(200 + seed)
    order = np.concatenate(
        [start + rng.permutation(BATCH) for start in range(0, SAMPLES, BATCH)]
    )
    return x[order], y[order]


def reshuffle(x, y, seed):
    order = np.random.default_rng(300 + seed).permutation(SAMPLES)
    return x[order], y[order]


class Snapshots(keras.callbacks.Callback):
    def __init__(self, at):
        super().__init__()
        self.at, self.weights, self.step = set(at), {}, 0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step in self.at:
            self.weights[self.step] = self.model.get_weights()


def train(seed, optimizer, steps, x, y, at):
    keras.backend.clear_session()
    model = tfmemopt.Model(*build(seed), accumulation_steps=steps)
    w0 = model.get_weights()
    model.compile(
        OPTIMIZERS[optimizer](),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    snaps = Snapshots(at)
    epochs = -(-max(at) * BATCH // SAMPLES)
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False,
              verbose=0, callbacks=[snaps])  # fmt: skip
    loss = model.evaluate(x, y, batch_size=SAMPLES, verbose=0)
    return w0, snaps.weights, float(np.ravel(loss)[0])


COMPARISONS = ("accumulation", "reordered", "reshuffled")


def distance(w, ref, w0):
    moved = max(np.abs(a - b).max() for a, b in zip(ref, w0))
    return max(np.abs(a - b).max() for a, b in zip(w, ref)) / moved


def measure(seeds, at):
    """{(optimizer, comparison, step): [distance per seed]}."""
    out, losses = {}, {}
    for seed in seeds:
        x, y = data(seed)
        xr, yr = reorder_within_batches(x, y, seed)
        xs, ys = reshuffle(x, y, seed)
        for name in OPTIMIZERS:
            w0, full, loss_full = train(seed, name, 1, x, y, at)
            runs = {
                "accumulation": train(seed, name, N, x, y, at),
                "reordered": train(seed, name, 1, xr, yr, at),
                "reshuffled": train(seed, name, 1, xs, ys, at),
            }
            for step in at:
                for comparison, (_, run, _) in runs.items():
                    d = distance(run[step], full[step], w0)
                    out.setdefault((name, comparison, step), []).append(d)
            losses.setdefault(name, []).append(
                (loss_full, runs["accumulation"][2])
            )
            print(seed, name, {s: f"{out[(name, 'accumulation', s)][-1]:.1e}"
                               for s in at}, flush=True)  # fmt: skip
    return out, losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=32)
    args = parser.parse_args()
    last = args.epochs * SAMPLES // BATCH
    at = [s for s in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if s <= last]
    seeds = list(range(args.seeds))
    out, losses = measure(seeds, at)
    for name in OPTIMIZERS:
        print(f"\n{name}: training loss after {last} updates, whole batch / "
              "accumulation: " + ", ".join(
                  f"{a:.5f} / {b:.5f}" for a, b in losses[name]))  # fmt: skip
        for comparison in COMPARISONS:
            print(f"\n{name}, {comparison} vs whole batch "
                  f"(N={N}, batch {BATCH}, {SAMPLES} samples)")  # fmt: skip
            print("| updates | " + " | ".join(f"seed {s}" for s in seeds)
                  + " | max |")  # fmt: skip
            print("|---" * (len(seeds) + 2) + "|")
            for step in at:
                d = out[(name, comparison, step)]
                print(f"| {step} | " + " | ".join(f"{v:.1e}" for v in d)
                      + f" | {max(d):.1e} |")  # fmt: skip


if __name__ == "__main__":
    main()
