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

from tfmemopt import callbacks
from tfmemopt import checkpointing
from tfmemopt import distribute
from tfmemopt import memory
from tfmemopt.precision import _mixed_precision as mixed_precision
from tfmemopt.accumulation._wrapped import WrappedModel
from tfmemopt.accumulation._accumulating_optimizer import AccumulatingOptimizer
from tfmemopt.precision._advice import check_alignment
from tfmemopt.precision._advice import check_precision
from tfmemopt.tuning._batch_size import find_batch_size
from tfmemopt.tuning._batch_size import suggest_accumulation
from tfmemopt.checkpointing import CheckpointBlock
from tfmemopt.checkpointing import disable_checkpointing
from tfmemopt.checkpointing import enable_checkpointing
from tfmemopt.estimate._estimate import MemoryEstimate
from tfmemopt.estimate._estimate import estimate_memory
from tfmemopt.precision._findings import pad_to_multiple
from tfmemopt.accumulation._model import Model
from tfmemopt.tuning._oom import oom_report
from tfmemopt.tuning._planner import Plan
from tfmemopt.tuning._planner import plan

__all__ = [
    "__version__",
    # exact gradient accumulation
    "Model",
    "WrappedModel",
    "AccumulatingOptimizer",
    # activation checkpointing
    "checkpointing",
    "CheckpointBlock",
    "enable_checkpointing",
    "disable_checkpointing",
    # mixed precision and advice
    "mixed_precision",
    "check_precision",
    "check_alignment",
    "pad_to_multiple",
    # distribution
    "distribute",
    # memory tools
    "memory",
    "callbacks",
    "estimate_memory",
    "MemoryEstimate",
    "find_batch_size",
    "suggest_accumulation",
    "plan",
    "Plan",
    "oom_report",
]
