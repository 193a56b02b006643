"""`tf.distribute` for tfmemopt: pick a strategy, and make Keras 3 correct.

- `auto_strategy()` chooses and builds the strategy (active scope, TPU,
  multi-worker `TF_CONFIG`, several GPUs, or the default) and logs why;
  `describe(strategy)` says what a strategy is in one line.
- `tfmemopt.Model` calls the helpers here so that training under a strategy
  equals training on one device: the multi-worker `fit` fixes, a loss-scale
  finite check shared by all replicas, clipping after the all-reduce, and a
  clear error for `keras.distribution` on the TensorFlow backend.

Batch semantics: `batch_size` in `fit` is global; each replica gets
`batch_size / replicas` samples and splits them into `accumulation_steps`
micro-batches; one update costs one all-reduce.
"""

# Names imported here but not listed in __all__ are for tfmemopt's other
# packages, which import from a package, never from its private modules
# (tests/test_architecture.py); they are not public API.
from tfmemopt.distribute._auto_strategy import auto_strategy
from tfmemopt.distribute._auto_strategy import describe
from tfmemopt.distribute._environment import Environment
from tfmemopt.distribute._environment import detect_environment
from tfmemopt.distribute._fsdp import check_optimizer as check_optimizer
from tfmemopt.distribute._fsdp_gather_order import (
    gathers_after as gathers_after,
)
from tfmemopt.distribute._gradients import count_non_finite as count_non_finite
from tfmemopt.distribute._keras_fixes import (
    refuse_jit_replicas as refuse_jit_replicas,
)
from tfmemopt.distribute._shard_layout import Layout as Layout
from tfmemopt.distribute._shard_layout import StateCut as StateCut
from tfmemopt.distribute.sharding import ShardedOptimizer

__all__ = [
    "Environment",
    "ShardedOptimizer",
    "auto_strategy",
    "describe",
    "detect_environment",
]
