"""Activation checkpointing that keeps gradients exact and saves memory.

`CheckpointBlock` wraps layers; `enable_checkpointing` applies it to a built
model in place and `disable_checkpointing` undoes it. See
docs/checkpointing.md.
"""

from tfmemopt.checkpointing._apply import CheckpointReport
from tfmemopt.checkpointing._apply import checkpointing_report
from tfmemopt.checkpointing._apply import disable_checkpointing
from tfmemopt.checkpointing._apply import enable_checkpointing
from tfmemopt.checkpointing._block import CheckpointBlock

__all__ = [
    "CheckpointBlock",
    "CheckpointReport",
    "checkpointing_report",
    "disable_checkpointing",
    "enable_checkpointing",
]
