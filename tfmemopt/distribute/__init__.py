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

from tfmemopt.distribute._auto_strategy import auto_strategy
from tfmemopt.distribute._auto_strategy import describe
from tfmemopt.distribute._environment import Environment
from tfmemopt.distribute._environment import detect_environment
from tfmemopt.distribute.sharding import ShardedOptimizer

__all__ = [
    "Environment",
    "ShardedOptimizer",
    "auto_strategy",
    "describe",
    "detect_environment",
]
