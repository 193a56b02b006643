"""Exact gradient accumulation: one optimizer update per batch, in pieces.

`Model` (functional, subclassed, or `Model.wrap` around a model you did not
write: `WrappedModel`) splits each batch into micro-batches inside one train
step and applies the full-batch update. `AccumulatingOptimizer` accumulates
across steps instead, for a model that must stay a plain `keras.Model`.
See docs/accumulating_optimizer.md and docs/architecture.md.
"""

# Names imported here but not listed in __all__ are for tfmemopt's other
# packages, which import from a package, never from its private modules
# (tests/test_architecture.py); they are not public API.
from tfmemopt.accumulation._accumulating_optimizer import AccumulatingOptimizer
from tfmemopt.accumulation._fit_hooks import add_fit_hook as add_fit_hook
from tfmemopt.accumulation._micro_batching import MicroBatchPlan
from tfmemopt.accumulation._micro_batching import plan_micro_batches
from tfmemopt.accumulation._model import Model
from tfmemopt.accumulation._wrapped import WrappedModel

__all__ = [
    "AccumulatingOptimizer",
    "MicroBatchPlan",
    "Model",
    "WrappedModel",
    "plan_micro_batches",
]
