"""How much memory one training step needs, before running it.

`estimate_memory(model, batch_size, ...)` traces the model's real gradient
graph (without running it) and returns a `MemoryEstimate`: parameters,
gradients, optimizer state, accumulation buffers, inputs, activations kept
for the backward pass and its temporaries, for the settings tfmemopt offers.
See docs/estimator.md.
"""

# Names imported here but not listed in __all__ are for tfmemopt's other
# packages, which import from a package, never from its private modules
# (tests/test_architecture.py); they are not public API.
from tfmemopt.estimate._estimate import MemoryEstimate
from tfmemopt.estimate._estimate import estimate_memory
from tfmemopt.estimate._input_specs import input_specs as input_specs
from tfmemopt.estimate._optimizer_state import (
    optimizer_state_bytes as optimizer_state_bytes,
)
from tfmemopt.estimate._optimizer_state import (
    resolve_optimizer as resolve_optimizer,
)
from tfmemopt.estimate._settings import CPU_STATS_MIN_BYTES

__all__ = [
    "CPU_STATS_MIN_BYTES",
    "MemoryEstimate",
    "estimate_memory",
]
