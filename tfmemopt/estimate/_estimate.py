"""How much memory one training step needs, before running it.

`estimate_memory` counts parameters, gradients, optimizer state,
accumulation buffers, the inputs, the activations kept for the backward
pass and the temporaries of the backward pass, for the settings tfmemopt
offers: mixed precision, activation checkpointing, gradient accumulation
and data-parallel replicas. Activations come from the real TensorFlow
gradient graph of the model (traced, not run), so every layer is covered.
"""

from __future__ import annotations

import math

import keras

from tfmemopt._compat import sublayers
from tfmemopt._utils import format_bytes
from tfmemopt.accumulation import Model
from tfmemopt.distribute import ShardedOptimizer
from tfmemopt.estimate import _long_sequences as long_sequences
from tfmemopt.estimate._activation_rules import checkpoint_segments
from tfmemopt.estimate._activation_rules import checkpointed_activations
from tfmemopt.estimate._activation_rules import unknown_layers
from tfmemopt.estimate._kernels import rewritten_sum_zeros
from tfmemopt.estimate._optimizer_state import _itemsize
from tfmemopt.estimate._optimizer_state import optimizer_state_bytes
from tfmemopt.estimate._param_sharding import gathered_bytes
from tfmemopt.estimate._param_sharding import sharded_state
from tfmemopt.estimate._param_sharding import state_per_replica
from tfmemopt.estimate._result import MemoryEstimate
from tfmemopt.estimate._settings import Settings
from tfmemopt.estimate._settings import counted
from tfmemopt.estimate._settings import resolve_settings
from tfmemopt.estimate._step_graph import trace_step
from tfmemopt.estimate._update import chunks
from tfmemopt.estimate._update import consumers
from tfmemopt.estimate._update import update_temporaries
from tfmemopt.precision._policy_clone import rebuilt_under


def estimate_memory(
    model: keras.Model,
    batch_size: int,
    optimizer=None,
    policy=None,
    accumulation_steps: int = 1,
    checkpointing=None,
    replicas: int = 1,
    trainer: str | None = None,
    input_shape=None,
    sequence_length: int | None = None,
    min_counted_bytes: int = 0,
    shard_parameters: bool | None = None,
    chunked_loss: bool | None = None,
    attention=None,
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
    - checkpointing keeps only segment boundaries plus the largest segment
      (recomputed in the backward pass);
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
        accumulation_steps: Int, defaults to `1`: micro-batches per step.
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
            its layer runs (`gathered`). No effect with one replica.
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
    # Trace first: a subclassed model may create its weights on first call.
    traced, step, rescale = _trace(model, s, input_shape, sequence_length)
    trainable = model.trainable_weights
    params = sum(counted(_weight_bytes(v, s), s) for v in model.weights)
    grads = sum(counted(_weight_bytes(v, s), s) for v in trainable)
    whole_grads = grads
    if s.shard_parameters:
        sharded = sharded_state(model, s, lambda n: counted(n, s))
        params, grads = sharded.parameters, sharded.gradients
        opt_bytes, opt_how = sharded.optimizer_state, sharded.optimizer_how
    else:
        opt_bytes, opt_how = _optimizer_bytes(trainable, s)
    notes = [f"optimizer: {opt_how} ({s.opt_source})"]
    if s.floor:
        notes.append(
            f"allocations below {format_bytes(s.floor)} not counted "
            "(min_counted_bytes): the allocator statistics' view"
        )
    activations = _activations(model, traced, step, rescale, s, notes)
    if s.chunked_loss or s.attention:
        notes.append(
            f"long sequences: chunked_loss={s.chunked_loss}, attention="
            f"{s.attention!r}, traced as tfmemopt.Model's step runs them"
        )
    gathered = 0
    if s.shard_parameters:
        gathered, how = gathered_bytes(
            traced, _segments(traced, step, s), s, lambda n: counted(n, s)
        )
        notes.append(
            f"shard_parameters over {replicas} replicas: each keeps 1/"
            f"{replicas} of the weights, gradients and optimizer state; "
            f"gathered weights: {how}"
        )
        temporaries, freed, update = _sharded_temporaries(
            trainable, step, s, whole_grads
        )
    else:
        temporaries, freed, update = _step_temporaries(
            trainable, step, s, grads, activations
        )
    notes += update.notes
    inputs, accumulation, window_end = _accumulation(trainable, step, s, notes)
    # The window's end, the activations freed: what it holds beyond
    # `accumulation` is a temporary.
    temporaries = max(temporaries, window_end - grads - activations)
    if s.floor and not s.shard_parameters:
        temporaries += _cpu_allocator(model, trainable, step, s, update, notes)
    if replicas > 1 and not s.shard_parameters:
        notes.append(
            f"{replicas} replicas: batch {s.per_replica} per replica, a "
            "packed copy of the gradients for the all-reduce"
        )
    return MemoryEstimate(
        parameters=int(params),
        gradients=int(grads),
        optimizer_state=int(opt_bytes),
        accumulation=int(accumulation),
        inputs=int(inputs),
        activations=int(activations),
        temporaries=int(temporaries),
        gathered=int(gathered),
        freed=int(freed),
        terms=long_sequences.terms(traced, step),
        settings={
            "batch_size": batch_size,
            "optimizer": type(s.optimizer).__name__,
            "policy": s.policy.name,
            "accumulation_steps": accumulation_steps,
            "checkpointing": s.checkpointing,
            "replicas": replicas,
            "trainer": s.trainer,
            "min_counted_bytes": s.floor,
            "shard_parameters": s.shard_parameters,
            "chunked_loss": s.chunked_loss,
            "attention": s.attention,
        },
        layers=_by_layer(step),
        notes=notes,
    )


def _step_temporaries(trainable, step, s: Settings, grads, activations):
    """`(temporaries, freed, update)`: what the step holds beyond the
    weights, state, gradients, activations and inputs at its peak.

    The backward pass's own temporaries (the simulated peak less what is
    counted elsewhere), the all-reduce's packed copy of the gradients, the
    optimizer update's temporaries once the activations are freed, and,
    where the update starts during the backward pass, the gradients it
    frees (`freed`), with what it keeps from the first step on.
    """
    # The simulated peak holds the gradients that exist at that point, as
    # the step makes them (an embedding's as its gathered rows); what is
    # above the activations, the inputs and the dense gradients counted
    # in `gradients` is a temporary.
    temporaries = max(0, step.peak - step.saved - grads - step.inputs)
    if s.replicas > 1:  # the all-reduce's packed copy of the gradients
        temporaries += grads
    # After the backward pass (and the all-reduce) the optimizer updates
    # each weight with temporaries of the weight's size; the activations
    # are freed by then.
    shards = s.replicas if isinstance(s.optimizer, ShardedOptimizer) else 1
    # A sparse gradient is updated as the whole batch's rows (under
    # accumulation, every micro-batch's concatenated).
    n_micro = s.per_replica // s.micro
    update = update_temporaries(
        [(math.prod(v.shape), _weight_bytes(v, s)) for v in trainable],
        s.optimizer,
        lambda n: counted(n, s),
        shards,
        {i: n * n_micro for i, n in step.sparse_values.items()},
    )
    after = step.gradients + update.peak - grads - activations
    temporaries = max(temporaries, after)
    freed = 0
    if step.updating_peak is not None:
        # Each gradient is consumed as it is made: by its weight's update,
        # or added into its accumulator (then the window's update comes
        # after the last micro-batch, with every gradient).
        during = max(0, step.updating_peak - step.saved - step.inputs)
        end = after + grads + activations if s.accumulation_steps > 1 else 0
        x = max(activations + during, end) - grads - activations
        temporaries, freed = max(0, x), max(0, -x)
    temporaries += update.resident  # allocated from the first step on
    return temporaries, freed, update


def _sharded_temporaries(trainable, step, s: Settings, whole_grads):
    """`(temporaries, freed, update)` under `shard_parameters`.

    Each weight's gradient is made whole by the backward pass, all-reduced
    (a whole-size result) and sliced to this replica's shard as soon as
    it is made (the all-gather's gradient): the step is simulated with
    each gradient consumed by one whole-size temporary (`consumers`), so
    the backward pass holds the transient whole gradients of the weights
    whose backward is running, not all of them. The optimizer then updates
    the shards (its temporaries are of the shard's size); the activations
    and gathered weights are freed by then.
    """
    weights = [(math.prod(v.shape), _weight_bytes(v, s)) for v in trainable]
    update = update_temporaries(
        weights, s.optimizer, lambda n: counted(n, s), s.replicas
    )
    peak = step.updating_peak
    if peak is None:  # not simulated: every whole gradient alive at once
        peak = step.peak
    during = max(0, peak - step.saved - step.inputs)
    return max(during, update.peak) + update.resident, 0, update


def _segments(traced, step, s: Settings):
    """The checkpointed segments (lists of layer paths), or None."""
    if s.checkpointing is None:
        return None
    segs, _, _, _ = checkpoint_segments(step, s.checkpointing, traced)
    return segs or None


def _cpu_allocator(model, trainable, step, s: Settings, update, notes):
    """What the CPU statistics' allocator adds (with `min_counted_bytes`):
    its whole chunks, and the zeros of Grappler's rewrite of large gradient
    sums (docs/estimator.md: both model the CPU, not a GPU)."""
    extra = chunks(
        [counted(_weight_bytes(v, s), s) for v in model.weights],
        [counted(_weight_bytes(v, s), s) for v in trainable],
        s.optimizer,
        s.accumulation_steps > 1,
        step,
        s.per_replica // s.micro,
        update,
    )
    zeros = rewritten_sum_zeros(step)
    if zeros:
        notes.append(
            "Grappler rewrites gradient sums alive at the peak into "
            "accumulations; their zeros stay allocated "
            f"({format_bytes(zeros)}; the CPU device's 256 MiB)"
        )
    return extra + zeros


def _trace(model, s: Settings, input_shape=None, sequence_length=None):
    """`(traced model, its step graph, whether activations are rescaled)`.

    Another policy: trace the model rebuilt under it (Keras keeps some
    activations float32); a model that cannot be rebuilt (layers without a
    config, subclassed models) is traced with its layers' policies set to
    it for the trace and put back, when the policy keeps the variables'
    dtype (float32 -> mixed_*); else its float32 activations are scaled. A
    `tfmemopt.Model.wrap(inner)` is traced as `inner` (the same weights and
    graph; the policy rebuild and checkpointing segments need its layers).
    """
    outer = traced = model
    inner = getattr(model, "inner", None)
    if isinstance(model, Model) and isinstance(inner, keras.Model):
        traced = model = inner
    swapped = []
    if s.policy.name != model.dtype_policy.name:
        traced = rebuilt_under(model, s.policy.name) or model
        if traced is model and (
            s.policy.variable_dtype == model.dtype_policy.variable_dtype
        ):
            swapped = _swap_policies(model, s.policy)

    def trace(rescale):
        with long_sequences.options_for_trace(
            outer, traced, s.chunked_loss, s.attention
        ) as owner:
            return _trace_with(rescale, owner)

    def _trace_with(rescale, owner):
        return trace_step(
            traced,
            s.micro,
            owner=owner,
            activation_itemsize=s.compute if rescale else None,
            input_shape=input_shape,
            sequence_length=sequence_length,
            min_counted_bytes=s.floor,
            update=consumers(
                s.optimizer,
                s.accumulation_steps > 1,
                s.replicas,
                lambda v: counted(_weight_bytes(v, s), s),
                sharded=s.shard_parameters,
            ),
        )

    if swapped:
        try:
            step = trace(False)
            s.policy_in_place = True
            return traced, step, False
        except Exception:  # noqa: BLE001 - a layer not written for 16 bits
            pass  # (e.g. adds a float32 constant): the scaling rule
        finally:
            for layer, policy in swapped:
                layer.dtype_policy = policy
    rescale = s.compute != _itemsize(model.compute_dtype) and traced is model
    return traced, trace(rescale), rescale


def _swap_policies(model, policy):
    """Sets `policy` on every layer of `model` under the model's own policy
    (a layer with a policy of its own keeps it); returns `[(layer, old)]`."""
    old = model.dtype_policy.name
    swapped = []
    for layer in sublayers(model, include_self=True):
        current = layer.dtype_policy
        if current.name == old and current.quantization_mode is None:
            swapped.append((layer, current))
            layer.dtype_policy = policy
    return swapped


def _weight_bytes(v, s: Settings) -> int:
    n = math.prod(v.shape)
    if keras.backend.is_float_dtype(v.dtype):
        return n * s.variable
    return n * _itemsize(v.dtype)


def _optimizer_bytes(trainable, s: Settings):
    """`(bytes, how)` of the optimizer's slots for the trainable weights."""
    # Below the floor: the slots of a weight that is itself not counted
    # (every slot is at most the weight's size).
    shapes = [
        (
            tuple(v.shape),
            s.policy.variable_dtype
            if keras.backend.is_float_dtype(v.dtype)
            else v.dtype,
        )
        for v in trainable
        if counted(_weight_bytes(v, s), s)
    ]
    if isinstance(s.optimizer, ShardedOptimizer) and s.replicas > 1:
        return state_per_replica(s.optimizer.inner_optimizer, shapes, s)
    return optimizer_state_bytes(s.optimizer, shapes)


def _activations(model, traced, step, rescale, s: Settings, notes) -> int:
    """Activations kept for the backward pass: traced, unknown-sized
    layers by rule, 16-bit weight copies, checkpointing. Adds notes."""
    activations = step.saved
    unknown_bytes, unknown_notes = unknown_layers(
        traced, step, s.compute, s.micro
    )
    notes += unknown_notes
    if traced is not model or s.policy_in_place:
        how = "rebuilt under"
        if traced is model:
            how = "with its layers set to"
        notes.append(
            f"{s.policy.name}: traced the model {how} the policy "
            "(float32 weights, gradients and optimizer state; the layers "
            "Keras runs in float32 keep float32 activations)"
        )
    elif rescale and s.compute < s.variable:
        # The 16-bit copies of the weights read by the backward pass.
        casts = sum(
            counted(math.prod(v.shape) * s.compute, s)
            for v in model.trainable_weights
            if keras.backend.is_float_dtype(v.dtype)
        )
        activations += casts
        notes.append(
            f"{s.policy.name}: {s.compute}-byte activations, float32 "
            "weights, gradients and optimizer state, 16-bit weight copies"
        )
    if s.checkpointing is not None:
        kept, n_segments, _ = checkpointed_activations(
            step, s.checkpointing, traced
        )
        notes.append(
            f"checkpointing {s.checkpointing!r}: {n_segments} segments; "
            "boundaries plus the largest segment (recomputed) kept"
        )
        activations = activations - step.saved + kept
    return activations + unknown_bytes


def _accumulation(trainable, step, s: Settings, notes):
    """`(input bytes, accumulator bytes, window-end bytes)`; adds a note
    when accumulating.

    The window-end bytes are what the window's end holds beyond the
    accumulator bytes, with the activations freed: a sparse gradient's
    last piece and the concatenation of all its pieces.
    """
    inputs = step.inputs
    if s.accumulation_steps <= 1:
        return inputs, 0, 0
    inputs += sum(
        counted(n * s.per_replica // s.micro, s) for n in step.input_sizes
    )
    # Dense gradients are summed into float32 accumulators, which live
    # beside each micro-batch's gradients (measured: ResNet50's window
    # with micro-batches of 4 peaks as high as its plain step at 16, both
    # sets of its 94 MiB of gradients alive).
    accumulation = sum(
        counted(math.prod(v.shape) * 4, s)
        for i, v in enumerate(trainable)
        if i not in step.sparse_rows
    )
    # Sparse ones (embedding lookups) stay sparse: each micro-batch's rows
    # are kept. At the last micro-batch's peak the earlier micro-batches'
    # pieces are alive beside its own (counted in the step's gradients);
    # at the window's end the pieces are concatenated (both alive for the
    # concat, the activations freed) and the update reads the
    # concatenation alone (issue #23: counting the pieces and the
    # concatenation beside the activations read +24% on a two-tower
    # model, where the update after the window is the peak).
    n_micro = s.per_replica // s.micro
    rows = sum(n * n_micro for n in step.sparse_rows.values())
    accumulation += sum(
        (n_micro - 1) * counted(n, s) for n in step.sparse_rows.values()
    )
    window_end = sum(
        counted(n, s) + counted(n * n_micro, s)
        for n in step.sparse_rows.values()
    )
    notes.append(
        f"accumulation: micro-batch {s.micro} x {s.accumulation_steps}, "
        "float32 accumulators"
        + (
            f"; sparse gradients keep the batch's rows ({format_bytes(rows)})"
            if rows
            else ""
        )
    )
    return inputs, accumulation, window_end


def _by_layer(step) -> list:
    """`[(layer name, bytes kept)]`, largest first."""
    layers = {}
    for path, n in step.saved_by_layer:
        name = path[-1] if path else "(loss and other)"
        layers[name] = layers.get(name, 0) + n
    return sorted(layers.items(), key=lambda kv: -kv[1])
