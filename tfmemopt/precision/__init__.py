"""Mixed precision chosen for the hardware, checks and alignment advice.

`configure()` picks and sets Keras's dtype policy for the hardware found
(the one place in tfmemopt that sets it) and can put the previous one back;
`check_precision` and `check_alignment` look at a built model and say what
runs in the wrong precision or at a tensor-unfriendly size.

`tfmemopt.mixed_precision`, the 0.1 name, is the module behind
`configure()` (`tfmemopt.precision._mixed_precision`); its names are all
here too.
"""

from tfmemopt.precision._advice import check_alignment
from tfmemopt.precision._advice import check_precision
from tfmemopt.precision._findings import Finding
from tfmemopt.precision._findings import Findings
from tfmemopt.precision._findings import pad_to_multiple
from tfmemopt.precision._mixed_precision import POLICIES
from tfmemopt.precision._mixed_precision import Hardware
from tfmemopt.precision._mixed_precision import PrecisionConfig
from tfmemopt.precision._mixed_precision import choose_policy
from tfmemopt.precision._mixed_precision import configure
from tfmemopt.precision._mixed_precision import detect_hardware

__all__ = [
    "POLICIES",
    "Finding",
    "Findings",
    "Hardware",
    "PrecisionConfig",
    "check_alignment",
    "check_precision",
    "choose_policy",
    "configure",
    "detect_hardware",
    "pad_to_multiple",
]
