"""tfmemopt: train Keras models that do not fit in accelerator memory.

Exact gradient accumulation (`Model`, `AccumulatingOptimizer`), activation
checkpointing that really saves memory (`CheckpointBlock`,
`enable_checkpointing`), mixed precision chosen for the hardware
(`mixed_precision.configure`, `check_precision`, `check_alignment`),
`tf.distribute` that works (`distribute.auto_strategy`), and tools that
measure and plan memory (`callbacks.MemoryMonitor`, `estimate_memory`,
`find_batch_size`, `plan`, `oom_report`). TensorFlow + Keras 3.
"""

__version__ = "0.1.0.dev0"

from tfmemopt import accumulation
from tfmemopt import callbacks
from tfmemopt import checkpointing
from tfmemopt import distribute
from tfmemopt import estimate
from tfmemopt import longseq
from tfmemopt import memory
from tfmemopt import optimizers
from tfmemopt import precision
from tfmemopt import tuning
from tfmemopt._legacy import alias_0_1_paths
from tfmemopt._legacy import legacy_attribute
from tfmemopt.accumulation import AccumulatingOptimizer
from tfmemopt.accumulation import Model
from tfmemopt.accumulation import WrappedModel
from tfmemopt.checkpointing import CheckpointBlock
from tfmemopt.checkpointing import disable_checkpointing
from tfmemopt.checkpointing import enable_checkpointing
from tfmemopt.distribute import ShardedOptimizer
from tfmemopt.estimate import MemoryEstimate
from tfmemopt.estimate import estimate_memory
from tfmemopt.precision import _mixed_precision as mixed_precision
from tfmemopt.precision import check_alignment
from tfmemopt.precision import check_precision
from tfmemopt.precision import pad_to_multiple
from tfmemopt.tuning import Plan
from tfmemopt.tuning import find_batch_size
from tfmemopt.tuning import oom_report
from tfmemopt.tuning import plan
from tfmemopt.tuning import suggest_accumulation

# The module paths of 0.1 (`tfmemopt.model`, `tfmemopt.oom`, ...) keep
# importing, as the modules they moved to (see tfmemopt/_legacy.py).
alias_0_1_paths()


def __getattr__(name):
    return legacy_attribute(name)


__all__ = [
    "__version__",
    # exact gradient accumulation
    "accumulation",
    "Model",
    "WrappedModel",
    "AccumulatingOptimizer",
    # activation checkpointing
    "checkpointing",
    "CheckpointBlock",
    "enable_checkpointing",
    "disable_checkpointing",
    # mixed precision and advice
    "precision",
    "mixed_precision",
    "check_precision",
    "check_alignment",
    "pad_to_multiple",
    # long sequences: chunked loss and attention
    "longseq",
    # distribution
    "distribute",
    "ShardedOptimizer",
    # optimizers with small state
    "optimizers",
    # memory tools
    "memory",
    "callbacks",
    "estimate",
    "estimate_memory",
    "MemoryEstimate",
    "find_batch_size",
    "tuning",
    "suggest_accumulation",
    "plan",
    "Plan",
    "oom_report",
]
