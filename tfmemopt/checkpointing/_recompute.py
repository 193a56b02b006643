"""The recompute core: one custom gradient that replays a Keras forward pass.

`tf.recompute_grad` is unusable for Keras layers inside `fit` (PITFALLS.md):
keyword arguments crash in graph mode, dropout masks are redrawn, the
training flag is lost, BatchNorm updates twice, and resources captured in a
`tf.while_loop` body break it. This module avoids every one of those by
running the segment *statelessly*:

- all Keras variables of the segment (weights, BatchNorm statistics and the
  `SeedGenerator` states that dropout draws from) are read once, outside,
  and passed to the custom gradient as plain tensors; inside, a
  `keras.StatelessScope` maps each variable to its tensor, so the function
  touches no resource at all (that is what `tf.while_loop` bodies need);
- the forward pass collects the updates Keras makes under the scope (new
  BatchNorm statistics, advanced seed states) and they are assigned once,
  outside; the recompute starts from the same tensors, so dropout draws the
  same masks, and its updates are thrown away;
- only tensors cross the custom-gradient boundary, positionally; Python
  values (`training=True`, masks given as `None`) stay in a closure;
- the recompute is made to wait for the incoming gradient through a data
  dependency (see `_after`), which grappler cannot remove, so the recomputed
  activations are not merged back into the forward pass; the segment's
  inputs and every variable's value wait, so no recomputed op (a dropout
  mask drawn from a seed, a position embedding read from a weight) runs
  before its segment's backward;
- a weight sharded across replicas (`shard_parameters=True`) enters as this
  replica's part, made to wait the same way for the segment's inputs in the
  forward pass and for the incoming gradient in the recompute, so its
  all-gather runs when the segment does, not ahead of earlier segments.
"""

from __future__ import annotations

import threading
from typing import Any
from typing import Callable
from typing import Sequence

import keras
import tensorflow as tf

from tfmemopt import _compat

_local = threading.local()


def _mapping_stack() -> list[dict[int, tuple]]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def _read(variable) -> tuple:
    """`(tensor, is_part)`: the variable's stored value, never autocast,
    honouring nesting; or, for a weight sharded across replicas
    (`shard_parameters=True`), this replica's part, which the segment
    gathers inside, in the forward pass and again in the recompute, so that
    no whole copy waits for the backward pass."""
    for mapping in reversed(_mapping_stack()):
        if id(variable) in mapping:
            return mapping[id(variable)]
    # Keras wraps a `tf.Variable` (or a distributed one) in `_value`;
    # `variable.value` would be cast to float16 under an autocast scope.
    stored = getattr(variable, "_value", None)
    if stored is None:
        stored = variable.value
    local_part = getattr(stored, "local_part", None)
    part = local_part() if local_part is not None else None
    if part is not None:
        return part, True
    return tf.convert_to_tensor(stored), False


def _is_tensor(x) -> bool:
    return isinstance(x, (tf.Tensor, tf.Variable)) or (
        hasattr(x, "__tf_tensor__") and not isinstance(x, keras.Variable)
    )


def _after(tensors: Sequence[tf.Tensor], grads: Sequence) -> list:
    """Returns `tensors` unchanged, but computable only once `grads` exist.

    A control dependency is not enough: grappler's dependency optimizer
    drops it in graph mode, then the recompute is merged with the forward
    pass (same ops on the same inputs) and nothing is saved. A data
    dependency survives: one element of one incoming gradient gives a zero
    known only at run time, and each tensor is sliced whole from there.
    A whole-tensor `Slice` hands its input buffer on without a copy (where
    `tf.where(keep, t, t)` allocated a copy of every segment input while the
    original was still alive: 64 MiB more for a 64 MiB input, measured),
    grappler cannot fold it away since the offset is not a constant. Under
    XLA, where that slice made the weights compile-time constants, see
    `_after_under_xla`.
    """
    if _compat.in_xla_function():
        return _after_under_xla(tensors, grads)
    probe = _probe(grads)
    if probe is None:
        with tf.control_dependencies([g for g in grads if g is not None]):
            return [tf.identity(t) for t in tensors]
    # `x == x` is false only for NaN; `is_nan` or not, `keep` is true.
    keep = tf.reduce_any(tf.logical_or(probe == probe, tf.math.is_nan(probe)))
    zero = 1 - tf.cast(keep, tf.int32)
    out = []
    for t in tensors:
        if not t.shape.rank:  # a scalar (or unknown rank): copying is free
            out.append(tf.where(keep, t, t))
            continue
        whole = tf.slice(t, tf.fill([t.shape.rank], zero), tf.shape(t))
        whole.set_shape(t.shape)
        out.append(whole)
    return out


def _probe(grads):
    """One element (shape [1]) of the first floating incoming gradient, or
    None: what the recompute is made to wait for."""
    for g in grads:
        if g is not None and g.dtype.is_floating:
            if g.shape.rank == 0:
                return tf.reshape(g, [1])
            return tf.reshape(g, [-1])[:1]
    return None


def _after_under_xla(tensors, grads) -> list:
    """`_after` where XLA compiles the step.

    The slice `_after` uses elsewhere declares its offset a compile-time
    constant to XLA, which then read the offset's sources, the segment's
    weights among them, as constants: the step was compiled again after
    every update (4-20 s a step on small models, a first `fit` of a
    4-block transformer not done in 15 minutes), or refused ("Expected
    size[0] in [0, 63], but got 64").

    Here each floating tensor gets a zero added that is computed from the
    incoming gradient (`0 * g[0]`: XLA does not fold a float multiplication
    by zero, which NaN and inf would break). The recompute then reads other
    values than the forward pass, so XLA's common-subexpression elimination
    cannot merge the two (with an optimization barrier alone, as
    `jax.checkpoint` uses, XLA on CPU expands the barrier before that pass
    and merged them: 68 dots before optimization, 48 after, as many as
    without checkpointing, and the same peak), and it cannot run before
    the gradient exists. The barrier is kept for the backends that schedule
    around it. Costs one element-wise add per input while the segment's
    backward runs.
    """
    tensors = list(tensors)
    probe = _probe(grads)
    if not tensors or probe is None:
        return tensors
    zero = tf.cast(probe[0], tf.float32) * 0.0
    n = len(tensors)
    barred = _compat.optimization_barrier(tensors + [zero])
    tensors, zero = barred[:n], barred[n]
    return [
        t + tf.cast(zero, t.dtype) if t.dtype.is_floating else t
        for t in tensors
    ]


def _parts_after(values: list, parts: list, ready: Sequence) -> list:
    """`values`, each replica's part (`parts[i]`) computable only once
    `ready` exist (`_after`); whole values unchanged."""
    if not any(parts) or not any(t is not None for t in ready):
        return list(values)
    waited = iter(_after([v for v, p in zip(values, parts) if p], ready))
    return [next(waited) if p else v for v, p in zip(values, parts)]


def checkpoint_call(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    variables: Sequence[keras.Variable],
    replay: Callable[..., Any] | None = None,
    owner: keras.layers.Layer | None = None,
):
    """Calls `fn(*args, **kwargs)`, keeping no activation inside it.

    Args:
        fn: Callable. The forward pass of the segment; it must read state
            only through `variables`.
        args: Tuple. Positional arguments; tensors anywhere in the nest are
            passed through the gradient, everything else is captured.
        kwargs: Dict. Keyword arguments, handled like `args`.
        variables: Sequence of `keras.Variable`. Every variable `fn` reads
            or assigns (use `layer.variables`, which includes seeds).
        replay: Callable or `None`, defaults to `fn`. What the backward
            pass runs to recompute the activations.
        owner: Keras layer or `None`. Receives, through `add_loss`, the
            losses that layers inside `fn` add (activity regularizers); they
            are outputs of the custom gradient, so their gradient is exact.

    Returns:
        What `fn` returns.
    """
    replay = replay or fn
    structure = (tuple(args), dict(kwargs))
    flat = tf.nest.flatten(structure)
    where = [i for i, x in enumerate(flat) if _is_tensor(x)]
    tensors = [tf.convert_to_tensor(flat[i]) for i in where]
    variables = _unique(variables)
    read = [_read(v) for v in variables]
    values = [t for t, _ in read]
    parts = [p for _, p in read]
    # A part's all-gather waits for nothing but the part: the executor ran
    # the gathers of later segments before earlier ones had computed
    # (three 4 MiB blocks' whole weights alive at once in a profiled step,
    # benchmarks/gathered_liveness.py). Made to wait for the segment's
    # inputs, each segment gathers when it runs.
    values = _parts_after(values, parts, tensors)
    n_in = len(tensors)
    out_structure = []
    updates = []
    n_loss = []

    def rebuild(ts):
        items = list(flat)
        for i, t in zip(where, ts):
            items[i] = t
        return tf.nest.pack_sequence_as(structure, items)

    def run(call, ts, vals):
        a, k = rebuild(ts)
        return _run_on_values(call, a, k, variables, vals, parts)

    @tf.custom_gradient
    def segment(*xs):
        out, changed, losses = run(fn, xs[:n_in], xs[n_in:])
        updates.extend(changed)
        out_structure.append(out)
        n_loss.append(len(losses))
        flat_out = [tf.convert_to_tensor(t) for t in tf.nest.flatten(out)]
        flat_out += [tf.convert_to_tensor(t) for t in losses]

        def grad(*dys, variables=None):
            # The variables' values wait for the incoming gradient too:
            # the recompute's ops that read only weights or seeds (a
            # dropout mask, a position embedding, a sharded weight's
            # gather) ran as soon as the backward pass began, every
            # segment's at once, each alive until its segment ran
            # (allocator trace of a checkpointed GPT-2 step: the first
            # segment's dropout masks beside the second's backward).
            inputs = _after(list(xs), dys)
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                for x in inputs:
                    if x.dtype.is_floating:
                        tape.watch(x)
                re_out, _, re_losses = run(replay, inputs[:n_in], inputs[n_in:])
                re_flat = tf.nest.flatten(re_out) + list(re_losses)
                if variables:
                    tape.watch(variables)
            pairs = [
                (o, d)
                for o, d in zip(re_flat, dys)
                if d is not None and o.dtype.is_floating
            ]
            targets = list(inputs) + list(variables or [])
            grads = tape.gradient(
                [o for o, _ in pairs],
                targets,
                output_gradients=[tf.cast(d, o.dtype) for o, d in pairs],
            )
            in_grads = grads[: len(inputs)]
            if variables:
                return in_grads, grads[len(inputs) :]
            return in_grads

        return flat_out, grad

    flat_out = list(segment(*tensors, *values))
    for v, new in updates:
        v.assign(new)
    flat_out = _hand_over_losses(flat_out, n_loss[-1], owner)
    return tf.nest.pack_sequence_as(out_structure[-1], flat_out)


def _run_on_values(call, args, kwargs, variables, values, parts=None):
    """`call(*args, **kwargs)` reading `variables` as `values` (stateless).

    `parts[i]`: `values[i]` is a replica's part of a sharded weight, gathered
    here (by the weight's storage) into the whole value `call` reads.
    Returns `(output, [(variable, new value)] it assigned, losses added)`.
    """
    parts = parts or [False] * len(variables)
    mapping = {id(v): (x, p) for v, x, p in zip(variables, values, parts)}
    values = [
        v._value.whole_from_part(x) if p else x
        for v, x, p in zip(variables, values, parts)
    ]
    _mapping_stack().append(mapping)
    try:
        with keras.StatelessScope(
            state_mapping=list(zip(variables, values)),
            collect_losses=True,
            initialize_variables=False,
        ) as scope:
            out = call(*args, **kwargs)
    finally:
        _mapping_stack().pop()
    changed = []
    for v, x in zip(variables, values):
        new = scope.get_current_value(v)
        if new is not None and new is not x:
            changed.append((v, new))
    return out, changed, list(scope.losses)


def _hand_over_losses(flat_out: list, n_losses: int, owner) -> list:
    """The segment's outputs; its last `n_losses` (losses that layers inside
    added) go to `owner` through `add_loss`."""
    if not n_losses:
        return flat_out
    losses = flat_out[-n_losses:]
    if owner is None:
        raise ValueError(
            "Layers inside a checkpointed segment added losses "
            f"({n_losses}), but no `owner` layer was given to receive "
            "them. Pass `owner=` to `checkpoint_call`."
        )
    # The base method: a functional model's own `add_loss` refuses
    # (symbolic only), although its `losses` collects these.
    keras.layers.Layer.add_loss(owner, losses)
    return flat_out[:-n_losses]


def _unique(variables) -> list:
    seen, out = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out
