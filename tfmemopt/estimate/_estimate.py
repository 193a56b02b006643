"""How much memory one training step needs, before running it.

`estimate_memory` counts parameters, gradients, optimizer state,
accumulation buffers, the inputs, the activations kept for the backward
pass and the temporaries of the backward pass, for the settings tfmemopt
offers: mixed precision, activation checkpointing, gradient accumulation
and data-parallel replicas. Activations come from the real TensorFlow
gradient graph of the model (traced, not run), so every layer is covered.

The steps, each in its module: the arguments resolved (`_settings`), the
model traced (`_traced_model`), the weights, gradients and optimizer state
(`_model_state`), the activations (`_activations`), the gathered weights
of `shard_parameters` (`_param_sharding`), the temporaries
(`_temporaries`) and the accumulation window (`_accumulation_buffers`).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tfmemopt._compat import compiled_metric_names
from tfmemopt._utils import NATIVE_BFLOAT16_FLAGS
from tfmemopt._utils import cpu_has_native_bfloat16
from tfmemopt._utils import format_bytes
from tfmemopt._utils import keyword_options
from tfmemopt.estimate import _long_sequences as long_sequences
from tfmemopt.estimate._accumulation_buffers import accumulation_bytes
from tfmemopt.estimate._activations import activation_bytes
from tfmemopt.estimate._activations import segments
from tfmemopt.estimate._compiled_step import NotCompiled
from tfmemopt.estimate._compiled_step import compiled_step
from tfmemopt.estimate._compiled_step import describe
from tfmemopt.estimate._compiled_step import resolve_jit_compile
from tfmemopt.estimate._model_state import model_state
from tfmemopt.estimate._param_sharding import gathered_bytes
from tfmemopt.estimate._result import MemoryEstimate
from tfmemopt.estimate._settings import Settings
from tfmemopt.estimate._settings import counted
from tfmemopt.estimate._settings import resolve_settings
from tfmemopt.estimate._temporaries import cpu_allocator
from tfmemopt.estimate._temporaries import sharded_temporaries
from tfmemopt.estimate._temporaries import step_temporaries
from tfmemopt.estimate._traced_model import trace_model


@keyword_options
def estimate_memory(
    model: keras.Model,
    batch_size: int,
    *,
    optimizer=None,
    policy=None,
    accumulation_steps: int | None = None,
    checkpointing=None,
    replicas: int = 1,
    trainer: str | None = None,
    input_shape=None,
    sequence_length: int | None = None,
    min_counted_bytes: int = 0,
    shard_parameters: bool | None = None,
    chunked_loss: bool | None = None,
    attention=None,
    jit_compile=None,
) -> MemoryEstimate:
    """Estimates the peak memory of one training step, per device.

    Counts parameters, gradients and optimizer state from the model's
    weights and the real Keras optimizer; the activations kept for the
    backward pass and the backward temporaries from the TensorFlow gradient
    graph of the model, traced at the batch size (nothing runs, so this
    costs a trace of the model, seconds, and no activation memory). Mixed
    precision, checkpointing, accumulation and replicas are modelled:

    - another dtype policy: the model is rebuilt under it (functional and
      Sequential models, weights not copied) and that graph is traced, so
      the layers Keras keeps in float32 under a mixed policy
      (BatchNormalization, LayerNormalization, Embedding lookups, the loss)
      and the casts and their gradients are counted; a subclassed model's
      activations are scaled to the policy's itemsize instead, plus 16-bit
      weight copies. Weights, gradients and optimizer slots stay float32;
    - recurrent layers (any `tf.while_loop`): the TensorLists that
      TensorFlow keeps per time step for the backward pass are sized from
      the loop; `trainer` says which gradient tape runs the step;
    - checkpointing `"auto"` / `"blocks"`: the step is traced with
      `enable_checkpointing` applied (the segments' inputs kept, each
      segment recomputed in the backward pass); a model it refuses is
      estimated without saving; an int policy keeps segment boundaries
      plus the largest segment, by rule;
    - accumulation traces one micro-batch and adds float32 accumulators;
    - `replicas` splits the global batch; each replica holds all weights,
      unless `shard_parameters`: then each keeps 1/R of the weights,
      gradients and optimizer state, plus the gathered weights alive at
      the peak.

    The simulated step also counts the copies TensorFlow's Einsum kernel
    makes (and those of two gradients that run at once), lets element-wise
    ops write into an input only they read, counts the optimizer update's
    temporaries and frees each gradient when its weight's update has run
    (`freed`), and, with `min_counted_bytes` (a CPU), counts what the
    allocator's whole chunks add and the zeros that Grappler's rewrite of
    large gradient sums keeps (docs/estimator.md).

    Args:
        model: A built `keras.Model` (functional, sequential, or
            subclassed and built).
        batch_size: Int, the global batch size of one `fit` step.
        optimizer: `None` (the model's compiled optimizer, else Adam), a
            `keras.optimizers.Optimizer` or a name, case-insensitive:
            Keras's (`"adamw"`), tfmemopt's (`"AdamW8bit"`, every name
            `plan` prints); `"adafactor"` is `tfmemopt.optimizers.Adafactor`
            (Keras's: `"keras.optimizers.Adafactor"`).
        policy: `None` (the model's dtype policy), a policy name such as
            `"mixed_bfloat16"`, or a `keras.DTypePolicy`.
        accumulation_steps: `None` (the model's own: a `tfmemopt.Model`'s
            `accumulation_steps`, or the steps its `micro_batch_size`
            makes of the batch; else 1) or Int: micro-batches per step.
        checkpointing: `None` (off), `"auto"` (about sqrt(N) layers per
            segment), `"blocks"` (one segment per top-level layer) or an
            Int (layers per segment).
        replicas: Int, defaults to `1`: data-parallel replicas sharing the
            global batch.
        trainer: `None` (`"tfmemopt"` for a `tfmemopt.Model` or
            `accumulation_steps > 1`, else `"keras"`), `"keras"` (Keras's
            own `fit` step) or `"tfmemopt"` (`tfmemopt.Model`'s step). Both
            take one gradient of the loss with a non-persistent tape, so
            both are traced alike. (`tfmemopt.Model` uses a persistent tape
            only when a masked loss term sits beside other loss terms:
            each is normalised over the whole window, so each needs its own
            gradient; TensorFlow then keeps every intermediate of a loop
            body, about 2-4x an LSTM's memory. That case is not modelled.)
        input_shape: `None` (the model's), one sample's shape without the
            batch (`(128,)`), a list of them (one per input, in order) or a
            dict by input name: for inputs with unknown dimensions
            (`keras.Input(shape=(None,))`) or a subclassed model that is not
            built (float32 inputs).
        sequence_length: `None` or Int: every unknown dimension of the
            inputs besides the batch takes this size (keras-hub text
            models: `token_ids` and `padding_mask` of shape `(None,)`).
        min_counted_bytes: Int, defaults to `0` (count every tensor, as an
            accelerator's allocator does). Estimate what an allocator whose
            statistics do not count allocations smaller than this reports:
            `CPU_STATS_MIN_BYTES` (256 KiB) for
            `tf.config.experimental.get_memory_info("CPU:0")` under oneDNN,
            to compare the estimate with a peak measured on a CPU. Every
            tensor, weight, gradient and optimizer slot below it counts 0.
        shard_parameters: `None` (the model's own: a `tfmemopt.Model`
            built with `shard_parameters=True`, else `False`) or Bool: the
            weights sharded over the `replicas` (FSDP,
            `tfmemopt.Model(..., shard_parameters=True)`). Each replica
            keeps a shard of `ceil(n / R)` elements of each trainable
            weight, its shard of the summed gradient and the optimizer's
            state built on the shards, and gathers each weight whole when
            its layer runs (`gathered`); with accumulation, float32
            accumulators of the shards. No effect with one replica.
        chunked_loss: `None` (the model's own: a `tfmemopt.Model`'s
            `chunked_loss`, else `False`) or Bool: the step computes the
            language-model loss from the head's input in chunks
            (`tfmemopt.Model(..., chunked_loss=True)`): traced so, the
            logits are never formed.
        attention: `None` (the model's own), `"chunked"` (every
            `MultiHeadAttention` in query blocks, as
            `tfmemopt.Model(..., attention="chunked")`) or `False` (off).
            `MemoryEstimate.terms` names what the head and the loss keep
            (`"logits"`) and what the attention layers keep
            (`"attention_scores"`).
        jit_compile: `None` (as `fit` will: the model's own
            `compile(jit_compile=...)`, `"auto"` resolved as Keras does on
            this machine: on with a GPU or TPU, off on a CPU-only machine
            and under a distribution strategy), `True` or `False`. When
            on, the step `fit` runs (a `tfmemopt.Model` step with these
            settings and a copy of the optimizer) is compiled with XLA for
            the local device, without running it, and the estimate is read
            from XLA's buffer assignment: `temporaries` is XLA's temporary
            buffer (activations, gradients and the update's temporaries
            together), `gradients`, `activations` and `accumulation` are 0,
            and `compiled` holds the figures and the compile time. This
            allocates the optimizer's state for the compile. Where the
            step cannot be compiled as asked (replicas, sharding, a policy
            a subclassed model cannot be rebuilt under, an op XLA does not
            compile), the executor's estimate is returned with a note.

    Returns:
        A `MemoryEstimate` (bytes per field, `.total`, `.table()`,
        `.to_dict()`).

    Raises:
        TypeError: `model` is not a Keras model.
        ValueError: the model is not built, an input has an unknown
            dimension and neither `input_shape` nor `sequence_length` sizes
            it, a count is < 1, or the optimizer, policy or checkpointing
            policy is unknown.

    Example:

    >>> model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(8)])
    >>> est = tfmemopt.estimate_memory(model, batch_size=64, optimizer="sgd")
    >>> est.parameters  # (32 * 8 + 8) float32 weights
    1056
    """
    s = resolve_settings(
        model,
        batch_size,
        optimizer,
        policy,
        accumulation_steps,
        checkpointing,
        replicas,
        trainer,
        sequence_length,
        min_counted_bytes,
        shard_parameters,
    )
    s.chunked_loss, s.attention = long_sequences.resolve(
        model, chunked_loss, attention
    )
    fallback = None
    if resolve_jit_compile(model, jit_compile, replicas):
        try:
            return _compiled_estimate(
                model, batch_size, s, input_shape, sequence_length
            )
        except NotCompiled as e:
            fallback = (
                f"jit_compile: not compiled with XLA here ({e}); estimated "
                "for TensorFlow's executor"
            )
    return _executor_estimate(
        model, batch_size, s, input_shape, sequence_length, fallback
    )


def _executor_estimate(
    model, batch_size, s, input_shape, sequence_length, fallback
) -> MemoryEstimate:
    """The estimate for TensorFlow's executor: the traced step's model
    state, activations, temporaries and accumulation (`fallback`: why it
    was not compiled with XLA, or None)."""
    # Trace first: a subclassed model may create its weights on first call.
    trace_notes = []
    traced, step, rescale = trace_model(
        model, s, trace_notes, input_shape, sequence_length
    )
    trainable = model.trainable_weights
    state = model_state(model, s)
    notes = [f"optimizer: {state.optimizer_how} ({s.opt_source})"]
    if fallback:
        notes.append(fallback)
    notes += trace_notes
    notes += _measurement_notes(s)
    activations = activation_bytes(model, traced, step, rescale, s, notes)
    notes += _model_notes(model, s)
    gathered = _gathered(traced, step, s, notes)
    if s.shard_parameters:
        temporaries, freed, update = sharded_temporaries(
            trainable, step, s, state.whole_gradients
        )
    else:
        temporaries, freed, update = step_temporaries(
            trainable, step, s, state.gradients, activations
        )
    notes += update.notes
    notes += _step_notes(step, s)
    run_ahead = step.run_ahead  # with accumulation only (`in_loop`)
    inputs, accumulation, window_end = accumulation_bytes(
        trainable, step, s, notes, state.shard_sizes
    )
    # The window's end, the activations freed: what it holds beyond
    # `accumulation` is a temporary.
    temporaries = max(temporaries, window_end - state.gradients - activations)
    temporaries += sum(step.folded)  # allocated before the step, kept
    if s.min_counted_bytes and not s.shard_parameters:
        temporaries += cpu_allocator(model, trainable, step, s, update, notes)
    if s.replicas > 1 and not s.shard_parameters:
        notes.append(
            f"{s.replicas} replicas: batch {s.per_replica} per replica, a "
            "packed copy of the gradients for the all-reduce"
        )
    return MemoryEstimate(
        parameters=int(state.parameters),
        gradients=int(state.gradients),
        optimizer_state=int(state.optimizer_state),
        accumulation=int(accumulation),
        inputs=int(inputs),
        activations=int(activations),
        temporaries=int(temporaries),
        gathered=int(gathered),
        freed=int(freed),
        terms=long_sequences.terms(traced, step),
        settings=_settings_of(s, batch_size),
        layers=_by_layer(step),
        notes=notes,
        run_ahead=int(run_ahead),
    )


def _model_notes(model, s: Settings) -> list:
    """What the estimate counts because of how the model is compiled and
    wrapped: its metrics and the long-sequence options."""
    notes = []
    metrics = compiled_metric_names(model)
    if metrics:
        notes.append(
            f"compiled metrics ({', '.join(metrics)}): counted, updated from "
            "the model's output after the gradient as the step does; on a "
            "language model's logits they keep the logits and temporaries "
            "of their size alive (keras-hub Llama, 1 x 1024 tokens, "
            "vocabulary 32000: 671.9 MiB measured with keras-hub's default "
            "SparseCategoricalAccuracy, 374.4 without). Compile with "
            "weighted_metrics=[] and metrics=[] to train in less memory "
            "(None keeps the metrics of an earlier compile, and keras-hub "
            "compiles its tasks when it makes them)"
        )
    if s.chunked_loss or s.attention:
        notes.append(
            f"long sequences: chunked_loss={s.chunked_loss}, attention="
            f"{s.attention!r}, traced as tfmemopt.Model's step runs them"
        )
    return notes


def _step_notes(step, s: Settings) -> list:
    """What the traced step holds beyond its tensors: weight-decay copies,
    a recurrent loop's run-ahead, constants Grappler folds."""
    notes = []
    if step.decay_copies:
        notes.append(
            f"weight decay: {type(s.optimizer).__name__} decays each weight "
            "before its gradient is made; a weight the backward pass still "
            "reads is copied (copy-on-write): "
            f"{format_bytes(step.decay_copies)} at the step's peak, in "
            "`temporaries`"
        )
    if step.run_ahead:
        notes.append(
            "recurrent layers in the accumulation window: a backward loop's "
            "iterations can run ahead of the sums of their weight "
            "gradients, the loop's parallel_iterations at most: up to "
            f"{format_bytes(step.run_ahead)} more than this estimate "
            "(`run_ahead`, not in the total), depending on how long each op "
            "takes: measured 1.75x the estimate on an Elman RNN language "
            "model with 4 micro-batches (docs/estimator.md)"
        )
    if step.folded:
        notes.append(
            f"{len(step.folded)} constant(s) that Grappler folds "
            "zeros_like / ones_like / fill of a known shape into (e.g. in "
            "the gradient of clip_by_value): "
            f"{format_bytes(sum(step.folded))}, allocated once and kept, "
            "in `temporaries`"
        )
    return notes


def _compiled_estimate(model, batch_size, s, input_shape, sequence_length):
    """The estimate read from XLA's buffer assignment of the compiled step
    (`_compiled_step`); `NotCompiled` where it cannot be compiled here."""
    if s.shard_parameters:
        raise NotCompiled("shard_parameters runs under a strategy")
    sizes, seconds, step_notes, state = compiled_step(
        model, s, input_shape, sequence_length
    )
    notes = [f"optimizer: {type(s.optimizer).__name__} ({s.opt_source})"]
    notes += [describe(sizes, seconds)] + step_notes
    notes += _measurement_notes(s)
    # What the step's arguments hold beyond weights, state and batch
    # (step counters, metric and seed variables): in `temporaries`.
    rest = sizes["arguments"] - (
        state["parameters"] + state["optimizer_state"] + state["inputs"]
    )
    settings = _settings_of(s, batch_size)
    settings["jit_compile"] = True
    return MemoryEstimate(
        parameters=int(state["parameters"]),
        gradients=0,
        optimizer_state=int(state["optimizer_state"]),
        accumulation=0,
        inputs=int(state["inputs"]),
        activations=0,
        temporaries=int(sizes["temporary"] + sizes["outputs"] + max(rest, 0)),
        settings=settings,
        notes=notes,
        compiled={
            **sizes,
            "gradients": int(state["gradients"]),
            "compile_seconds": round(seconds, 2),
        },
    )


def _measurement_notes(s: Settings) -> list:
    """The notes on what the figure is compared with, on both paths: the
    allocations `min_counted_bytes` leaves out, and bfloat16 emulated on
    this CPU."""
    notes = []
    if s.min_counted_bytes:
        notes.append(
            f"allocations below {format_bytes(s.min_counted_bytes)} not "
            "counted "
            "(min_counted_bytes): the allocator statistics' view"
        )
    emulated = _emulated_bfloat16_note(s)
    if emulated:
        notes.append(emulated)
    return notes


def _emulated_bfloat16_note(s: Settings, native=None, accelerators=None):
    """The note that the estimate is for native bfloat16, where the step
    runs on a CPU that emulates it; else None.

    Measured on a 2-core AMD EPYC (AVX2, no AVX512_BF16): the BatchNorm CNN
    under `mixed_bfloat16` at batch 64 peaked at 70.8 MiB against an
    estimate of 41.2 (-42%), where CPUs with AVX512_BF16 and AMX, and the
    rest of the estimator's cases, agree within the test's 35%: oneDNN
    converts bfloat16 tensors to float32 around its kernels there and keeps
    the copies. The estimator does not model them; it estimates the step on
    hardware with native bfloat16 (GPUs, TPUs, such CPUs).
    """
    if "bfloat16" not in (s.policy.compute_dtype, s.policy.variable_dtype):
        return None
    if accelerators is None:
        accelerators = bool(
            tf.config.list_physical_devices("GPU")
            or tf.config.list_physical_devices("TPU")
        )
    if accelerators:
        return None
    native = cpu_has_native_bfloat16() if native is None else native
    if native is not False:
        return None
    return (
        "bfloat16 is emulated on this CPU (none of "
        f"{', '.join(NATIVE_BFLOAT16_FLAGS)}): this estimate is for "
        "hardware with native bfloat16 (a GPU, a TPU, or a CPU with those "
        "features); here oneDNN keeps float32 copies around its kernels "
        "that it does not count (a BatchNorm CNN measured 1.7x the "
        "estimate)"
    )


def _gathered(traced, step, s: Settings, notes) -> int:
    """Under `shard_parameters`, the gathered weights alive at the step's
    peak (0 otherwise); adds a note."""
    if not s.shard_parameters:
        return 0
    gathered, how = gathered_bytes(
        traced, segments(traced, step, s), s, lambda n: counted(n, s)
    )
    notes.append(
        f"shard_parameters over {s.replicas} replicas: each keeps 1/"
        f"{s.replicas} of the weights, gradients and optimizer state; "
        f"gathered weights: {how}"
    )
    return gathered


def _settings_of(s: Settings, batch_size) -> dict:
    """`MemoryEstimate.settings`: the settings the step was estimated at."""
    return {
        "batch_size": batch_size,
        "optimizer": type(s.optimizer).__name__,
        "policy": s.policy.name,
        "accumulation_steps": s.accumulation_steps,
        "checkpointing": s.checkpointing,
        "replicas": s.replicas,
        "trainer": s.trainer,
        "min_counted_bytes": s.min_counted_bytes,
        "shard_parameters": s.shard_parameters,
        "chunked_loss": s.chunked_loss,
        "attention": s.attention,
        "jit_compile": False,
    }


def _by_layer(step) -> list:
    """`[(layer name, bytes kept)]`, largest first."""
    layers = {}
    for path, n in step.saved_by_layer:
        name = path[-1] if path else "(loss and other)"
        layers[name] = layers.get(name, 0) + n
    return sorted(layers.items(), key=lambda kv: -kv[1])
