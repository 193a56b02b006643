"""Activation checkpointing that keeps gradients exact and saves memory.

`CheckpointBlock` wraps layers; `enable_checkpointing` applies it to a built
model in place and `disable_checkpointing` undoes it. See
docs/checkpointing.md.
"""

# Names imported here but not listed in __all__ are for tfmemopt's other
# packages, which import from a package, never from its private modules
# (tests/test_architecture.py); they are not public API.
from tfmemopt.checkpointing._apply import CheckpointReport
from tfmemopt.checkpointing._apply import checkpointing_report
from tfmemopt.checkpointing._apply import (
    connected_segments as connected_segments,
)
from tfmemopt.checkpointing._apply import disable_checkpointing
from tfmemopt.checkpointing._apply import enable_checkpointing
from tfmemopt.checkpointing._block import CheckpointBlock
from tfmemopt.checkpointing._policies import auto_segments as auto_segments
from tfmemopt.checkpointing._policies import (
    dominant_submodel as dominant_submodel,
)
from tfmemopt.checkpointing._policies import (
    held_blocks_and_holder as held_blocks_and_holder,
)
from tfmemopt.checkpointing._policies import select_layers as select_layers
from tfmemopt.checkpointing._policies import top_level as top_level

__all__ = [
    "CheckpointBlock",
    "CheckpointReport",
    "checkpointing_report",
    "disable_checkpointing",
    "enable_checkpointing",
]
