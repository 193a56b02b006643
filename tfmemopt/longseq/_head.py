"""The language-model head taken over (`chunked_loss=True`): which layers
may be the head, why one cannot be chunked exactly, and its instance-level
`call` that, only inside `training_forward(owner)`, records in that pass's
`Forward` the output it computed and the head's input (`Forward.head_of`),
from which the per-token cross-entropy is computed in chunks
(`linear_cross_entropy`). Nothing is attached to the tensors."""

from __future__ import annotations

import contextlib
import threading

import keras
import tensorflow as tf

from tfmemopt import _compat
from tfmemopt._compat import set_untracked
from tfmemopt._compat import sublayers
from tfmemopt.longseq._linear_cross_entropy import linear_cross_entropy

_STATE = "_tfmemopt_long_sequences"
_MISSING = object()


def replace_on_instance(state, layer, name, value) -> None:
    """Sets `layer.<name> = value` on the instance, recorded in
    `state.patched` with what the instance held before, so that
    `disable_long_sequences` puts exactly that back.

    The one place the long-sequence options replace a layer's method. A
    layer can be taken over twice: a `Model.wrap(lm, chunked_loss=True)`
    and `estimate_memory(lm, chunked_loss=True)` of the model it wraps
    (which enables the options for its trace and undoes them). Undoing
    by deleting the instance attribute removed the wrapper's too, and its
    next step failed ("chunked_loss=True needs the model's output to be
    the logits of a linear head", a fresh-user trial).
    """
    previous = layer.__dict__.get(name, _MISSING)
    set_untracked(layer, name, value)
    state.patched.append((layer, name, previous))


def restore_instances(state) -> None:
    """Undoes `replace_on_instance`, last replacement first."""
    for layer, name, previous in reversed(state.patched):
        if previous is _MISSING:
            layer.__dict__.pop(name, None)
        else:
            set_untracked(layer, name, previous)


_local = threading.local()


def _path(layer) -> str:
    return getattr(layer, "path", None) or layer.name


def _is_reversible_embedding(layer) -> bool:
    return isinstance(layer, keras.layers.ReversibleEmbedding)


def _why_not_head(layer) -> str | None:
    """Why this candidate's logits cannot be chunked exactly, or None."""
    if getattr(layer, "quantization_mode", None):
        return (
            f"it is quantized ({layer.quantization_mode}); chunk the loss "
            "of the float model, or train without chunked_loss"
        )
    if getattr(layer, "lora_enabled", False):
        return (
            "it has LoRA enabled; train without chunked_loss, or without "
            "LoRA on the head"
        )
    if _is_reversible_embedding(layer):
        if layer.logit_soft_cap is not None:
            return (
                f"it soft-caps its logits (logit_soft_cap="
                f"{layer.logit_soft_cap}), which the chunked loss does not "
                "compute; train without chunked_loss"
            )
        return None
    activation = getattr(layer.activation, "__name__", str(layer.activation))
    if activation != "linear":
        return (
            f"its activation is {activation!r}, not linear; build the head "
            "with activation=None and a loss with from_logits=True"
        )
    return None


def head_candidates(model) -> list:
    return [
        layer
        for layer in sublayers(model)
        if isinstance(layer, keras.layers.Dense)
        or _is_reversible_embedding(layer)
    ]


class _HeadCall:
    """A head's call inside a training forward pass: input and layer."""

    def __init__(self, state, layer, inputs):
        self.state, self.layer, self.inputs = state, layer, inputs

    def check_loss(self, loss_fn) -> dict:
        """The loss's config; raises unless the chunked loss is exact."""
        layer = self.layer
        reason = _why_not_head(layer)
        if reason:
            raise ValueError(
                f"chunked_loss=True cannot compute the loss of the head "
                f"{_path(layer)!r} exactly: {reason}."
            )
        config = (
            loss_fn.get_config()
            if isinstance(loss_fn, keras.losses.SparseCategoricalCrossentropy)
            else {}
        )
        if not config.get("from_logits") or config.get("axis", -1) != -1:
            raise ValueError(
                "chunked_loss=True computes "
                "keras.losses.SparseCategoricalCrossentropy(from_logits=True) "
                f"only. Received: loss={loss_fn!r} with config {config}. "
                "Compile with loss=keras.losses.SparseCategoricalCrossentropy"
                "(from_logits=True) (the head must output logits), or "
                "construct the model without chunked_loss."
            )
        return config

    def token_losses(self, loss_fn, y_true):
        """Keras's per-token `loss_fn.call(y_true, logits)`, chunked."""
        layer, report = self.layer, self.state.report
        config = self.check_loss(loss_fn)
        report.head = _path(layer)
        hidden = self.inputs
        labels = tf.convert_to_tensor(y_true)
        if labels.shape.rank == hidden.shape.rank and labels.shape[-1] == 1:
            labels = tf.squeeze(labels, -1)
        labels = tf.cast(labels, tf.int32)
        ignore = config.get("ignore_class")
        kernel, bias, transpose, dtype = self._weights()
        vocabulary = int(kernel.shape[0] if transpose else kernel.shape[-1])
        under_xla = _compat.in_xla_function()
        if under_xla:
            bad = _outside(labels, vocabulary, ignore)
        else:
            labels = checked_labels(labels, vocabulary, ignore)
        valid = None
        if ignore is not None:
            valid = tf.not_equal(labels, ignore)
            labels = tf.where(valid, labels, 0)
        values = linear_cross_entropy(
            hidden,
            kernel,
            labels,
            bias,
            transpose_kernel=transpose,
            chunk_elements=report.chunk_elements,
            compute_dtype=dtype,
        )
        if under_xla:
            # An XLA step cannot raise (it drops `Assert`): the loss of a
            # label outside the vocabulary is NaN, as Keras's own is there.
            values = values + tf.where(bad, float("nan"), 0.0)
        if valid is not None:
            values = tf.where(valid, values, 0.0)
            values._keras_mask = valid
        return values

    def _weights(self):
        layer = self.layer
        if _is_reversible_embedding(layer):
            dtype = layer.reverse_dtype or layer.compute_dtype
            if layer.tie_weights:
                kernel = tf.convert_to_tensor(layer.embeddings)
                return kernel, None, True, dtype
            kernel = tf.convert_to_tensor(layer.reverse_embeddings)
            return kernel, None, False, dtype
        bias = tf.convert_to_tensor(layer.bias) if layer.use_bias else None
        kernel = tf.convert_to_tensor(layer.kernel)
        return kernel, bias, False, layer.compute_dtype


def checked_labels(labels, vocabulary: int, ignore=None):
    """`labels`, once every label (but `ignore`) is in `[0, vocabulary)`.

    The chunked loss picks each label's logit by index; a label outside the
    vocabulary picked nothing and trained silently (`-100`, the other
    ecosystem's ignore index, without `ignore_class`; a tokenizer larger
    than the model), where Keras's own loss raises. Checked on the device,
    once per batch (one reduction over the labels), inside the step. Under
    XLA, which cannot raise inside a step, `token_losses` makes such a
    label's loss NaN instead, as Keras's own loss is there.
    """
    bad = _outside(labels, vocabulary, ignore)
    message = (
        f"chunked_loss=True: every label must be a class index in [0, "
        f"{vocabulary}) (the head's vocabulary), or the loss's "
        f"ignore_class (now {ignore!r}). A label of -100 is the ignore "
        "index of PyTorch and Hugging Face: compile with "
        "keras.losses.SparseCategoricalCrossentropy(from_logits=True, "
        "ignore_class=-100). A label >= the vocabulary means the "
        "tokenizer's vocabulary is larger than the model's. Smallest and "
        "largest label of the batch:"
    )
    check = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(bad)),
        [message, tf.reduce_min(labels), tf.reduce_max(labels)],
    )
    with tf.control_dependencies([check]):
        return tf.identity(labels)


def _outside(labels, vocabulary: int, ignore=None):
    """Where a label is not a class index of the head, nor `ignore`."""
    bad = tf.logical_or(labels < 0, labels >= vocabulary)
    if ignore is not None:
        bad = tf.logical_and(bad, tf.not_equal(labels, ignore))
    return bad


class Forward:
    """One training forward pass (`training_forward`): which of its outputs
    a taken-over head computed, and from what input.

    The loss path reads it explicitly: `forward.head_of(y_pred)` is the
    `_HeadCall` that produced `y_pred` (its loss is then computed in chunks
    from the head's input), or None (Keras's compiled loss on `y_pred`).
    Nothing is attached to the tensors themselves.
    """

    def __init__(self, state):
        self.state = state
        self.heads = {}  # output tensor's ref -> _HeadCall

    def head_of(self, y_pred):
        """The `_HeadCall` that produced `y_pred` in this pass, or None."""
        if self.state is None or isinstance(y_pred, (list, tuple, dict)):
            return None
        try:
            return self.heads.get(y_pred.ref())
        except (AttributeError, TypeError):  # not a tensor
            return None

    def checked(self, y_pred):
        """`y_pred`, after checking the loss can be chunked on it."""
        if self.state is None or not self.state.report.chunked_loss:
            return y_pred
        leaves = tf.nest.flatten(y_pred)
        if any(self.head_of(t) is not None for t in leaves):
            return y_pred
        names = ", ".join(self.state.report.head_candidates) or "none"
        # A quantized or LoRA head computes its output on its own path: say
        # so rather than "computed after the head".
        for layer, method, _ in self.state.patched:
            reason = method == "call" and _why_not_head(layer)
            if reason and "activation" not in reason:
                raise ValueError(
                    f"chunked_loss=True cannot compute the loss of the head "
                    f"{_path(layer)!r} exactly: {reason}."
                )
        raise ValueError(
            "chunked_loss=True needs the model's output to be the logits of "
            "a linear head (a Dense with no activation, or a "
            "ReversibleEmbedding called with reverse=True), but the output "
            "was computed after the head (an activation, a cast, a "
            "soft-cap, a checkpointed segment) or by another layer. "
            f"Candidate heads: {names}. Make the head the last layer, or "
            "construct the model without chunked_loss."
        )


@contextlib.contextmanager
def training_forward(owner):
    """Within it, the heads of `owner` mark their outputs (training only)."""
    state = getattr(owner, _STATE, None)
    if state is None or not state.report.chunked_loss:
        yield Forward(None)
        return
    previous = getattr(_local, "active", None), getattr(_local, "forward", None)
    forward = Forward(state)
    _local.active, _local.forward = state, forward
    try:
        yield forward
    finally:
        _local.active, _local.forward = previous


def _patch_head(state, layer):
    original = layer.call

    def call(*args, **kwargs):
        out = original(*args, **kwargs)
        if getattr(_local, "active", None) is not state:
            return out
        if _is_reversible_embedding(layer):
            reverse = kwargs.get("reverse", args[1] if len(args) > 1 else False)
            if not reverse:
                return out
        inputs = args[0] if args else kwargs.get("inputs")
        if isinstance(out, tf.Tensor) and isinstance(inputs, tf.Tensor):
            _local.forward.heads[out.ref()] = _HeadCall(state, layer, inputs)
        return out

    replace_on_instance(state, layer, "call", call)
