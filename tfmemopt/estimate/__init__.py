"""How much memory one training step needs, before running it.

`estimate_memory(model, batch_size, ...)` traces the model's real gradient
graph (without running it) and returns a `MemoryEstimate`: parameters,
gradients, optimizer state, accumulation buffers, inputs, activations kept
for the backward pass and its temporaries, for the settings tfmemopt offers.
See docs/estimator.md.
"""

from tfmemopt.estimate._estimate import MemoryEstimate
from tfmemopt.estimate._estimate import estimate_memory
from tfmemopt.estimate._settings import CPU_STATS_MIN_BYTES

__all__ = [
    "CPU_STATS_MIN_BYTES",
    "MemoryEstimate",
    "estimate_memory",
]
