"""Mixed precision chosen for the hardware, checks and alignment advice.

`configure()` picks and sets Keras's dtype policy for the hardware found
(the one place in tfmemopt that sets it) and can put the previous one back;
`check_precision` and `check_alignment` look at a built model and say what
runs in the wrong precision or at a tensor-unfriendly size.

`tfmemopt.mixed_precision`, the 0.1 name, is the module behind
`configure()` (`tfmemopt.precision._mixed_precision`); its names are all
here too.
"""

# Names imported here but not listed in __all__ are for tfmemopt's other
# packages, which import from a package, never from its private modules
# (tests/test_architecture.py); they are not public API.
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
from tfmemopt.precision._policy_clone import rebuilt_under as rebuilt_under
from tfmemopt.precision._policy_clone import swap_policy as swap_policy
from tfmemopt.precision._weights_16bit import (
    low_precision_update_findings as low_precision_update_findings,
)

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
