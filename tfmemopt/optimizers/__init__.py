"""Optimizers whose state costs a fraction of Keras's.

- `Adam8bit`, `AdamW8bit`: Adam/AdamW with blockwise 8-bit moments
  (bitsandbytes' dynamic map), ~2.03 bytes of state per parameter instead
  of 8.
- `Adafactor`: factored second moments, a row and a column vector per
  matrix; no full-size state unless `beta_1` is set.

See docs/optimizers.md for the bytes per parameter, the quantisation error
and measured convergence.
"""

from tfmemopt.optimizers.adafactor import Adafactor
from tfmemopt.optimizers.adam8bit import Adam8bit
from tfmemopt.optimizers.adam8bit import AdamW8bit

__all__ = ["Adam8bit", "AdamW8bit", "Adafactor"]
