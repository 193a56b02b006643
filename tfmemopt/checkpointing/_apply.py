"""`enable_checkpointing` / `disable_checkpointing` on a built model."""

from __future__ import annotations

import dataclasses
import threading
import warnings
import weakref

import keras
import tensorflow as tf

from tfmemopt._compat import set_untracked
from tfmemopt.checkpointing import _policies as policies
from tfmemopt.checkpointing._block import CheckpointBlock
from tfmemopt.checkpointing._recompute import checkpoint_call
from tfmemopt.checkpointing._safety import why_not_replayable

_STATE = "_tfmemopt_checkpointing"
_local = threading.local()


class _State:
    """What `enable_checkpointing` changed on one model, to undo it.

    A plain object on purpose: Keras's saving walks every attribute that
    `dir(model)` lists and descends into Keras objects, lists, tuples and
    dicts. A dict here holding the segment blocks (whose loss owner is the
    model) made a cycle that `load_model`, `load_weights` and
    `BackupAndRestore` walked until `RecursionError` (Keras 3.15). The
    loader skips any other object, so nothing in here is ever walked.
    """

    __slots__ = ("report", "patched", "model_call", "nested", "stages")

    def __init__(self, report):
        self.report = report
        self.patched = []
        self.model_call = False
        self.nested = None
        self.stages = []


@dataclasses.dataclass
class CheckpointReport:
    """What `enable_checkpointing` did.

    Attributes:
        policy: The policy as given (a name, or `"list"` / `"predicate"`).
        mode: `"segments"` (the model's call runs its graph in checkpointed
            segments) or `"layers"` (each chosen layer recomputes itself).
        segments: One list of layer names per checkpointed segment.
        skipped: `(layer name, reason)` for layers left out.
        inside: `None`, or the path of the nested model the policy was
            applied to (`"gpt2_causal_lm/gpt2_backbone"`): `"auto"` goes
            into a nested model that holds most of the weighted layers.
    """

    policy: str
    mode: str
    segments: list = dataclasses.field(default_factory=list)
    skipped: list = dataclasses.field(default_factory=list)
    inside: str | None = None

    def __str__(self) -> str:
        lines = [
            f"checkpointing policy={self.policy!r} mode={self.mode!r}: "
            f"{len(self.segments)} segment(s)"
            + (f" inside {self.inside}" if self.inside else "")
        ]
        for i, names in enumerate(self.segments):
            lines.append(f"  segment {i}: {', '.join(names)}")
        for name, why in self.skipped:
            lines.append(f"  skipped {name}: {why}")
        return "\n".join(lines)


def enable_checkpointing(model: keras.Model, policy="auto") -> CheckpointReport:
    """Recomputes activations of a built model in the backward pass, in place.

    The model keeps its layers, weights, config and saved format; only how
    its forward pass is run changes. Each checkpointed segment keeps just
    its input for the backward pass and runs its forward pass once more
    there, so peak activation memory falls to about one segment plus the
    segment boundaries, for about one extra forward pass of compute (+30%
    step time measured). Gradients stay exact (see `CheckpointBlock`).

    The change is not saved with the model: after `keras.saving.load_model`
    call this again (or use `tfmemopt.Model(..., checkpointing=policy)`,
    whose config remembers it). Calling it on a compiled model drops the
    traced train, test and predict functions so the next `fit` retraces.

    Args:
        model: A built `keras.Model` (functional, `Sequential` or
            subclassed).
        policy: String, list or callable, defaults to `"auto"`.
            `"auto"`: segments of about sqrt(N) weighted layers, cut where a
            single tensor carries everything on (functional and
            `Sequential` models; subclassed models fall back to
            `"blocks"`). It goes into a nested model that holds most of
            the weighted layers (a keras-hub task's backbone), and a layer
            holding most of them that keeps blocks in a list (keras-hub's
            `ViTEncoder`) has each block recomputed on its own; it warns
            when the one segment it finds is the whole model (which saves
            nothing). `"blocks"`: every top-level layer made of
            sub-layers (a transformer block, a residual unit) on its own.
            A list of layers or layer names: each on its own. A callable
            `fn(layer) -> bool`: every layer (at any depth) it accepts.

    Returns:
        A `CheckpointReport` naming the segments and any layer skipped.

    Raises:
        ValueError: unknown policy name, an empty policy or a policy that
            selects nothing, a model that is not built, a layer name not in
            the model; or checkpointing is already enabled.
        TypeError: `model` is not a Keras model, or `policy` has a wrong
            type.

    Example:

    >>> import keras, tfmemopt
    >>> model = keras.Sequential(
    ...     [keras.Input((32,))] + [keras.layers.Dense(32) for _ in range(9)])
    >>> report = tfmemopt.enable_checkpointing(model, "auto")
    >>> len(report.segments)
    3
    >>> tfmemopt.disable_checkpointing(model)
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            "`model` must be a keras.Model. Received: "
            f"model={model!r} (of type {type(model).__name__})."
        )
    policies.validate_policy(policy)
    if not model.built:
        raise ValueError(
            f"Model {model.name!r} is not built. Call it on data or call "
            "`model.build(input_shape)` before `enable_checkpointing`."
        )
    if getattr(model, _STATE, None) is not None:
        raise ValueError(
            f"Checkpointing is already enabled on model {model.name!r}. "
            "Call `tfmemopt.disable_checkpointing(model)` first to change "
            "the policy."
        )
    name = (
        policy
        if isinstance(policy, str)
        else ("predicate" if callable(policy) else "list")
    )
    if policy == "auto":
        inner = policies.dominant_submodel(model)
        if inner is not None and getattr(inner, _STATE, None) is None:
            # A task model around a backbone: the backbone's own segments.
            report = enable_checkpointing(inner, "auto")
            report.inside = f"{model.name}/{report.inside or inner.name}"
            state = _State(report)
            state.nested = inner
            set_untracked(model, _STATE, state)
            _drop_traced_functions(model)
            return report
    report = CheckpointReport(policy=name, mode="layers")
    state = _State(report)
    layers = None
    if policy == "auto":
        layers = policies.held_blocks(model)
        segments = None if layers else policies.auto_segments(model)
        if segments is not None:
            _enable_segments(model, segments, report, state)
        if not layers and not state.model_call:
            policy = "blocks"
    if not state.model_call:
        if layers is None or not layers:
            layers = policies.select_layers(model, policy)
        for layer in layers:
            reason = why_not_replayable(layer)
            if reason is not None:
                _skip(report, layer.name, reason)
                continue
            _patch_layer(layer)
            state.patched.append(layer)
            report.segments.append([layer.name])
    if not report.segments:
        raise ValueError(
            f"Checkpointing policy {name!r} selected no layer of model "
            f"{model.name!r} (skipped: {report.skipped or 'none'}). For a "
            "model of plain layers use 'auto'; 'blocks' needs top-level "
            "layers made of sub-layers."
        )
    _warn_if_whole(model, report)
    set_untracked(model, _STATE, state)
    _drop_traced_functions(model)
    return report


def _warn_if_whole(model, report) -> None:
    """Warns when the one segment chosen is the whole model (no saving)."""
    ops = policies.top_level(model)
    names = [op.name for op in ops if policies.weighted_layers(op)]
    if len(report.segments) == 1 and set(names) <= set(report.segments[0]):
        warnings.warn(
            f"tfmemopt checkpointing policy {report.policy!r} put all of "
            f"model {model.name!r} into one segment "
            f"({', '.join(report.segments[0])}): a single segment keeps as "
            "many activations as no checkpointing and saves nothing. Pass "
            "the layers to recompute (a list of layers or names, or a "
            "predicate), or use 'blocks' if the model's layers hold blocks.",
            stacklevel=3,
        )


def disable_checkpointing(model: keras.Model) -> None:
    """Undoes `enable_checkpointing`: the model runs as it was built.

    Args:
        model: A `keras.Model` on which `enable_checkpointing` was called;
            any other model is left as it is.

    Example:

    >>> import keras, tfmemopt
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
    >>> _ = tfmemopt.enable_checkpointing(model, [model.layers[0]])
    >>> tfmemopt.disable_checkpointing(model)
    """
    state = getattr(model, _STATE, None)
    if state is None:
        return
    if state.nested is not None:
        disable_checkpointing(state.nested)
    for layer in state.patched:
        layer.__dict__.pop("call", None)
    if state.model_call:
        model.__dict__.pop("call", None)
    set_untracked(model, _STATE, None)
    _drop_traced_functions(model)


def checkpointing_report(model: keras.Model) -> CheckpointReport | None:
    """The report of the checkpointing enabled on `model`, or `None`."""
    state = getattr(model, _STATE, None)
    return None if state is None else state.report


def _skip(report, name, reason):
    report.skipped.append((name, reason))
    warnings.warn(
        f"tfmemopt checkpointing skipped layer {name!r}: {reason}.",
        stacklevel=3,
    )


def _graph_state(model) -> list:
    """What building a sub-model from `model`'s tensors can change.

    `keras.Model(inputs, outputs)` on inner tensors clones the nodes in
    between: it appends nodes to the original layers and rewires the
    `_keras_history` of any model input it keeps, after which the model's
    own `get_config` (and so `save`, `clone_model`) looks up a node that
    is not in its graph. The snapshot lets `_enable_segments` put every
    node list and tensor history back once its sub-models exist (they run
    on the nodes they hold, not on the layers' lists).
    """
    state = []
    for op in getattr(model, "operations", None) or model.layers:
        state.append((op, list(op._inbound_nodes), list(op._outbound_nodes)))
    histories = [
        (t, t._keras_history)
        for op, inbound, _ in state
        for node in inbound
        for t in keras.tree.flatten(node.output_tensors)
    ]
    return [state, histories]


def _restore_graph(snapshot) -> None:
    state, histories = snapshot
    for op, inbound, outbound in state:
        op._inbound_nodes[:] = inbound
        op._outbound_nodes[:] = outbound
    for t, history in histories:
        t._keras_history = history


def connected_segments(model, segments):
    """The `"auto"` segments that can be built, or None.

    Where a segment's outputs also need a tensor from before its boundary
    that `chain_cuts` could not see (keras-hub's T5: the decoder's
    cross-attention reads the encoder's output), that boundary goes and
    the two segments become one. None where that merges them down to one
    segment (no saving: "auto" falls back to "blocks"). The estimator
    reads it too, so that it cuts where the library cuts.
    """
    segments = list(segments)
    merged = False
    while len(segments) > 1 or not merged:
        found = _first_disconnected(model, segments)
        if found is None:
            return segments
        k, error = found
        if len(segments) < 2:
            raise error
        k = max(k, 1)
        segments[k - 1 : k + 1] = [(segments[k - 1][0], segments[k][1])]
        merged = True
    return None


def _first_disconnected(model, segments):
    """`(k, error)` for the first segment whose outputs do not follow from
    its inputs alone, or None."""
    if isinstance(model, keras.Sequential):
        return None
    ops = policies.top_level(model)
    snapshot = _graph_state(model)
    try:
        for k in range(len(segments)):
            inputs, outputs, _ = _segment_io(model, ops, segments, k)
            try:
                keras.Model(inputs, outputs)
            except ValueError as e:
                if "is not connected" not in str(e):
                    raise
                return k, e
    finally:
        _restore_graph(snapshot)
    return None


def _segment_io(model, ops, segments, k):
    """`(inputs, outputs, needed)` of segment `k` of a functional model:
    the boundary plus the model inputs used inside it (a mask)."""
    start, stop = segments[k]
    inputs, needed = model.input, []
    if k:
        needed = policies.segment_inputs(model, start, stop)
        boundary = ops[start - 1].output
        extra = [model.inputs[j] for j in needed]
        inputs = [boundary, *extra] if needed else boundary
    last = k == len(segments) - 1
    outputs = model.output if last else ops[stop - 1].output
    return inputs, outputs, needed


def _enable_segments(model, segments, report, state):
    """Builds the segments `connected_segments` keeps (none where "auto"
    falls back to "blocks")."""
    segments = connected_segments(model, segments)
    if segments is None:
        return
    snapshot = _graph_state(model)
    try:
        _build_stages(model, segments, report, state)
    finally:
        _restore_graph(snapshot)


def _build_stages(model, segments, report, state):
    ops = policies.top_level(model)
    stages = []
    for k, (start, stop) in enumerate(segments):
        names = [op.name for op in ops[start:stop]]
        reasons = [
            why_not_replayable(op)
            for op in ops[start:stop]
            if isinstance(op, keras.layers.Layer)
        ]
        reasons = [r for r in reasons if r]
        needed = []
        if isinstance(model, keras.Sequential):
            sub = list(ops[start:stop])
        else:
            inputs, outputs, needed = _segment_io(model, ops, segments, k)
            sub = keras.Model(inputs, outputs, name=f"{model.name}_seg{k}")
        if reasons:
            _skip(report, "+".join(names), reasons[0])
            sub = sub if isinstance(sub, list) else [sub]
            stages.extend((layer, needed) for layer in sub)
        else:
            # autocast=False: the segment passes its input on as it came,
            # as the model's own graph does; each layer inside casts for
            # itself. (A block casting to its own policy's compute dtype
            # made a model built under mixed_bfloat16 and loaded under
            # float32 train differently: bfloat16 boundaries cast to
            # float32 and back, gradients rounded otherwise.)
            block = CheckpointBlock(
                sub, name=f"{model.name}_ckpt{k}", autocast=False
            )
            # `add_loss` terms go to the model. A weak reference, not the
            # model: Keras's saving walks every attribute `dir()` lists,
            # and a block pointing back at its model is a cycle there.
            set_untracked(block, "_tfmemopt_loss_owner", weakref.ref(model))
            stages.append((block, needed))
            report.segments.append(names)

    def call(inputs, training=None, mask=None, **kwargs):
        flat = keras.tree.flatten(inputs)
        x = inputs
        for stage, needed in stages:
            if needed:
                x = [_without_mask(x)] + [flat[j] for j in needed]
            x = stage(x, training=training)
        return x

    set_untracked(model, "call", call)
    state.model_call = True
    state.stages = [stage for stage, _ in stages]
    report.mode = "segments"


def _without_mask(x):
    """The boundary tensor without the Keras mask its producer attached.

    A segment that takes model inputs recomputes the masks its layers were
    called with from those inputs (a mask is input-derived, or it would
    cross the boundary and there would be no cut). Passed on, the attached
    mask would only make Keras warn that the segment drops it.
    """
    if getattr(x, "_keras_mask", None) is None:
        return x
    return tf.identity(x)  # shares the buffer; carries no mask


def _replaying() -> set:
    if not hasattr(_local, "ids"):
        _local.ids = set()
    return _local.ids


def _patch_layer(layer):
    """Makes `layer.call` recompute itself; its `__call__` replays it."""
    original = layer.call

    def call(*args, **kwargs):
        if id(layer) in _replaying() or kwargs.get("training") is False:
            return original(*args, **kwargs)
        training = kwargs.get("training")
        if training is None:
            context = getattr(layer, "_get_call_context", lambda: None)()
            training = getattr(context, "training", None)

        def replay(*a, **k):
            if training is not None and "training" not in k:
                k["training"] = training
            _replaying().add(id(layer))
            try:
                return layer(*a, **k)
            finally:
                _replaying().discard(id(layer))

        return checkpoint_call(
            original,
            args,
            kwargs,
            layer.variables,
            replay=replay,
            owner=layer,
        )

    set_untracked(layer, "call", call)


def _drop_traced_functions(model):
    for attr in ("train_function", "test_function", "predict_function"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)
