"""The memory of a training step that XLA compiles, read from XLA itself.

Under `jit_compile=True` (what Keras's `"auto"` resolves to on a GPU, and
what a TPU always runs) the memory of one step is decided before it runs,
by XLA's buffer assignment: the step's arguments (the batch, the weights,
the optimizer's state), one temporary buffer that holds every intermediate
(activations kept for the backward pass, gradients, the update's
temporaries, packed by XLA's heap simulator), and the outputs that do not
alias an argument. This module compiles the step that `fit` would run (a
`tfmemopt.Model.wrap` of the model with the settings asked, compiled with
a copy of the optimizer) for the local device, without running it, and
reads that assignment (`stage="optimized_hlo_proto_serialized"`: XLA's
`HloProto` with its `buffer_assignment`).

Nothing here models the runtime; what is not in the assignment is not
counted: on a CPU TensorFlow's allocator may place the temporary buffer in
a larger chunk of its own and count the chunk (docs/xla.md).
"""

from __future__ import annotations

import math
import time

import keras
import tensorflow as tf

from tfmemopt._compat import auto_jit_compile
from tfmemopt._compat import compiled_jit_compile
from tfmemopt._compat import compiled_metrics
from tfmemopt._utils import format_bytes
from tfmemopt.accumulation import Model
from tfmemopt.estimate._checkpointed_trace import library_checkpointing
from tfmemopt.estimate._checkpointed_trace import own_report
from tfmemopt.estimate._input_specs import _as_call_arg
from tfmemopt.estimate._input_specs import _loss_and_target_specs
from tfmemopt.estimate._input_specs import _output_shapes
from tfmemopt.estimate._input_specs import input_specs
from tfmemopt.estimate._settings import counted
from tfmemopt.estimate._step_trace import _nbytes
from tfmemopt.longseq import disable_long_sequences
from tfmemopt.precision import rebuilt_under


class NotCompiled(Exception):
    """The step cannot be compiled here as asked (the reason is the
    message); `estimate_memory` estimates it for the executor instead."""


def resolve_jit_compile(model, jit_compile, replicas: int) -> bool:
    """Whether the step `fit` runs is compiled with XLA.

    `None`: the model's own `compile(jit_compile=...)`, else `"auto"`.
    `"auto"`: as Keras resolves it on the device at hand (on with an
    accelerator; off on a CPU-only machine, under a distribution strategy
    or `replicas > 1`, with op determinism, where a layer does not support
    XLA).
    """
    if jit_compile is None:
        jit_compile = compiled_jit_compile(model)
        if jit_compile is None:
            jit_compile = "auto"
    if jit_compile == "auto":
        return replicas == 1 and auto_jit_compile(model)
    if not isinstance(jit_compile, bool):
        raise ValueError(
            "estimate_memory: jit_compile must be None, 'auto', True or "
            f"False. Received: jit_compile={jit_compile!r}. Fix: pass True "
            "to estimate the step XLA compiles (compile(jit_compile=True)), "
            "False for TensorFlow's executor, or None to resolve it as "
            "Keras's 'auto' does on this machine."
        )
    return jit_compile


def _hlo_proto():
    from tensorflow.compiler.xla.service import hlo_pb2

    return hlo_pb2.HloProto()


def buffer_sizes(serialized: bytes, floor: int = 0) -> dict:
    """XLA's buffer assignment of a serialized `HloProto`, in bytes:
    `arguments` (entry parameters), `temporary` (the temporary buffers),
    `outputs` (live-out buffers that alias no argument). Thread-local
    buffers and constants (part of the executable) are not counted;
    allocations below `floor` bytes count 0."""
    proto = _hlo_proto()
    proto.ParseFromString(serialized)
    out = {"arguments": 0, "temporary": 0, "outputs": 0, "largest": 0}
    for a in proto.buffer_assignment.buffer_allocations:
        if a.is_thread_local or a.is_constant or a.is_tuple:
            continue
        size = a.size if a.size >= floor else 0
        if a.is_entry_computation_parameter:
            out["arguments"] += size
        elif a.maybe_live_out:
            out["outputs"] += size
        else:
            out["temporary"] += size
            out["largest"] = max(out["largest"], size)
    return out


def _optimizer_copy(optimizer):
    return keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))


def compiled_step(model, s, input_shape=None, sequence_length=None):
    """`(sizes, seconds, notes, state)`: XLA's buffer assignment of the
    step `fit` runs for `model` at the settings `s` (`buffer_sizes`), the
    seconds its trace and compile took, notes, and the bytes of the
    step's weights and optimizer state (`{"parameters": ..,
    "optimizer_state": ..}`, each variable counted only from
    `s.min_counted_bytes` up).

    Raises `NotCompiled` where the step cannot be compiled here as asked.
    """
    if s.replicas > 1:
        raise NotCompiled(
            f"{s.replicas} replicas: Keras turns XLA off under a "
            "distribution strategy"
        )
    outer = inner = model
    loss = getattr(outer, "loss", None)
    held = getattr(model, "inner", None)
    if isinstance(model, Model) and isinstance(held, keras.Model):
        inner = held
        loss = loss if loss is not None else getattr(held, "loss", None)
    traced = inner
    if s.policy.name != inner.dtype_policy.name:
        traced = rebuilt_under(inner, s.policy.name)
        if traced is None:
            raise NotCompiled(
                f"the model cannot be rebuilt under {s.policy.name!r}"
            )
    own_step = type(outer).train_step
    if own_step not in (keras.Model.train_step, Model.train_step):
        raise NotCompiled(
            f"{type(outer).__name__} has its own train_step, which is not "
            "the step compiled here"
        )
    if not traced.built:
        raise NotCompiled("the model is not built")
    if s.checkpointing is not None and not isinstance(s.checkpointing, str):
        raise NotCompiled(
            f"checkpointing={s.checkpointing!r} (layers per segment) is "
            "estimated by rule"
        )
    notes: list = []
    t0 = time.perf_counter()
    own = own_report(inner) if traced is not inner else None
    with library_checkpointing(traced, s, notes, own):
        if s.checkpointing is not None and s.checkpoint_traced not in (
            "library",
            "model",
        ):
            raise NotCompiled(
                f"checkpointing={s.checkpointing!r} could not be applied "
                f"here ({s.checkpoint_traced})"
            )
        sizes, state = _compile(
            outer, traced, loss, s, input_shape, sequence_length, notes
        )
    return sizes, time.perf_counter() - t0, notes, state


def _compile(outer, traced, loss, s, input_shape, sequence_length, notes):
    in_specs = input_specs(traced, s.per_replica, input_shape, sequence_length)
    out_shapes = _output_shapes(traced, in_specs)
    loss_fn, y_specs = _loss_and_target_specs(
        traced, s.per_replica, in_specs, loss, output_shapes=out_shapes
    )
    # As compiled (configs, not the metric objects: fresh ones are built).
    metrics = {} if s.chunked_loss else compiled_metrics(outer)
    wrapper = Model.wrap(
        traced,
        accumulation_steps=s.accumulation_steps,
        chunked_loss=s.chunked_loss,
        attention=s.attention,
    )
    try:
        try:
            wrapper.compile(
                optimizer=_optimizer_copy(s.optimizer),
                loss=loss_fn,
                jit_compile=True,
                **{k: v for k, v in metrics.items() if v},
            )
        except ValueError as e:  # e.g. Keras's own gradient accumulation
            raise NotCompiled(f"{type(e).__name__}: {e}") from e
        wrapper.optimizer.build(wrapper.trainable_variables)
        x = _as_call_arg(in_specs)
        y = y_specs[0] if len(y_specs) == 1 else tuple(y_specs)
        structure = (x, y)
        flat = tf.nest.flatten(structure)

        def step(*tensors):
            return wrapper.train_step(
                tf.nest.pack_sequence_as(structure, list(tensors))
            )

        sizes = buffer_sizes(_optimized_hlo(step, flat), s.min_counted_bytes)
        state = _state_bytes(wrapper, flat, s)
        if metrics and any(metrics.values()):
            notes.append(
                "compiled metrics: compiled into the step, as fit runs them"
            )
        return sizes, state
    finally:
        try:
            disable_long_sequences(wrapper)
        finally:
            # Everything the user's models hold stays: weights, and the
            # seed states of random layers (in `variables`, not `weights`).
            # (`outer.variables` covers a wrapped model's too; a model
            # rebuilt under another policy is the compile's own.)
            kept = {id(v) for v in outer.variables}
            optimizer = getattr(wrapper, "optimizer", None)
            made = list(getattr(optimizer, "variables", None) or [])
            made += list(getattr(wrapper, "metrics_variables", None) or [])
            made += [v for v in wrapper.variables if id(v) not in kept]
            _release([v for v in made if id(v) not in kept])


def _optimized_hlo(step, flat) -> bytes:
    """XLA's optimized HLO module of `step(*flat)`, serialized; raises
    `NotCompiled` where XLA cannot compile it."""
    fn = tf.function(step, jit_compile=True)
    try:
        return fn.experimental_get_compiler_ir(*flat)(
            stage="optimized_hlo_proto_serialized"
        )
    except (tf.errors.OpError, ValueError, NotImplementedError) as e:
        # An op XLA has no kernel for ("Detected unsupported operations"),
        # a shape XLA cannot take.
        raise NotCompiled(
            f"XLA could not compile the step ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200]})"
        ) from e


def _state_bytes(wrapper, flat, s) -> dict:
    """The bytes of the compiled step's weights, optimizer state, inputs
    and (inside XLA's temporary buffer, for the planner's state figure)
    float32 gradients, each counted as the estimate counts."""

    def nbytes(v):
        return counted(_nbytes(tf.TensorSpec(v.shape, v.dtype)), s)

    return {
        "parameters": sum(nbytes(v) for v in wrapper.weights),
        "optimizer_state": sum(nbytes(v) for v in wrapper.optimizer.variables),
        "inputs": sum(counted(_nbytes(t), s) for t in flat),
        "gradients": sum(
            counted(4 * math.prod(v.shape), s)
            for v in wrapper.trainable_weights
        ),
    }


def _release(variables) -> None:
    """Frees the memory of variables the compile made (the optimizer's
    copy, the wrapper's metric variables, a model rebuilt under another
    policy); never one of the user's models' variables.

    Measured (TF 2.21, Keras 3.15): once a Keras optimizer's `apply` has
    been traced, its variables' buffers stay allocated after every Python
    reference to them is gone (16 MiB of Adam state per estimate of an
    8 MiB model, for the whole process), so each estimate would leave a
    copy of the optimizer state on the device. Each is emptied in place
    instead (a zero-size value, which its resource accepts); the empty
    resources are what remains.
    """
    for v in variables:
        value = getattr(v, "value", v)
        handle = getattr(value, "handle", None)
        if handle is None:
            continue
        try:
            tf.raw_ops.AssignVariableOp(
                resource=handle,
                value=tf.zeros([0], v.dtype),
                validate_shape=False,
            )
        except Exception:  # noqa: BLE001 - best effort, never fails
            pass


def describe(sizes, seconds) -> str:
    """The note that says where the figure comes from."""
    return (
        "compiled with XLA (jit_compile=True) and read from XLA's buffer "
        f"assignment: temporary buffer {format_bytes(sizes['temporary'])} "
        "(the activations kept for the backward pass, the gradients and "
        "the update's temporaries, as XLA packs them; in `temporaries`), "
        f"outputs {format_bytes(sizes['outputs'])}; compiled in "
        f"{seconds:.1f} s without running. On a CPU TensorFlow's allocator "
        "may hold the temporary buffer in a larger chunk (docs/xla.md)"
    )
