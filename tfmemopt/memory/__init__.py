"""Reading device and host memory: TensorFlow allocator statistics, psutil.

Only this subpackage reads allocator statistics; everything else asks it.
"""

from tfmemopt.memory._device import MIB
from tfmemopt.memory._device import MemoryStatsUnavailable
from tfmemopt.memory._device import device_memory
from tfmemopt.memory._device import host_rss_bytes
from tfmemopt.memory._device import local_devices
from tfmemopt.memory._device import measure_peak
from tfmemopt.memory._device import reset_peak
from tfmemopt.memory._device import stats_available

__all__ = [
    "MIB",
    "MemoryStatsUnavailable",
    "device_memory",
    "host_rss_bytes",
    "local_devices",
    "measure_peak",
    "reset_peak",
    "stats_available",
]
