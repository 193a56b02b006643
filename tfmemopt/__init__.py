"""tfmemopt: train Keras models that do not fit in accelerator memory.

Exact gradient accumulation, activation checkpointing that really saves
memory, mixed precision chosen for the hardware, `tf.distribute` that works,
and tools that measure and plan memory. TensorFlow + Keras 3.
"""

__version__ = "0.1.0.dev0"

# --- distribution (issue 6) -----------------------------------------------
from tfmemopt import distribute  # noqa: E402

# --- memory tools (shared) ------------------------------------------------
from tfmemopt import memory  # noqa: E402
from tfmemopt._wrapped import WrappedModel  # noqa: E402,I001

# --- mixed precision and advice (issue 5) ---------------------------------
from tfmemopt import mixed_precision  # noqa: E402
from tfmemopt.advice import check_alignment  # noqa: E402
from tfmemopt.advice import check_precision  # noqa: E402
from tfmemopt.findings import pad_to_multiple  # noqa: E402

# --- memory monitor callback (issue 7) -----------------------------------
from tfmemopt import callbacks  # noqa: E402

# --- exact gradient accumulation (issue 2) --------------------------------
from tfmemopt.model import Model  # noqa: E402

# --- accumulation across steps (issue 3) ---------------------------------
from tfmemopt.accumulating_optimizer import AccumulatingOptimizer  # noqa: E402

# --- activation checkpointing (issue 4) -----------------------------------
from tfmemopt import checkpointing  # noqa: E402
from tfmemopt.checkpointing import CheckpointBlock  # noqa: E402
from tfmemopt.checkpointing import disable_checkpointing  # noqa: E402
from tfmemopt.checkpointing import enable_checkpointing  # noqa: E402

# --- memory estimator (issue 8) ------------------------------------------
from tfmemopt.estimate import MemoryEstimate  # noqa: E402
from tfmemopt.estimate import estimate_memory  # noqa: E402

# --- batch-size finder and OOM report (issue 9) ---------------------------
from tfmemopt.batch_size import find_batch_size  # noqa: E402
from tfmemopt.batch_size import suggest_accumulation  # noqa: E402
from tfmemopt.oom import oom_report  # noqa: E402
from tfmemopt.planner import Plan  # noqa: E402
from tfmemopt.planner import plan  # noqa: E402

__all__ = [
    "__version__",
    "callbacks",
    "memory",
    "distribute",
    "Model",
    "WrappedModel",
    "mixed_precision",
    "check_precision",
    "check_alignment",
    "pad_to_multiple",
    "estimate_memory",
    "MemoryEstimate",
    "AccumulatingOptimizer",
    "checkpointing",
    "CheckpointBlock",
    "enable_checkpointing",
    "disable_checkpointing",
    "find_batch_size",
    "suggest_accumulation",
    "oom_report",
    "plan",
    "Plan",
]
