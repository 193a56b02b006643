"""Reading device and host memory: TF allocator statistics, NVML, psutil.

Only this subpackage reads allocator statistics; everything else asks it.
"""

# Names imported here but not listed in __all__ are for tfmemopt's other
# packages, which import from a package, never from its private modules
# (tests/test_architecture.py); they are not public API.
from tfmemopt.memory._device import MIB
from tfmemopt.memory._device import MemoryStatsUnavailable
from tfmemopt.memory._device import canonical_device as canonical_device
from tfmemopt.memory._device import device_memory
from tfmemopt.memory._device import host_rss_bytes
from tfmemopt.memory._device import local_devices
from tfmemopt.memory._device import measure_peak
from tfmemopt.memory._device import reset_peak
from tfmemopt.memory._device import stats_available
from tfmemopt.memory._nvml import nvml_available
from tfmemopt.memory._nvml import nvml_memory
from tfmemopt.memory._replicas import replica_devices

__all__ = [
    "MIB",
    "MemoryStatsUnavailable",
    "device_memory",
    "host_rss_bytes",
    "local_devices",
    "measure_peak",
    "nvml_available",
    "nvml_memory",
    "replica_devices",
    "reset_peak",
    "stats_available",
]
