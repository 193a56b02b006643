"""The round-trip matrix: every feature, every way a user saves (#23).

Each case builds a compiled model the way a user would (same seed, same
code, so the uninterrupted run and every restored run start alike). For a
case, `run_case` trains:

- an uninterrupted reference: 2 epochs;
- an interrupted run: epoch 1 with `ModelCheckpoint` (a `.keras` file) and
  `BackupAndRestore` active, preempted as epoch 2 begins; then `model.save`
  and `model.save_weights` of what it holds.

Then, for each way to save, it restores a model, compares its predictions
and optimizer state with the interrupted model's, trains epoch 2 on it, and
measures the distance to the reference, as a fraction of the reference's
whole update (`max |w - w_ref| / max |w_ref - w_init|`).

The module has no test of its own: tests/round_trip/test_round_trip.py runs
the one-device cases in-process and the multi-device ones in a subprocess
(which imports this module to get the same code).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil

import keras
import numpy as np
import tensorflow as tf

import tfmemopt
from tfmemopt.accumulation._adapters import lora_layers
from tfmemopt.optimizers import Adafactor
from tfmemopt.optimizers import AdamW8bit

WAYS = ("save", "weights", "backup", "model_checkpoint")
FEATURES, CLASSES, N, BATCH = 12, 3, 24, 8


class Preempted(Exception):
    """Raised by `_Preempt` to stop `fit` the way a lost machine would."""


class _Preempt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            raise Preempted()


def _dense_stack(inputs, depth=4, width=16, prefix="d", dropout=0.0):
    h = inputs
    for i in range(depth):
        h = keras.layers.Dense(width, activation="tanh", name=f"{prefix}{i}")(h)
        if dropout and i == depth // 2:
            h = keras.layers.Dropout(dropout)(h)
    return h


def _functional(**kwargs):
    inputs = keras.Input((FEATURES,))
    # Dropout: its random stream must resume where it was, too. Four layers
    # (a case's time goes to tracing its six models' steps, which grows
    # with the layers): "auto" still makes three segments, the middle one
    # d2, the dropout and d3 (a recomputed random stream); the list case's
    # d1 and d3 are still two layers apart.
    h = _dense_stack(inputs, dropout=0.2)
    outputs = keras.layers.Dense(CLASSES, name="head")(h)
    return tfmemopt.Model(inputs, outputs, **kwargs)


def _nested(**kwargs):
    # Models nested in the model, built under the case's policy: Keras
    # loads them under the global one unless tfmemopt restores theirs.
    inputs = keras.Input((FEATURES,))
    h = inputs
    for i in range(2):
        h = keras.Sequential(
            [
                keras.layers.Dense(16, activation="tanh"),
                keras.layers.Dense(16, activation="tanh"),
            ],
            name=f"block{i}",
        )(h)
    outputs = keras.layers.Dense(CLASSES, name="head", dtype="float32")(h)
    return tfmemopt.Model(inputs, outputs, **kwargs)


@keras.saving.register_keras_serializable(package="tfmemopt_tests")
class Residual(keras.layers.Layer):
    """A block made of sub-layers (what `checkpointing="blocks"` takes)."""

    def __init__(self, width=16, **kwargs):
        super().__init__(**kwargs)
        self.width = width
        self.inner = keras.layers.Dense(2 * width, activation="tanh")
        self.dropout = keras.layers.Dropout(0.2)
        self.outer = keras.layers.Dense(width)

    def build(self, input_shape):
        self.inner.build(input_shape)
        self.outer.build(input_shape[:-1] + (2 * self.width,))

    def call(self, x, training=None):
        return x + self.outer(self.dropout(self.inner(x), training=training))

    def get_config(self):
        return {**super().get_config(), "width": self.width}


@keras.saving.register_keras_serializable(package="tfmemopt_tests")
class Subclassed(tfmemopt.Model):
    """A subclassed `tfmemopt.Model`: stem, residual blocks, head."""

    def __init__(self, blocks=2, **kwargs):
        super().__init__(**kwargs)
        self.blocks = blocks
        self.stem = keras.layers.Dense(16)
        self.body = [Residual(16) for _ in range(blocks)]
        self.head = keras.layers.Dense(CLASSES)

    def call(self, x):
        h = self.stem(x)
        for block in self.body:
            h = block(h)
        return self.head(h)

    def get_config(self):
        return {**super().get_config(), "blocks": self.blocks}


def _sequential(**kwargs):
    layers = [keras.Input((FEATURES,))]
    layers += [keras.layers.Dense(16, activation="tanh") for _ in range(2)]
    layers += [keras.layers.Dropout(0.2)]
    layers += [keras.layers.Dense(16, activation="tanh") for _ in range(2)]
    layers += [keras.layers.Dense(CLASSES)]
    return tfmemopt.Model.wrap(keras.Sequential(layers), **kwargs)


def _plain(**_):
    inputs = keras.Input((FEATURES,))
    outputs = keras.layers.Dense(CLASSES)(_dense_stack(inputs, depth=2))
    return keras.Model(inputs, outputs)


VOCAB, SEQ = 40, 8


def _gpt2(**kwargs):
    """A keras-hub task model the user did not write (tiny, no download)."""
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB,
        # One transformer layer: "auto" checkpoints it with the embeddings
        # (dropout inside), the final layer norm apart: two segments.
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        dropout=0.1,
        max_sequence_length=SEQ,
    )
    task = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    return tfmemopt.Model.wrap(task, **kwargs)


def _llama(**kwargs):
    """keras-hub Llama (tiny, no download): 4 query heads sharing 2
    key/value heads, the attention class `attention="chunked"` takes over
    with its decoder's mask (#48)."""
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCAB,
        num_layers=1,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
    )
    task = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    return tfmemopt.Model.wrap(task, **kwargs)


def _embedding(**kwargs):
    """What a causal LM's step does to the weights that matter here (an
    embedding with IndexedSlices gradients, a dense head over the
    vocabulary) at a fraction of GPT-2's tracing time."""
    ids = keras.Input((SEQ,), dtype="int32", name="token_ids")
    mask = keras.Input((SEQ,), dtype="int32", name="padding_mask")
    h = keras.layers.Embedding(VOCAB, 16, name="embed")(ids)
    h = h * keras.ops.cast(mask, h.dtype)[..., None]
    h = keras.layers.Dense(16, activation="relu", name="d0")(h)
    outputs = keras.layers.Dense(VOCAB, name="logits")(h)
    return tfmemopt.Model(
        inputs={"token_ids": ids, "padding_mask": mask},
        outputs=outputs,
        **kwargs,
    )


def _adam():
    return keras.optimizers.Adam(1e-2)


def _sgd():
    return keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.05, 2, 0.9),
        momentum=0.9,
    )


def _adamw8bit(bf16_update=None):
    # min_8bit_size=64: this tiny model's kernels get 8-bit codes too.
    return AdamW8bit(
        1e-2,
        weight_decay=0.01,
        block_size=64,
        min_8bit_size=64,
        bf16_update=bf16_update,
    )


def _adafactor():
    return Adafactor(1e-2)


def _adamw8bit_kahan():
    return _adamw8bit(bf16_update="kahan")


def _adamw8bit_ema():
    # The EMA of bfloat16 weights is float32, saved with the state; written
    # into the weights every 2 steps, so that a lost average shows.
    return AdamW8bit(
        1e-2,
        weight_decay=0.01,
        block_size=64,
        min_8bit_size=64,
        use_ema=True,
        ema_momentum=0.9,
        ema_overwrite_frequency=2,
    )


def _adamw():
    return keras.optimizers.AdamW(1e-2, weight_decay=0.01)


def _adamw8bit_stochastic():
    # bfloat16 weights updated with stochastic rounding (#47): the smallest
    # model state per device with shard_parameters.
    return _adamw8bit(bf16_update="stochastic")


def _enable_lora(model, rank):
    """LoRA as a user enables it: keras-hub's `backbone.enable_lora` (the
    rest frozen), or `enable_lora` on two Dense layers of a functional
    model with the other layers frozen."""
    if hasattr(getattr(model, "inner", None), "backbone"):
        model.inner.backbone.enable_lora(rank)
        return
    for layer in model.layers:
        if layer.weights:
            layer.trainable = False
    for name in ("d1", "d2"):
        layer = model.get_layer(name)
        layer.trainable = True
        layer.enable_lora(rank)


def _sharded(stage, inner):
    def make():
        return tfmemopt.ShardedOptimizer(inner(), stage=stage)

    return make


def _accumulating():
    return tfmemopt.AccumulatingOptimizer(_adam(), accumulation_steps=2)


@dataclasses.dataclass
class Case:
    """One row: a model, its features, the optimizer; `replicas` > 1 runs
    under `MirroredStrategy` on that many logical CPUs (in a subprocess)."""

    model: str
    optimizer: object
    kwargs: dict = dataclasses.field(default_factory=dict)
    policy: str = "float32"
    replicas: int = 1
    # 3 steps per epoch with accumulation_steps=2 across steps: the save
    # falls mid-window, with a partial sum in the accumulators.
    batch: int = BATCH
    tokens: bool = False
    # LoRA rank (0: none), enabled after the model is built (#47).
    lora: int = 0

    def data(self):
        rng = np.random.default_rng(7)
        if self.tokens:
            ids = rng.integers(1, VOCAB, size=(N, SEQ)).astype("int32")
            padding = np.ones((N, SEQ), "int32")
            padding[::3, -3:] = 0
            return {"token_ids": ids, "padding_mask": padding}, ids
        x = rng.normal(size=(N, FEATURES)).astype("float32")
        y = rng.integers(0, CLASSES, size=(N,)).astype("int32")
        return x, y

    def build(self):
        keras.utils.set_random_seed(1)
        with _global_policy(self.policy):
            model = _MODELS[self.model](**self.kwargs)
            if not model.built:
                x, _ = self.data()
                model(keras.tree.map_structure(lambda a: a[:1], x))
            if self.lora:
                _enable_lora(model, self.lora)
            model.compile(
                optimizer=self.optimizer(),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True
                ),
            )
        return model


@contextlib.contextmanager
def _global_policy(policy):
    """The global dtype policy `policy` inside, float32 after."""
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy("float32")


_MODELS = {
    "functional": _functional,
    "nested": _nested,
    "sequential": _sequential,
    "subclassed": lambda **kw: Subclassed(**kw),
    "keras": _plain,
    "gpt2": _gpt2,
    "llama": _llama,
    "embedding": _embedding,
}

CASES = {
    "functional/accumulation": Case(
        "functional", _adam, {"accumulation_steps": 2}
    ),
    "functional/auto": Case("functional", _sgd, {"checkpointing": "auto"}),
    "functional/list+accumulation": Case(
        "functional",
        _adam,
        {"checkpointing": ["d1", "d3"], "accumulation_steps": 2},
    ),
    "sequential/auto": Case("sequential", _adam, {"checkpointing": "auto"}),
    "subclassed/blocks+accumulation": Case(
        "subclassed",
        _adam,
        {"checkpointing": "blocks", "accumulation_steps": 2},
    ),
    "functional/adamw8bit": Case("functional", _adamw8bit),
    "functional/adamw8bit+auto+accumulation": Case(
        "functional",
        _adamw8bit,
        {"checkpointing": "auto", "accumulation_steps": 2},
    ),
    "functional/adafactor+accumulation": Case(
        "functional", _adafactor, {"accumulation_steps": 2}
    ),
    "functional/mixed_float16+accumulation": Case(
        "functional", _adam, {"accumulation_steps": 2}, "mixed_float16"
    ),
    # Nested models' policies (Keras loads them under the global policy).
    "nested/mixed_float16+blocks+accumulation": Case(
        "nested",
        _sgd,
        {"checkpointing": "blocks", "accumulation_steps": 2},
        "mixed_float16",
    ),
    "functional/mixed_bfloat16+adamw8bit+auto": Case(
        "functional",
        _adamw8bit,
        {"checkpointing": "auto"},
        "mixed_bfloat16",
    ),
    # bfloat16 weights (#25): stochastic rounding keyed by the step, its
    # float32 EMA, and a Kahan buffer saved with the state.
    "functional/bfloat16+adamw8bit_ema": Case(
        "functional", _adamw8bit_ema, policy="bfloat16"
    ),
    "functional/bfloat16+adamw8bit_kahan+accumulation": Case(
        "functional",
        _adamw8bit_kahan,
        {"accumulation_steps": 2},
        "bfloat16",
    ),
    "keras/accumulating_optimizer": Case("keras", _accumulating, batch=8),
    # Under the LossScaleOptimizer that compile adds: a reference back to it
    # made Keras's loader recurse until a RecursionError (fresh-user trial).
    "keras/accumulating_optimizer+mixed_float16": Case(
        "keras", _accumulating, policy="mixed_float16", batch=8
    ),
    # Long sequences (#26): the tied head and its loss in chunks.
    "gpt2/auto+accumulation+chunked_loss": Case(
        "gpt2",
        _adam,
        {
            "checkpointing": "auto",
            "accumulation_steps": 2,
            "chunked_loss": True,
        },
        tokens=True,
    ),
    # Chunked attention on an open-LLM family (#48): the takeover of
    # keras-hub's attention and decoder mask comes back with the model.
    "llama/chunked_loss+attention+accumulation": Case(
        "llama",
        _adamw,
        {
            "accumulation_steps": 2,
            "chunked_loss": True,
            "attention": "chunked",
        },
        tokens=True,
    ),
    # LoRA (#47): Keras folds the factors into the kernel when it saves and
    # zeroes them when it loads; keras-hub's enable_lora is not in the
    # backbone's config. tfmemopt keeps the layers, the flags and the
    # factors. Keras AdamW, and AdamW8bit under bfloat16 weights.
    "gpt2/lora+adamw": Case("gpt2", _adamw, tokens=True, lora=2),
    "gpt2/lora+adamw8bit+bfloat16": Case(
        "gpt2", _adamw8bit, policy="bfloat16", tokens=True, lora=2
    ),
    "functional/lora+adamw8bit+accumulation": Case(
        "functional", _adamw8bit, {"accumulation_steps": 2}, lora=2
    ),
    "functional/lora+adamw+bfloat16": Case(
        "functional", _adamw, policy="bfloat16", lora=2
    ),
    # bfloat16 weights with 8-bit state under MirroredStrategy (#47):
    # TensorFlow's collectives take no bfloat16 (the embedding's gradient,
    # IndexedSlices, is summed by an all-gather).
    "embedding/bfloat16+adamw8bit_stochastic+accumulation": Case(
        "embedding",
        _adamw8bit_stochastic,
        {"accumulation_steps": 2},
        "bfloat16",
        replicas=2,
        tokens=True,
    ),
    "gpt2/bfloat16+adamw8bit_stochastic+accumulation": Case(
        "gpt2",
        _adamw8bit_stochastic,
        {"accumulation_steps": 2},
        "bfloat16",
        replicas=2,
        tokens=True,
    ),
    "functional/shard_parameters+bfloat16+adamw8bit_stochastic": Case(
        "functional",
        _adamw8bit_stochastic,
        {"shard_parameters": True},
        "bfloat16",
        replicas=2,
    ),
    # ShardedOptimizer: one row for stage 2, 8-bit state, auto checkpointing
    # and accumulation together (stage 1 without accumulation is saved and
    # read at other replica counts in test_sharded_optimizer_checkpoints.py).
    "functional/sharded2_adamw8bit+auto+accumulation": Case(
        "functional",
        _sharded(2, _adamw8bit),
        {"checkpointing": "auto", "accumulation_steps": 2},
        replicas=2,
    ),
    # FSDP (#24): whole weights and state saved from the shards, loaded into
    # a fresh sharded model; the micro-batches traced one by one. Under a
    # LossScaleOptimizer, whose inner optimizer Keras saves and loads again
    # as its child: its first replica's parts were written into every
    # replica's (1.38x an epoch's update off before the fix; float32 FSDP
    # is saved and loaded in tests/distribute/test_param_sharding.py).
    "functional/shard_parameters+accumulation+mixed_float16": Case(
        "functional",
        _adam,
        {"shard_parameters": True, "accumulation_steps": 2},
        "mixed_float16",
        replicas=2,
    ),
}


def _uses_tfmemopt_optimizer(case) -> bool:
    made = case.optimizer()
    return type(made).__module__.startswith("tfmemopt") or isinstance(
        made, tfmemopt.AccumulatingOptimizer
    )


def rows(group: str) -> list:
    """The names of a group of rows: `"keras_hub_and_lora"` (one device),
    `"tfmemopt_optimizers"` (one device, the others),
    `"keras_optimizers"` (one device, the rest), `"replicas"` (the rows
    before #47 on 2 replicas) and `"bfloat16_replicas"` (bfloat16 weights
    on 2 replicas, #47)."""
    out = []
    for name, case in CASES.items():
        if case.replicas > 1:
            kind = (
                "bfloat16_replicas" if case.policy == "bfloat16" else "replicas"
            )
        elif case.model in ("gpt2", "llama") or case.lora:
            kind = "keras_hub_and_lora"
        elif _uses_tfmemopt_optimizer(case):
            kind = "tfmemopt_optimizers"
        else:
            kind = "keras_optimizers"
        if kind == group:
            out.append(name)
    if not out:
        raise ValueError(f"No round-trip rows in group {group!r}.")
    return out


def _weights(model) -> list:
    return [np.array(v.numpy(), copy=True) for v in model.weights]


def _optimizer_state(model) -> list:
    return [
        np.array(keras.ops.convert_to_numpy(v.value), copy=True)
        for v in model.optimizer.variables
    ]


def _max_diff(a, b) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(
        (
            float(np.max(np.abs(x.astype("float64") - y.astype("float64"))))
            for x, y in zip(a, b)
            if x.size
        ),
        default=0.0,
    )


def run_case(name: str, workdir: str, strategy=None) -> dict:
    """Trains, saves every way, restores, resumes; returns per-way figures.

    `{way: {"predict": max |diff|, "state": max |diff| of the optimizer's
    variables, "resume": distance to the uninterrupted run}}` and the
    reference's `"update"` (max |w_ref - w_init|, which must be > 0).
    """
    case = CASES[name]
    strategy = strategy or tf.distribute.get_strategy()
    x, y = case.data()
    fit = dict(batch_size=case.batch, shuffle=False, verbose=0)
    with strategy.scope():
        reference = case.build()
    initial = _weights(reference)
    reference.fit(x, y, epochs=2, **fit)
    final = _weights(reference)
    update = _max_diff(final, initial)

    os.makedirs(workdir, exist_ok=True)
    backup = os.path.join(workdir, "backup")
    checkpoint = os.path.join(workdir, "checkpoint.keras")
    saved = os.path.join(workdir, "model.keras")
    weights = os.path.join(workdir, "model.weights.h5")
    with strategy.scope():
        model = case.build()
    callbacks = [
        keras.callbacks.BackupAndRestore(backup),
        keras.callbacks.ModelCheckpoint(checkpoint),
        _Preempt(),
    ]
    try:
        model.fit(x, y, epochs=2, callbacks=callbacks, **fit)
        raise AssertionError("the preemption did not happen")
    except Preempted:
        pass
    model.save(saved)
    model.save_weights(weights)
    expected = _predict(model, x)
    state = _optimizer_state(model)

    results = {"update": update, "features": _features(model)}
    for way in WAYS:
        if way == "model_checkpoint" and same_archive(checkpoint, saved):
            # ModelCheckpoint wrote the file `model.save` wrote (the same
            # model config and every array equal, checked): it loads and
            # resumes as that one did. Each restore traces a new step
            # (~1/6 of a row's time), so a file equal to one already
            # restored is not restored again.
            results[way] = dict(results["save"], same_file_as="save")
            continue
        with strategy.scope():
            if way in ("save", "model_checkpoint"):
                path = saved if way == "save" else checkpoint
                restored = _load(path, case)
            else:
                restored = case.build()
                if way == "weights":
                    restored.optimizer.build(restored.trainable_variables)
                    restored.load_weights(weights)
        if way == "backup":
            # What a restarted job runs: the same `fit`, the same callback.
            # It loads the backup as training begins, then resumes at the
            # epoch it had reached.
            probe = _Probe(x)
            restored.fit(
                x,
                y,
                epochs=2,
                callbacks=[keras.callbacks.BackupAndRestore(backup), probe],
                **fit,
            )
            predicted, restored_state = probe.predicted, probe.state
        else:
            predicted = _predict(restored, x)
            restored_state = _optimizer_state(restored)
            restored.fit(x, y, epochs=2, initial_epoch=1, **fit)
        results[way] = {
            "features": _features(restored),
            "predict": _max_diff([expected], [predicted]),
            "state": (
                _max_diff(state, restored_state)
                if len(state) == len(restored_state)
                else f"{len(restored_state)} variables, saved {len(state)}"
            ),
            "resume": _max_diff(_weights(restored), final) / update,
        }
    shutil.rmtree(workdir, ignore_errors=True)
    return results


def same_archive(a, b) -> bool:
    """Whether two `.keras` files hold the same model: every member equal
    but `metadata.json` (the date it was saved), the `.h5` weights compared
    array by array (their bytes carry HDF5's own timestamps)."""
    import zipfile

    import h5py

    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        names = sorted(n for n in za.namelist() if n != "metadata.json")
        if names != sorted(n for n in zb.namelist() if n != "metadata.json"):
            return False
        for name in names:
            left, right = za.read(name), zb.read(name)
            if not name.endswith(".h5"):
                if left != right:
                    return False
                continue
            if not _same_h5(io.BytesIO(left), io.BytesIO(right), h5py):
                return False
    return True


def _same_h5(a, b, h5py) -> bool:
    def arrays(f):
        out = {}

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = np.asarray(obj)

        f.visititems(visit)
        return out

    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        left, right = arrays(fa), arrays(fb)
    return left.keys() == right.keys() and all(
        left[k].dtype == right[k].dtype
        and left[k].shape == right[k].shape
        and np.array_equal(left[k], right[k])
        for k in left
    )


def _load(path, case):
    """`load_model`; a plain `keras.Model` under the policy it was saved
    with, as the README says (Keras builds a mixed model's layers, and its
    loss scale optimizer, under the global policy)."""
    if case.model != "keras":
        return keras.saving.load_model(path)
    with _global_policy(case.policy):
        return keras.saving.load_model(path)


def _predict(model, x):
    """One eager inference call (no `predict` function to trace)."""
    return keras.ops.convert_to_numpy(model(x, training=False))


def _features(model) -> dict:
    """What must come back: checkpointing, the optimizer chain, policies."""
    from tfmemopt.checkpointing import checkpointing_report

    target = getattr(model, "model", model)
    report = checkpointing_report(target) or checkpointing_report(model)
    chain, optimizer = [], model.optimizer
    while optimizer is not None:
        chain.append(type(optimizer).__name__)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return {
        "segments": None if report is None else len(report.segments),
        "optimizer": chain,
        "int8_codes": sum(
            v.dtype == "uint8" for v in model.optimizer.variables
        ),
        # The options as configured, and the head the loss was computed
        # from (decided at the first training step).
        "long_sequences": getattr(model, "_long_sequences", None),
        "sharded": getattr(model, "_shards", None) is not None,
        "chunked_head": getattr(
            getattr(model, "long_sequences", None), "head", None
        ),
        # the attention layers taken over (attention="chunked", #48)
        "chunked_attention": len(
            getattr(
                getattr(model, "long_sequences", None), "attention_layers", ()
            )
            or ()
        ),
        "lora_layers": len(lora_layers(model)),
        "trainable": len(model.trainable_variables),
        "policies": sorted(
            {layer.dtype_policy.name for layer in model.layers if layer.weights}
        ),
    }


class _Probe(keras.callbacks.Callback):
    """Reads what `BackupAndRestore` restored, before the first step."""

    def __init__(self, x):
        super().__init__()
        self.x = x

    def on_epoch_begin(self, epoch, logs=None):
        if not hasattr(self, "predicted"):
            self.epoch = epoch
            self.predicted = _predict(self.model, self.x)
            self.state = _optimizer_state(self.model)
