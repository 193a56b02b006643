"""Segment policies: which parts of a built model are recomputed.

Pure graph logic over a model's top-level operations; nothing here changes
the model (`apply.py` does).
"""

from __future__ import annotations

import math
from typing import Callable

import keras

from tfmemopt._compat import sublayers

POLICIES = ("auto", "blocks")


def validate_policy(policy) -> None:
    """Raises for a policy that is not a known name, a list or a callable."""
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(
                f"Unknown checkpointing policy {policy!r}. Expected one of "
                f"{list(POLICIES)}, a list of layers (or layer names), or a "
                "predicate `fn(layer) -> bool`."
            )
        return
    if callable(policy) or isinstance(policy, (list, tuple)):
        if isinstance(policy, (list, tuple)) and not policy:
            raise ValueError(
                "The checkpointing policy is an empty list: there is nothing "
                "to checkpoint. Pass layers (or layer names), 'auto' or "
                "'blocks'."
            )
        return
    raise TypeError(
        "`policy` must be 'auto', 'blocks', a list of layers or layer names, "
        f"or a callable. Received: policy={policy!r} (of type "
        f"{type(policy).__name__})."
    )


def is_composite(layer) -> bool:
    """A layer built of sub-layers (a transformer block, a residual unit)."""
    return bool(sublayers(layer, recursive=False))


def has_compute(op) -> bool:
    return not isinstance(op, keras.layers.InputLayer)


def top_level(model) -> list:
    """The model's own operations (not nested ones), inputs left out."""
    ops = getattr(model, "operations", None) or model.layers
    return [op for op in ops if has_compute(op)]


def select_layers(model, policy) -> list:
    """The top-level layers a `"blocks"`, list or predicate policy picks."""
    layers = [x for x in top_level(model) if isinstance(x, keras.layers.Layer)]
    if policy == "blocks":
        return [x for x in layers if is_composite(x)]
    if callable(policy) and not isinstance(policy, (list, tuple)):
        return [x for x in _all_layers(model) if policy(x)]
    chosen = []
    by_name = {x.name: x for x in _all_layers(model)}
    for item in policy:
        if isinstance(item, str):
            if item not in by_name:
                raise ValueError(
                    f"The checkpointing policy names layer {item!r}, which "
                    f"is not in model {model.name!r}. Its layers are: "
                    f"{sorted(by_name)}."
                )
            chosen.append(by_name[item])
        elif isinstance(item, keras.layers.Layer):
            if not any(item is x for x in by_name.values()):
                raise ValueError(
                    f"The checkpointing policy holds layer {item.name!r}, "
                    f"which is not part of model {model.name!r}."
                )
            chosen.append(item)
        else:
            raise TypeError(
                "A checkpointing policy list must hold Keras layers or "
                f"layer names. Received: {item!r} (of type "
                f"{type(item).__name__})."
            )
    return chosen


def _all_layers(model) -> list:
    return sublayers(model)


def _stateless(op) -> bool:
    """An operation without variables (no weights, no seed state): running
    it again on the same inputs gives the same output."""
    return not getattr(op, "variables", None)


def input_derived(model) -> set[int]:
    """Ids of the tensors computed from the model's inputs alone by
    stateless operations (a padding mask, `not_equal(token_ids, 0)`).

    Like the inputs themselves they are known at any point of the step: a
    segment that needs one recomputes it from the inputs (cheap: no
    weights), so it does not have to cross a segment boundary.
    """
    derived = {id(t) for t in keras.tree.flatten(model.inputs)}
    inputs = set(derived)
    for op in top_level(model):
        ins = [id(t) for t in keras.tree.flatten(op.input)]
        if ins and _stateless(op) and all(t in derived for t in ins):
            derived |= {id(t) for t in keras.tree.flatten(op.output)}
    return derived - inputs


def chain_cuts(model) -> list[int] | None:
    """Positions `i` in `top_level(model)` whose output alone carries on.

    A cut after operation `i` is a single tensor through which everything
    computed later depends on what came before: the place a segment can
    end. The model's inputs do not count (they stay alive for the whole
    step anyway, and a later segment takes the ones it needs, such as a
    padding mask), nor do tensors derived from the inputs alone by
    stateless operations (`input_derived`: a later segment recomputes
    them), and the cut tensor must not itself be a model output (all
    outputs come from the last segment). `None` when the graph cannot be
    read (a shared layer, a subclassed model).
    """
    ops = top_level(model)
    if not ops:
        return None
    if isinstance(model, keras.Sequential):
        return list(range(len(ops) - 1))
    try:
        ins = [[id(t) for t in keras.tree.flatten(op.input)] for op in ops]
        outs = [[id(t) for t in keras.tree.flatten(op.output)] for op in ops]
        derived = input_derived(model)
    except (AttributeError, ValueError):
        return None
    final = {id(t) for t in keras.tree.flatten(model.outputs)}
    cuts = []
    for i in range(len(ops) - 1):
        produced = {t for o in outs[: i + 1] for t in o}
        later = {t for j in range(i + 1, len(ops)) for t in ins[j]}
        live = ((produced & later) | (produced & final)) - derived
        if len(outs[i]) == 1 and live == {outs[i][0]} - final - derived:
            cuts.append(i)
    return cuts


def segment_inputs(model, start: int, stop: int) -> list[int]:
    """Indices in `model.inputs` that operations `start:stop` consume,
    directly or through tensors derived from them (`input_derived`: the
    segment recomputes those)."""
    ops = top_level(model)
    producer = {}
    for op in ops:
        for t in keras.tree.flatten(op.output):
            producer[id(t)] = op
    derived = input_derived(model)
    used: set[int] = set()
    todo = [t for op in ops[start:stop] for t in keras.tree.flatten(op.input)]
    while todo:
        t = todo.pop()
        if id(t) in used:
            continue
        used.add(id(t))
        if id(t) in derived:
            todo.extend(keras.tree.flatten(producer[id(t)].input))
    return [j for j, t in enumerate(model.inputs) if id(t) in used]


def weighted_layers(op) -> int:
    """How many layers with weights `op` is: itself, or those inside it."""
    if not getattr(op, "weights", None):
        return 0
    if not isinstance(op, keras.layers.Layer):
        return 1
    leaves = [x for x in sublayers(op) if x.weights and not is_composite(x)]
    return max(1, len(leaves))


def auto_segments(model) -> list[tuple[int, int]] | None:
    """`(start, stop)` ranges of `top_level(model)`, about sqrt(N) long.

    Recomputing each layer alone saves nothing, and one segment for the
    whole model saves nothing either (PITFALLS.md): about sqrt(N) layers per
    segment keeps the fewest activations, measured +30% step time for 16
    layers. Only layers with weights count towards N (activations and
    reshapes ride along with their neighbours), and a composite layer
    counts the weighted layers inside it: a transformer block keeps far
    more activations inside than at its output, so a stack of them gets
    one block per segment, not sqrt(blocks) blocks (0.56x -> 0.26x peak on
    the benchmark's 6-block transformer).
    """
    ops = top_level(model)
    cuts = chain_cuts(model)
    if cuts is None:
        return None
    weighted = [weighted_layers(op) for op in ops]
    n = max(sum(weighted), 1)
    target = max(2, round(math.sqrt(n)))
    segments, start, count = [], 0, 0
    for i in range(len(ops)):
        count += weighted[i]
        if count >= target and i in cuts:
            segments.append((start, i + 1))
            start, count = i + 1, 0
    if start < len(ops):
        if count == 0 and segments:
            s, _ = segments.pop()
            segments.append((s, len(ops)))
        else:
            segments.append((start, len(ops)))
    return segments


def dominant_submodel(model):
    """A nested `keras.Model` holding most of `model`'s weighted layers.

    A keras-hub task (`GPT2CausalLM`, `BertTextClassifier`,
    `ViTImageClassifier`) is a small head around one backbone model; cut at
    the top level, the whole backbone would be one segment and nothing
    would be saved. `None` when there is no such model.
    """
    ops = top_level(model)
    weighted = [weighted_layers(op) for op in ops]
    total = sum(weighted)
    for op, w in zip(ops, weighted):
        if isinstance(op, keras.Model) and w > 1 and 2 * w > total:
            return op
    return None


def held_blocks(model) -> list:
    """The blocks inside a top-level layer that holds most of the weights.

    A layer such as keras-hub's `ViTEncoder` keeps its transformer blocks in
    a list: the model's graph sees one layer, which a segment would take
    whole. Its composite children (the blocks) are what to recompute, each
    on its own; at least two, else `[]`.
    """
    return held_blocks_and_holder(model)[1]


def held_blocks_and_holder(model) -> tuple:
    """`(holder, blocks)` for `held_blocks`: the top-level layer that holds
    the blocks, and the blocks; `(None, [])` if there are none."""
    ops = [op for op in top_level(model) if isinstance(op, keras.layers.Layer)]
    total = sum(weighted_layers(op) for op in top_level(model))
    for op in ops:
        if isinstance(op, keras.Model) or 2 * weighted_layers(op) <= total:
            continue
        blocks = [
            x
            for x in op._flatten_layers(include_self=False, recursive=False)
            if is_composite(x)
        ]
        if len(blocks) >= 2:
            return op, blocks
    return None, []


Predicate = Callable[[keras.layers.Layer], bool]
