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

import contextlib
import time

import keras
import tensorflow as tf

from tfmemopt._utils import format_bytes
from tfmemopt.accumulation import Model
from tfmemopt.estimate._checkpointed_trace import library_checkpointing
from tfmemopt.estimate._checkpointed_trace import own_report
from tfmemopt.estimate._input_specs import _as_call_arg
from tfmemopt.estimate._input_specs import _loss_and_target_specs
from tfmemopt.estimate._input_specs import _output_shapes
from tfmemopt.estimate._input_specs import input_specs
from tfmemopt.longseq import disable_long_sequences
from tfmemopt.precision._policy_clone import rebuilt_under


class NotCompiled(Exception):
    """The step cannot be compiled here as asked (the reason is the
    message); `estimate_memory` estimates it for the executor instead."""


def resolve_jit_compile(model, jit_compile, replicas: int) -> bool:
    """Whether the step `fit` runs is compiled with XLA.

    `None` or `"auto"`: as Keras resolves `"auto"` on the device at hand
    (the model's own `jit_compile` once compiled): on when the machine has
    an accelerator, off on CPU-only machines, off under a distribution
    strategy (`replicas > 1`) and where a layer does not support it.
    """
    if jit_compile is None:
        jit_compile = getattr(model, "_jit_compile", None)
        if jit_compile is None or jit_compile == "auto":
            jit_compile = "auto"
    if jit_compile == "auto":
        if replicas > 1:
            return False
        accelerators = [
            d
            for d in tf.config.list_physical_devices()
            if d.device_type != "CPU"
        ]
        if not accelerators:
            return False
        return all(
            getattr(layer, "supports_jit", True)
            for layer in model._flatten_layers()
        )
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


def _metric_copies(model):
    """The model's compiled metrics, as fresh objects (or names)."""
    from tfmemopt._compat import compiled_metrics

    def fresh(m):
        if isinstance(m, keras.metrics.Metric):
            return type(m).from_config(m.get_config())
        return m

    found = compiled_metrics(model)
    return {
        k: tf.nest.map_structure(fresh, v) if v else v for k, v in found.items()
    }


def compiled_step(model, s, input_shape=None, sequence_length=None):
    """`(sizes, seconds, notes, state)`: XLA's buffer assignment of the
    step `fit` runs for `model` at the settings `s` (`buffer_sizes`), the
    seconds its trace and compile took, notes, and the bytes of the
    step's weights and optimizer state (`{"parameters": ..,
    "optimizer_state": ..}`, each variable counted only above `s.floor`).

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
    notes: list = []
    t0 = time.perf_counter()
    own = own_report(inner) if traced is not inner else None
    with contextlib.ExitStack() as stack:
        stack.enter_context(library_checkpointing(traced, s, notes, own))
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
    metrics = {} if s.chunked_loss else _metric_copies(outer)
    wrapper = Model.wrap(
        traced,
        accumulation_steps=s.accumulation_steps,
        chunked_loss=s.chunked_loss,
        attention=s.attention,
    )
    try:
        wrapper.compile(
            optimizer=_optimizer_copy(s.optimizer),
            loss=loss_fn,
            jit_compile=True,
            **{k: v for k, v in metrics.items() if v},
        )
        wrapper.optimizer.build(wrapper.trainable_variables)
        x = _as_call_arg(in_specs)
        y = y_specs[0] if len(y_specs) == 1 else tuple(y_specs)
        structure = (x, y)
        flat = tf.nest.flatten(structure)

        def step(*tensors):
            return wrapper.train_step(
                tf.nest.pack_sequence_as(structure, list(tensors))
            )

        fn = tf.function(step, jit_compile=True)
        try:
            serialized = fn.experimental_get_compiler_ir(*flat)(
                stage="optimized_hlo_proto_serialized"
            )
        except Exception as e:  # noqa: BLE001 - an op XLA cannot compile
            raise NotCompiled(
                f"XLA could not compile the step ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:200]})"
            ) from e
        sizes = buffer_sizes(serialized, s.floor)

        def counted(v):
            n = _nbytes(v)
            return n if n >= s.floor else 0

        state = {
            "parameters": sum(counted(v) for v in wrapper.weights),
            "optimizer_state": sum(
                counted(v) for v in wrapper.optimizer.variables
            ),
            "inputs": sum(_spec_bytes(t) for t in flat),
        }
        if metrics and any(metrics.values()):
            notes.append(
                "compiled metrics: compiled into the step, as fit runs them"
            )
        return sizes, state
    finally:
        disable_long_sequences(wrapper)
        own = {id(v) for v in outer.weights}
        _release(
            [v for v in wrapper.variables if id(v) not in own]
            + list(getattr(wrapper.optimizer, "variables", []) or [])
        )


def _release(variables) -> None:
    """Frees the memory of variables the compile made (the optimizer's
    copy, metric variables, a model rebuilt under another policy).

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


def _nbytes(v) -> int:
    n = 1
    for d in v.shape:
        n *= int(d)
    return n * tf.as_dtype(v.dtype).size


def _spec_bytes(spec) -> int:
    n = 1
    for d in spec.shape:
        n *= int(d)
    return n * spec.dtype.size


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
