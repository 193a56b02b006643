"""Optimizers whose state costs a fraction of Keras's.

- `Adam8bit`, `AdamW8bit`: Adam/AdamW with blockwise 8-bit moments
  (bitsandbytes' dynamic map), ~2.03 bytes of state per parameter instead
  of 8.
- `Adafactor`: factored second moments, a row and a column vector per
  matrix; no full-size state unless `beta_1` is set.

See docs/optimizers.md for the bytes per parameter, the quantisation error
and measured convergence.
"""

# Names imported here but not listed in __all__ are for tfmemopt's other
# packages, which import from a package, never from its private modules
# (tests/test_architecture.py); they are not public API.
from tfmemopt.optimizers._common import StateOptimizer as StateOptimizer
from tfmemopt.optimizers._common import UpdateChain as UpdateChain
from tfmemopt.optimizers._common import masked_delta as masked_delta
from tfmemopt.optimizers.adafactor import Adafactor
from tfmemopt.optimizers.adam8bit import Adam8bit
from tfmemopt.optimizers.adam8bit import AdamW8bit

__all__ = ["Adam8bit", "AdamW8bit", "Adafactor"]
