"""Rules on top of the traced step: checkpoint segments, opaque layers.

`checkpointed_activations` models activation checkpointing on the traced
step: only segment boundaries are kept, plus the largest segment while it
is recomputed. `unknown_layers` sizes layers whose kept tensors the graph
cannot size (while loops): recurrent layers by rule, anything else from its
output size with a warning that names it.
"""

from __future__ import annotations

import math
import warnings

from tfmemopt._compat import sublayers
from tfmemopt.checkpointing import auto_segments
from tfmemopt.checkpointing import connected_segments
from tfmemopt.checkpointing import dominant_submodel
from tfmemopt.checkpointing import held_blocks_and_holder
from tfmemopt.checkpointing import select_layers
from tfmemopt.checkpointing import top_level

# Fallback where a recurrent layer's loop cannot be sized from the graph
# (`_while_loops` sizes Keras's generic loop itself). Per time step and
# sample, in units of the layer's width: what `while_v2` accumulates for
# Keras's gradient tape (traced, Keras 3.15 / TF 2.21). LSTM: the four gate
# activations, tanh(c), the previous h and c; GRU: 6; SimpleRNN: the
# previous h and the new one. Plus twice the step's input (its accumulator
# and the unstacked input list).
_RNN_FACTORS = {"LSTM": 7, "GRU": 6, "SimpleRNN": 2}


def _segments(units, every):
    return [units[i : i + every] for i in range(0, len(units), every)]


def _library_segments(model, segments):
    """The segments `enable_checkpointing(model, "auto")` makes, as units.

    `(segments, depth)`, or `None` where it would fall back to other rules
    (a subclassed model). The estimate must cut where the library cuts
    (`connected_segments`: merged where a segment's outputs need a tensor
    from before its boundary, "blocks" where that leaves one segment):
    about sqrt(N) layers *with weights* per segment, only where one tensor
    carries everything on (a cut inside a residual block would keep the
    skip tensor too), and inside a nested model that holds most of the
    weighted layers (a backbone with a head: the library segments the
    backbone; cut at the top level, a GPT-2 backbone with its tied
    embedding head was one segment, estimated at the plain step's 316
    MiB against 134 measured).
    """
    prefix = ()
    blocks = []
    try:
        inner = dominant_submodel(model)
        if inner is not None:  # the library segments the backbone
            prefix, model = (inner.name,), inner
        # A layer holding its blocks in a list (keras-hub's `ViTEncoder`):
        # the library recomputes each block on its own.
        holder, held = held_blocks_and_holder(model)
        if held:
            depth = len(prefix) + 2
            if depth not in segments:
                return None
            known = set(segments[depth][0])
            segs = [[prefix + (holder.name, b.name)] for b in held]
            segs = [s for s in segs if s[0] in known]
            return (segs, depth) if segs else None
        ranges = auto_segments(model)
        ops = top_level(model)
        if ranges:
            ranges = connected_segments(model, ranges)
            if ranges is None:  # "auto" falls back to "blocks"
                blocks = select_layers(model, "blocks")
    except (AttributeError, TypeError, ValueError):
        return None
    depth = len(prefix) + 1
    known = set(segments[depth][0])
    if ranges is None and blocks:
        segs = [[prefix + (b.name,)] for b in blocks]
        segs = [s for s in segs if s[0] in known]
        return (segs, depth) if segs else None
    if not ranges:
        return None
    segs = [
        [prefix + (op.name,) for op in ops[a:b] if prefix + (op.name,) in known]
        for a, b in ranges
    ]
    segs = [s for s in segs if s]
    return (segs, depth) if segs else None


def checkpointed_activations(step, policy, model=None):
    """(activations kept with checkpointing, number of segments, depth)."""
    segs, saved, outputs, depth = checkpoint_segments(step, policy, model)
    if not segs:
        return step.saved, 0, depth
    return _kept(step, segs, saved, outputs), len(segs), depth


def checkpoint_segments(step, policy, model=None):
    """`(segments, saved, outputs, depth)`: the segments the estimate cuts
    (lists of units, layer paths of the traced step), the saved bytes and
    output bytes per unit at that depth. No units: `([], ...)`."""
    depth = 1
    units, saved, outputs = step.segments[1]
    if policy == "auto" and model is not None:
        found = _library_segments(model, step.segments)
        if found is not None:
            segs, depth = found
            _, saved, outputs = step.segments[depth]
            return segs, saved, outputs, depth
    # A single nested model (keras.applications inside a functional model)
    # is segmented one level down.
    total = sum(saved.values()) or 1
    if len(units) < 4 or max(saved.values(), default=0) > 0.9 * total:
        deeper = step.segments[2]
        if len(deeper[0]) > len(units):
            units, saved, outputs = deeper
            depth = 2
    if not units:
        return [], saved, outputs, depth
    if policy == "auto":
        every = max(1, round(math.sqrt(len(units))))
    elif policy == "blocks":
        every = 1
    else:
        every = int(policy)
    return _segments(units, every), saved, outputs, depth


def _kept(step, segs, saved, outputs):
    """Outside the segments, their boundaries, and the largest recomputed.

    The backward pass reaches the segments last to first, after the loss
    and the layers after the last segment (a model's head): what those
    keep is read and freed before any segment is recomputed. A GPT-2
    backbone with its tied embedding head at batch 32 keeps 62.5 MiB for
    the loss's gradient of the logits, freed when the head's gradient is
    made; counted beside the recomputed segment, the estimate was +32%.
    """
    units = list(saved)
    inside = sum(saved[u] for seg in segs for u in seg)
    outside = step.saved - inside
    boundaries = sum(outputs[seg[-1]] for seg in segs[:-1])
    largest = max(sum(saved[u] for u in seg) for seg in segs)
    last = units.index(segs[-1][-1])
    # The loss's kept tensors are in no layer's unit.
    after = sum(saved[u] for u in units[last + 1 :])
    after += step.saved - sum(saved.values())
    recompute = max(0, largest - max(0, after))
    return min(outside + boundaries + recompute, step.saved)


def unknown_layers(model, step, itemsize, batch):
    """Bytes for layers whose kept tensors have no static size (while loops).

    Recurrent layers are counted by rule (per time step: the cell's gates
    and states); anything else from its output size, with a warning.
    """
    extra, notes = 0, []
    by_name = {}
    for layer in sublayers(model):
        by_name.setdefault(layer.name, layer)
    seen = set()
    for label in step.unknown:
        name = label.split("/")[0]
        layer = by_name.get(name)
        if layer is None or name in seen:
            continue
        seen.add(name)
        kind = type(layer).__name__
        try:
            out_shape = tuple(layer.output.shape)
            in_shape = tuple(layer.input.shape)
        except (AttributeError, ValueError):
            out_shape = in_shape = None
        if kind in _RNN_FACTORS and in_shape and len(in_shape) == 3:
            steps, features = in_shape[1], in_shape[2]
            units = getattr(layer, "units", None) or layer.cell.units
            per_step = _RNN_FACTORS[kind] * units + 2 * features
            n = batch * steps * per_step * itemsize
            notes.append(f"{name} ({kind}): {steps} time steps counted by rule")
        else:
            size = math.prod(out_shape[1:]) if out_shape else 0
            n = batch * size * itemsize
            message = (
                f"Layer {name!r} ({kind}) keeps tensors of unknown size for "
                "its backward pass; estimated from its output size only."
            )
            warnings.warn(message, stacklevel=3)
            notes.append(message)
        extra += n
    return extra, notes
