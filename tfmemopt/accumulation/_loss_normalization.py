"""Window-exact losses: each compiled loss as a sum and its normaliser.

A Keras loss with reduction `"sum_over_batch_size"` divides the batch's
weighted sum by the number of entries of *that batch* (the valid entries when
there is a mask), and `"mean_with_sample_weight"` by the batch's weight sum.
Averaging the losses of micro-batches therefore gives the wrong gradient as
soon as micro-batches hold different numbers of valid entries. Here each
compiled loss term is evaluated as a numerator `S` (the weighted sum over
the micro-batch) and a normaliser `D`, following Keras's own reduction rules
(`keras.losses.Loss.__call__`), so that the window's loss is
`sum_i S_i / sum_i D_i`, exactly the loss of the whole batch.

A term is *static* when its window normaliser is known before the first
micro-batch runs (no mask: entries are proportional to samples; weight sums
come from the whole batch's sample weights); it is then folded into the
micro-batch's loss directly. It is *dynamic* when a mask decides it; its
gradient is accumulated unnormalised and divided once at the end.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import keras
import tensorflow as tf
from keras import ops

_MEAN_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")


class UnsupportedLoss(Exception):
    """The compiled loss cannot be split exactly; use the generic path."""


@dataclasses.dataclass
class Term:
    """One compiled loss term of one micro-batch.

    Attributes:
        name: The term's name (Keras's per-output loss name).
        numerator: Float32 scalar, the weighted sum `S` of the micro-batch.
        normaliser: Float32 scalar, the micro-batch's own `D` (valid count,
            weight sum or entry count; 1 for `"sum"`).
        weight: Python float, the term's `loss_weights` entry.
        dynamic: Whether `normaliser` depends on a mask.
        uses_weight_sum: Static `"mean_with_sample_weight"` term: the window
            normaliser is the whole batch's weight sum.
        per_sample: Static mean-type term: the window normaliser is
            proportional to the number of samples.
    """

    name: str
    numerator: object
    normaliser: object
    weight: float
    dynamic: bool
    uses_weight_sum: bool = False
    per_sample: bool = False


def _get_mask(t):
    return getattr(t, "_keras_mask", None)


def _same_rank(x1, x2):
    """Keras's `squeeze_or_expand_to_same_rank`, for tensors of known rank."""
    r1, r2 = len(x1.shape), len(x2.shape)
    if r1 == r2 + 1 and x1.shape[-1] == 1:
        if r2 == 1:
            x2 = ops.expand_dims(x2, axis=-1)
        else:
            x1 = ops.squeeze(x1, axis=-1)
    elif r2 == r1 + 1 and x2.shape[-1] == 1:
        if r1 == 1:
            x1 = ops.expand_dims(x1, axis=-1)
        else:
            x2 = ops.squeeze(x2, axis=-1)
    return x1, x2


def evaluate_term(loss_fn, y_true, y_pred, sample_weight, head=None):
    """`(S, D, dynamic, uses_weight_sum, per_sample)` for one Keras loss.

    Mirrors `keras.losses.Loss.__call__` + `reduce_weighted_values`: the
    mask of `y_pred` (and of the unreduced losses) multiplies the sample
    weights; `S` is the sum of `values * weights`; `D` is what Keras would
    divide by for this micro-batch alone. `head`: the head that computed
    `y_pred` under `chunked_loss` (`Forward.head_of`), whose per-token
    losses are computed in chunks from its input, not from the logits.
    """
    if head is None and not isinstance(loss_fn, keras.losses.Loss):
        raise UnsupportedLoss(f"not a keras.losses.Loss: {loss_fn!r}")
    if head is not None:
        head.check_loss(loss_fn)
    reduction = loss_fn.reduction
    if reduction not in _MEAN_REDUCTIONS + ("sum",):
        raise UnsupportedLoss(f"reduction={reduction!r}")
    dtype = loss_fn.dtype
    in_mask = _get_mask(y_pred)
    if head is not None:
        values = head.token_losses(loss_fn, y_true)
    else:
        y_pred = keras.tree.map_structure(
            lambda t: ops.convert_to_tensor(t, dtype=dtype), y_pred
        )
        y_true = keras.tree.map_structure(
            lambda t: ops.convert_to_tensor(t, dtype=dtype), y_true
        )
        values = loss_fn.call(y_true, y_pred)
    out_mask = _get_mask(values)
    if in_mask is not None and out_mask is not None:
        mask = ops.logical_and(in_mask, out_mask)
    else:
        mask = in_mask if in_mask is not None else out_mask
    values = ops.convert_to_tensor(values, dtype=dtype)
    if tuple(values.shape) == ():
        raise UnsupportedLoss("the loss returned a scalar, not per-sample")

    weights = None
    if sample_weight is not None:
        weights = ops.cast(sample_weight, values.dtype)
    if mask is not None:
        float_mask = ops.cast(mask, values.dtype)
        if weights is None:
            weights = float_mask
        else:
            float_mask, weights = _same_rank(float_mask, weights)
            weights = weights * float_mask
    if weights is not None:
        values, weights = _same_rank(values, weights)
        values = values * weights
    numerator = ops.cast(ops.sum(values), "float32")

    dynamic = False
    uses_weight_sum = False
    per_sample = False
    if reduction == "sum":
        normaliser = ops.ones((), "float32")
    elif mask is not None:
        dynamic = True
        if reduction == "mean_with_sample_weight" and sample_weight is not None:
            normaliser = ops.sum(ops.cast(weights, "float32"))
        else:
            normaliser = ops.sum(ops.cast(mask, "float32"))
    elif reduction == "mean_with_sample_weight" and sample_weight is not None:
        uses_weight_sum = True
        normaliser = ops.sum(ops.cast(weights, "float32"))
    else:
        per_sample = True
        normaliser = ops.cast(ops.size(values), "float32")
    return numerator, normaliser, dynamic, uses_weight_sum, per_sample


def _resolve(path, structure):
    for key in path:
        structure = structure[key]
    return structure


def _partial_targets(compile_loss, y_true, y_pred):
    """Places `y_true` on the outputs that have a loss, as Keras does; a
    dict of targets by output name on a model whose outputs are a list is
    put in the outputs' order.

    `loss=[loss_fn, None]` on a two-output model takes one target array
    (keras-io's miniature GPT): Keras's `CompileLoss.call` spreads the flat
    targets over the non-`None` losses before it builds; so do we.
    """
    if not keras.tree.is_nested(y_pred):
        return y_true
    names = compile_loss.output_names
    if (
        isinstance(y_pred, (list, tuple))
        and isinstance(y_true, dict)
        and names
        and set(names) == set(y_true)
    ):
        # Targets by output name for a model whose outputs are a list:
        # Keras's `CompileLoss.call` orders them by `output_names` first.
        return [y_true[name] for name in names]
    flat_true = keras.tree.flatten(y_true)
    if len(flat_true) == len(keras.tree.flatten(y_pred)):
        return y_true
    user_loss = compile_loss._user_loss
    if not keras.tree.is_nested(user_loss):
        return y_true
    flat_loss = keras.tree.flatten(user_loss)
    with_loss = [i for i, loss in enumerate(flat_loss) if loss is not None]
    if len(with_loss) != len(flat_true) or len(flat_loss) != len(
        keras.tree.flatten(y_pred)
    ):
        return y_true
    filled = [None] * len(flat_loss)
    for i, target in zip(with_loss, flat_true):
        filled[i] = target
    return keras.tree.pack_sequence_as(user_loss, filled)


def _align_targets(compile_loss, y_true, y_pred):
    """Brings `y_true`/`y_pred` into the structure Keras built losses for."""
    flat_paths = [entry.path for entry in compile_loss._flat_losses]
    names = compile_loss.output_names
    if (
        names
        and isinstance(y_pred, (list, tuple))
        and any(path and isinstance(path[0], str) for path in flat_paths)
    ):
        y_pred = dict(zip(names, y_pred))
        if isinstance(y_true, (list, tuple)):
            y_true = dict(zip(names, y_true))
    if not keras.tree.is_nested(y_pred):
        return y_true, y_pred
    if isinstance(y_pred, dict) and not keras.tree.is_nested(y_true):
        if len(y_pred) == 1:
            y_true = {next(iter(y_pred)): y_true}
    try:
        keras.tree.assert_same_structure(y_pred, y_true)
    except (ValueError, TypeError):
        if isinstance(y_pred, (list, tuple)) and isinstance(y_true, dict):
            y_true = [y_true[n] for n in names]
        elif not keras.tree.is_nested(y_true) and len(y_pred) == 1:
            y_true = [y_true]
        y_true = keras.tree.pack_sequence_as(y_pred, keras.tree.flatten(y_true))
    return y_true, y_pred


def compiled_terms(model, y_true, y_pred, sample_weight, forward=None):
    """Evaluates every compiled loss term of `model` on one micro-batch
    (`forward`: the pass's `longseq.Forward`, which says which output a
    chunked head computed).

    Returns:
        A list of `Term`, in the order of Keras's flat losses.

    Raises:
        UnsupportedLoss: when the configuration cannot be split exactly
            (the caller then falls back to averaging per-sample losses).
    """
    compile_loss = getattr(model, "_compile_loss", None)
    if compile_loss is None:
        return []
    y_true = _partial_targets(compile_loss, y_true, y_pred)
    if not compile_loss.built:
        compile_loss.build(y_true, y_pred)
    try:
        y_true, y_pred = _align_targets(compile_loss, y_true, y_pred)
    except (KeyError, ValueError, TypeError) as e:
        raise UnsupportedLoss(f"cannot align y with y_pred: {e}") from e
    terms = []
    for entry in compile_loss._flat_losses:
        try:
            y_t = _resolve(entry.path, y_true)
            y_p = _resolve(entry.path, y_pred)
        except (KeyError, IndexError, TypeError) as e:
            raise UnsupportedLoss(f"path {entry.path}: {e}") from e
        if sample_weight is not None and keras.tree.is_nested(sample_weight):
            sw = _resolve(entry.path, sample_weight)
        else:
            sw = sample_weight
        head = forward.head_of(y_p) if forward is not None else None
        s, d, dynamic, uses_ws, per_sample = evaluate_term(
            entry.loss, y_t, y_p, sw, head=head
        )
        weight = 1.0 if entry.loss_weights is None else entry.loss_weights
        terms.append(
            Term(entry.name, s, d, float(weight), dynamic, uses_ws, per_sample)
        )
    return terms


def sample_weight_sums(model, sample_weight):
    """Whole-batch weight sum per term (for `"mean_with_sample_weight"`)."""
    compile_loss = model._compile_loss
    sums = []
    for entry in compile_loss._flat_losses:
        if sample_weight is None:
            sums.append(None)
            continue
        sw = sample_weight
        if keras.tree.is_nested(sample_weight):
            sw = _resolve(entry.path, sample_weight)
        sums.append(ops.sum(ops.cast(sw, "float32")))
    return sums


class MicroLoss(NamedTuple):
    """One micro-batch's share of the window's loss.

    `static` is the part whose normaliser is known (already divided by the
    window's normaliser), or None; each dynamic (masked) term contributes
    its numerator (`dyn_num`), divided once the window's normalisers
    (`dyn_norm`, summed over micro-batches) are known. `terms` are the
    compiled terms (for the per-output loss logs); `generic` says the loss
    was the model's `compute_loss`, not split into terms."""

    static: object
    dyn_num: list
    dyn_norm: list
    terms: list
    generic: bool


class WindowLoss:
    """The loss a micro-step computes, as its share of the window's loss.

    Chosen once for a model when `fit` starts (`window_loss`), as Keras's
    `train_step` calls `self.compute_loss`: the micro-step calls it on its
    micro-batch, `loss(x, y, sw, y_pred, size, batch_global, weight_sums,
    forward)`, and gets a `MicroLoss`. `size` is the micro-batch's
    number of samples, `batch_global` the whole batch's over all replicas,
    `weight_sums()` the whole batch's sample-weight sum per term (called
    only for static `"mean_with_sample_weight"` terms), `forward` the
    forward pass's `longseq.Forward` record where `needs_forward`.
    """

    # Whether the forward pass must record which output a taken-over head
    # computed (`longseq.training_forward`): only for `chunked_loss`.
    needs_forward = False

    def __init__(self, model):
        self.model = model

    def __call__(self, x, y, sw, y_pred, size, batch_global, weight_sums,
                 forward=None) -> MicroLoss:  # fmt: skip
        raise NotImplementedError


class ComputeLoss(WindowLoss):
    """The model's own `compute_loss` (a subclass overrides it, or its
    compiled loss cannot be split into terms), weighted by the
    micro-batch's share of the batch: exact for per-sample means. Keras's
    value already carries 1/replicas."""

    def __call__(self, x, y, sw, y_pred, size, batch_global, weight_sums,
                 forward=None) -> MicroLoss:  # fmt: skip
        frac = tf.cast(size, tf.float32) / batch_global
        loss = self.model.compute_loss(x, y, y_pred, sw, training=True)
        loss = tf.cast(loss, tf.float32) * frac * num_replicas()
        return MicroLoss(loss, [], [], [], True)


class CompiledLoss(WindowLoss):
    """Keras's compiled loss, each term a sum and its normaliser, so that
    the window's loss is exactly the whole batch's (module docstring). A
    loss that cannot be split (`UnsupportedLoss`: not a `keras.losses.Loss`,
    `reduction=None`, targets that do not match the outputs; known only
    once the outputs are traced) is computed as `ComputeLoss` does."""

    def __call__(self, x, y, sw, y_pred, size, batch_global, weight_sums,
                 forward=None) -> MicroLoss:  # fmt: skip
        model = self.model
        if not uses_keras_compute_loss(model):
            return self._unsplit(x, y, sw, y_pred, size, batch_global, forward)
        try:
            terms = compiled_terms(model, y, y_pred, sw, forward)
        except UnsupportedLoss:
            return self._unsplit(x, y, sw, y_pred, size, batch_global, forward)
        frac = tf.cast(size, tf.float32) / batch_global
        return _window_shares(model, terms, size, frac, weight_sums)

    def _unsplit(self, x, y, sw, y_pred, size, batch_global, forward):
        return ComputeLoss(self.model)(x, y, sw, y_pred, size, batch_global,
                                       None)  # fmt: skip


class ChunkedLoss(CompiledLoss):
    """`chunked_loss=True`: the compiled terms, where the per-token losses
    of the output a taken-over head computed come in chunks from the head's
    input (`forward.head_of`), never from the logits."""

    needs_forward = True

    def _unsplit(self, x, y, sw, y_pred, size, batch_global, forward):
        if forward is not None and forward.head_of(y_pred) is not None:
            raise ValueError(
                "chunked_loss=True computes the compiled loss in chunks, "
                "but this loss cannot be split into per-token values (a "
                "custom `compute_loss`, a loss with reduction=None, or "
                "targets that do not match the outputs), so the full logits "
                "would be needed. Compile with keras.losses."
                "SparseCategoricalCrossentropy(from_logits=True), or "
                "construct the model without chunked_loss."
            )
        return super()._unsplit(x, y, sw, y_pred, size, batch_global, forward)


def window_loss(model, chunked: bool) -> WindowLoss:
    """The loss `model`'s micro-steps compute (`chunked`: its head is taken
    over by `chunked_loss`)."""
    if chunked:
        return ChunkedLoss(model)
    if uses_keras_compute_loss(model):
        return CompiledLoss(model)
    return ComputeLoss(model)


def _window_shares(model, terms, size, frac, weight_sums) -> MicroLoss:
    """The compiled terms as shares of the window's loss: static terms
    divided by their window normaliser now, dynamic ones left as sums."""
    static = []
    extra = [additional_loss(v, size, frac) for v in model.losses]
    if extra:
        static.append(ops.sum(ops.stack(extra)))
    for k, term in enumerate(terms):
        if term.dynamic:
            continue
        if term.per_sample:
            window_norm = term.normaliser / frac
        elif term.uses_weight_sum:
            window_norm = weight_sums()[k]
        else:
            window_norm = tf.ones((), tf.float32)
        term.window_value = tf.math.divide_no_nan(term.numerator, window_norm)
        static.append(term.weight * term.window_value)
    if not static and not any(t.dynamic for t in terms):
        raise ValueError(
            "No loss to compute. Provide a `loss` argument in `compile()`."
        )
    static_loss = ops.sum(ops.stack(static)) if static else None
    dyn = [t for t in terms if t.dynamic]
    return MicroLoss(
        static_loss,
        [t.numerator for t in dyn],
        [t.normaliser for t in dyn],
        terms,
        False,
    )


def additional_loss(value, size, frac):
    """One micro-batch's share of an `add_loss` / regularisation term.

    Keras's `compute_loss` adds `ops.sum(value)` for every entry of
    `model.losses`. Which share of it a micro-batch owes depends on the
    term's shape:

    - a tensor whose first dimension is the micro-batch (`add_loss` of a
      per-sample loss, e.g. keras-io's CTC layer, shape `(batch, 1)`): the
      whole batch's sum is the sum of the micro-batches' sums, weight 1;
    - a scalar: either independent of the batch (weight regularisers) or a
      mean over it (activity regularisers, which Keras divides by the batch
      size; `add_loss(ops.mean(...))`): weight `b_i / B_global`, so that it
      counts once per update over all micro-batches and replicas (Keras
      adds it once per replica, which counts it `replicas` times after the
      all-reduce);
    - any other shape (a first dimension that is not the micro-batch's):
      independent of the batch, weight `b_i / B_global`.

    A scalar that is a *sum* over the batch (`add_loss(ops.sum(per_sample))`)
    cannot be told from a mean and is taken as one: add the per-sample
    tensor instead (Keras sums it the same way).
    """
    total = ops.cast(ops.sum(value), "float32")
    shape = tuple(getattr(value, "shape", ()))
    if not shape:
        return frac * total
    per_sample = tf.equal(
        tf.shape(value, out_type=tf.int32)[0], tf.cast(size, tf.int32)
    )
    return total * tf.where(per_sample, tf.ones_like(frac), frac)


def uses_keras_compute_loss(model):
    """True unless the model overrides `compute_loss` (then: generic).

    `tfmemopt.Model` keeps Keras's `compute_loss` (this module does not
    import it: `_model` imports `_window`, which imports this).
    """
    return type(model).compute_loss is keras.Model.compute_loss


def count_targets(losses):
    """How many separate gradients one micro-step takes (`None`: unknown).

    `losses()` runs the forward pass and returns its `MicroLoss`. The
    static part of the loss is one target; each masked (dynamic) term is
    another, since it is normalised over the whole window
    only once the window is done. One target (the common case) lets the
    caller use a non-persistent tape: a persistent one, or even a second
    tape open during the forward pass, makes TensorFlow keep every
    intermediate of a differentiated `while_loop` (an LSTM's time loop).
    Whether a term is masked is known only after the forward pass, so it is
    traced here once more, in a graph that is never run.
    """
    count = []

    def probe():
        static, dyn_num, *_ = losses()
        count.append(int(static is not None) + len(dyn_num))
        return tf.zeros(())

    try:
        tf.function(probe, autograph=False).get_concrete_function()
    except Exception:  # noqa: BLE001 - unknown: the caller keeps a safe tape
        return None
    return count[0] if count else None


def per_output_loss_metrics(model):
    """Keras's per-output `<name>_loss` trackers (only with several terms)."""
    compile_loss = getattr(model, "_compile_loss", None)
    if compile_loss is None:
        return []
    return list(compile_loss.metrics)


def global_sum(value):
    """Sums a tensor over replicas (identity without a strategy)."""
    if (
        not tf.distribute.has_strategy()
        or tf.distribute.in_cross_replica_context()
    ):
        return value
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return value
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)


def num_replicas() -> int:
    if not tf.distribute.has_strategy():
        return 1
    return tf.distribute.get_strategy().num_replicas_in_sync
