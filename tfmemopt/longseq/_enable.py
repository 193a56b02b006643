"""Taking over the language-model head and the attention of a built model.

Nothing in the user's model is edited: the candidate heads (`Dense`, and
`ReversibleEmbedding` called with `reverse=True`) get an instance-level
`call` that, only inside `training_forward(owner)`, records in that pass's
`Forward` which output it computed and from what input. The training loss
(`Forward.head_of`, handed to tfmemopt's window-exact losses) then
computes the per-token cross-entropy from those with
`linear_cross_entropy`, so the full logits the layer also returned have
no consumer in the training graph and are never computed.
`predict`, `evaluate` and every call outside training are untouched
(the head: `_head.py`).

Attention layers (`keras.layers.MultiHeadAttention` and its subclasses,
such as keras-hub's `CachedMultiHeadAttention`, and keras-hub's Llama,
Mistral, Qwen2 and Phi-3 attention: `_hub_attention`) get an
instance-level `_compute_attention` that runs `dot_product_attention` in
query and key blocks (online softmax).
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tfmemopt._compat import compiled_metrics
from tfmemopt._compat import set_untracked
from tfmemopt._compat import sublayers
from tfmemopt._utils import check_int
from tfmemopt.longseq._attention import DEFAULT_BLOCK_ELEMENTS
from tfmemopt.longseq._attention import dot_product_attention
from tfmemopt.longseq._head import _STATE
from tfmemopt.longseq._head import _patch_head
from tfmemopt.longseq._head import _path
from tfmemopt.longseq._head import head_candidates
from tfmemopt.longseq._head import replace_on_instance
from tfmemopt.longseq._head import restore_instances
from tfmemopt.longseq._hub_attention import FAMILIES
from tfmemopt.longseq._hub_attention import check_hub_attention
from tfmemopt.longseq._hub_attention import is_hub_attention
from tfmemopt.longseq._hub_attention import is_hub_decoder
from tfmemopt.longseq._hub_attention import patch_hub_attention
from tfmemopt.longseq._hub_attention import patch_hub_decoder
from tfmemopt.longseq._linear_cross_entropy import DEFAULT_CHUNK_ELEMENTS

ATTENTION_CHOICES = (None, "chunked")


@dataclasses.dataclass
class LongSequenceReport:
    """What `enable_long_sequences` took over on a model.

    Attributes:
        chunked_loss: Bool, whether the head and loss are chunked.
        chunk_elements: Int, logits elements (tokens x vocabulary) per chunk.
        head: Path of the layer whose output the training loss was computed
            from, known after the first training step (`None` before).
        head_candidates: Paths of the layers that may be the head.
        attention: `None` or `"chunked"`.
        attention_layers: Paths of the attention layers taken over.
        block_elements: Int, attention scores per (query, key) block.
    """

    chunked_loss: bool
    chunk_elements: int
    head: str | None = None
    head_candidates: list = dataclasses.field(default_factory=list)
    attention: str | None = None
    attention_layers: list = dataclasses.field(default_factory=list)
    block_elements: int = DEFAULT_BLOCK_ELEMENTS

    def __setattr__(self, name, value):
        # docs/long_sequences.md says to set `chunk_elements` here: 0, -5 and
        # 1.5 trained silently, and the report printed them.
        if name in ("chunk_elements", "block_elements"):
            value = check_int(
                name,
                value,
                hint=f"Pass a whole number of elements per chunk, e.g. "
                f"model.long_sequences.{name} = 2**20.",
            )
        super().__setattr__(name, value)

    def __str__(self) -> str:
        lines = ["Long sequences (tfmemopt):"]
        if self.chunked_loss:
            head = self.head or "decided at the first training step"
            lines.append(
                f"  chunked loss: head {head}; {self.chunk_elements} logits "
                f"per chunk; candidates: {', '.join(self.head_candidates)}"
            )
        else:
            lines.append("  chunked loss: off")
        if self.attention:
            lines.append(
                f"  attention {self.attention!r} ({self.block_elements} "
                f"scores per block): {', '.join(self.attention_layers)}"
            )
        else:
            lines.append("  attention: unchanged")
        return "\n".join(lines)


class _State:
    """Per owner model; a plain object so Keras's saving never walks it."""

    __slots__ = ("report", "patched")

    def __init__(self, report):
        self.report = report
        self.patched = []


def _check_attention(layer):
    if layer.dropout > 0:
        raise ValueError(
            f'attention="chunked" cannot replay attention dropout: the '
            f"layer {_path(layer)!r} has dropout={layer.dropout}. Build the "
            "model with attention dropout 0 (keras-hub backbones: "
            'dropout=0.0), or construct it without attention="chunked".'
        )
    axes = layer.attention_axes
    if axes is not None and tuple(axes) not in ((1,), (-3,)):
        raise ValueError(
            f'attention="chunked" handles attention over one sequence axis; '
            f"the layer {_path(layer)!r} has attention_axes={axes}. "
            'Construct the model without attention="chunked".'
        )


def _patch_attention(state, layer):
    scale = 1.0 / float(layer.key_dim) ** 0.5

    def compute_attention(
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
        use_causal_mask=False,
    ):
        if return_attention_scores:
            raise ValueError(
                f'attention="chunked" never forms the attention scores, so '
                f"the layer {_path(layer)!r} cannot return them. Call it "
                "with return_attention_scores=False, or construct the "
                'model without attention="chunked".'
            )
        mask = attention_mask
        if mask is not None:
            mask = tf.cast(mask, tf.bool)
            while mask.shape.rank < 4:
                mask = tf.expand_dims(mask, -3)
        out = dot_product_attention(
            query,
            key,
            value,
            mask=mask,
            scale=scale,
            is_causal=bool(use_causal_mask),
            # the report's when the step is traced (a test or a user may
            # set `model.long_sequences.block_elements` after the wrap)
            block_elements=state.report.block_elements,
        )
        return out, None

    replace_on_instance(state, layer, "_compute_attention", compute_attention)


def check_options(chunked_loss, attention) -> None:
    """Raises for a bad `chunked_loss` or `attention` argument."""
    if attention not in ATTENTION_CHOICES:
        raise ValueError(
            f"`attention` must be one of {ATTENTION_CHOICES}. Received: "
            f"attention={attention!r}. Pass 'chunked' for exact attention "
            "in query and key blocks, or None to keep the model's own."
        )
    if not isinstance(chunked_loss, bool):
        raise TypeError(
            "`chunked_loss` must be a bool. Received: chunked_loss="
            f"{chunked_loss!r} (of type {type(chunked_loss).__name__})."
        )


def enable_long_sequences(
    model,
    chunked_loss: bool = True,
    attention: str | None = "chunked",
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
    owner=None,
) -> LongSequenceReport:
    """Chunks the language-model loss and/or the attention of `model`.

    The memory of a long-sequence step is dominated by two terms that
    neither accumulation nor checkpointing shrinks: the logits (`tokens x
    vocabulary`, kept with their softmax and gradient) and the attention
    scores (`batch x heads x T x T` per layer). With `chunked_loss` the
    head's projection and the sparse cross-entropy run together in chunks
    of `chunk_elements` logits with a per-chunk custom gradient; with
    `attention="chunked"` every `MultiHeadAttention` computes exact
    attention in query and key blocks (online softmax), recomputed in the
    backward pass. Both cost
    recomputation (one more head matmul per chunk, one more score matmul
    per block) and give the same update within float32 rounding.

    The chunked loss applies to the training step of a `tfmemopt.Model`
    (`Model(..., chunked_loss=True)`, `Model.wrap(model, chunked_loss=
    True)`): predict and evaluate keep returning full logits.

    Args:
        model: A built Keras model whose layers are taken over.
        chunked_loss: Bool, defaults to `True`.
        attention: `"chunked"` (default) or `None`.
        chunk_elements: Int, logits elements per chunk of the loss.
        block_elements: Int, attention scores per (query, key) block.
        owner: The `tfmemopt.Model` whose training step reads the head
            (defaults to `model`).

    Returns:
        A `LongSequenceReport`.

    Raises:
        ValueError: an attention layer with dropout or several attention
            axes, no candidate head, or the model is already taken over.
    """
    check_options(chunked_loss, attention)
    owner = model if owner is None else owner
    if getattr(owner, _STATE, None) is not None:
        raise ValueError(
            f"Model {owner.name!r} already has long-sequence options; "
            "call disable_long_sequences(model) first."
        )
    report = LongSequenceReport(
        chunked_loss, chunk_elements, block_elements=block_elements
    )
    state = _State(report)
    if chunked_loss:
        heads = head_candidates(model)
        if not heads:
            raise ValueError(
                f"chunked_loss=True found no linear head in {model.name!r} "
                "(a Dense, or a ReversibleEmbedding called with "
                "reverse=True). Construct the model without chunked_loss."
            )
        report.head_candidates = [_path(h) for h in heads]
    layers = []
    if attention == "chunked":
        layers = [
            layer
            for layer in sublayers(model)
            if isinstance(layer, keras.layers.MultiHeadAttention)
            or is_hub_attention(layer)
        ]
        _refuse_other_attention(model, layers)
        for layer in layers:
            if isinstance(layer, keras.layers.MultiHeadAttention):
                _check_attention(layer)
            else:
                check_hub_attention(layer, _path(layer))
        report.attention = attention
        report.attention_layers = [_path(layer) for layer in layers]
    if chunked_loss:
        for head in heads:
            _patch_head(state, head)
    for layer in layers:
        if isinstance(layer, keras.layers.MultiHeadAttention):
            _patch_attention(state, layer)
        else:
            patch_hub_attention(state, layer, _path(layer))
    if layers:  # keras-hub's decoders hand their attention the padding
        for layer in sublayers(model):
            if is_hub_decoder(layer):
                patch_hub_decoder(state, layer)
    set_untracked(owner, _STATE, state)
    return report


def _refuse_other_attention(model, taken) -> None:
    """Raises when attention is computed by layers that cannot be taken over.

    `MultiHeadAttention` (and its subclasses) and keras-hub's Llama,
    Mistral, Qwen2 and Phi-3 attention layers (`_hub_attention`) are
    chunked; others (Gemma, Bloom, GPT-NeoX, a new keras-hub class) compute
    attention in their own way. Leaving those on full scores while the user
    asked for chunked attention would be a silent fallback.
    """
    taken_ids = {id(layer) for layer in taken}
    others = [
        layer
        for layer in sublayers(model)
        if "attention" in type(layer).__name__.lower()
        and id(layer) not in taken_ids
        and not _inside_taken(layer, taken)
    ]
    if not others and taken:
        return
    if not others:
        raise ValueError(
            f"attention='chunked' found no attention layer in {model.name!r}: "
            "it takes over keras.layers.MultiHeadAttention and its "
            "subclasses. Construct the model without attention='chunked'."
        )
    classes = sorted({type(layer).__name__ for layer in others})
    paths = [_path(layer) for layer in others][:4]
    raise ValueError(
        f"attention='chunked' takes over keras.layers.MultiHeadAttention, its "
        f"subclasses and keras-hub's {', '.join(FAMILIES.values())} "
        f"attention, but {model.name!r} computes attention in "
        f"{', '.join(classes)} ({', '.join(paths)}"
        f"{', ...' if len(others) > 4 else ''}), whose scores would stay "
        "whole: construct the model without attention='chunked' "
        "(chunked_loss=True alone still applies; checkpointing='auto' keeps "
        "one layer's scores at a time)."
    )


def _inside_taken(layer, taken) -> bool:
    """Whether `layer` is a sublayer of a taken-over attention layer (a
    softmax or rotary embedding inside it)."""
    return any(
        layer is not t and any(layer is s for s in sublayers(t)) for t in taken
    )


def disable_long_sequences(owner) -> None:
    """Undoes `enable_long_sequences` (the layers' own methods come back)."""
    state = getattr(owner, _STATE, None)
    if state is None:
        return
    restore_instances(state)
    set_untracked(owner, _STATE, None)


def check_compiled(model, chunked_loss) -> None:
    """Refuses compiled metrics (they need the logits) with chunked_loss."""
    if not chunked_loss or not getattr(model, "compiled", False):
        return
    metrics = compiled_metrics(model)
    if any(metrics.values()):
        raise ValueError(
            "chunked_loss=True never forms the training logits, so compiled "
            f"metrics cannot be computed on them. Received: metrics="
            f"{metrics.get('metrics')!r}, weighted_metrics="
            f"{metrics.get('weighted_metrics')!r}. Compile "
            "without metrics and measure them with model.evaluate (which "
            "gives full logits), or construct the model without "
            "chunked_loss."
        )
    if type(model).compute_loss is not keras.Model.compute_loss:
        raise ValueError(
            f"{type(model).__name__} overrides `compute_loss`, which would "
            "receive the full logits: chunked_loss=True cannot chunk it. "
            "Use a compiled keras.losses.SparseCategoricalCrossentropy("
            "from_logits=True), or construct the model without "
            "chunked_loss."
        )


def report_of(owner) -> LongSequenceReport | None:
    state = getattr(owner, _STATE, None)
    return None if state is None else state.report
