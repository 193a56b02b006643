"""What `auto_strategy` looks at, gathered in one injectable record.

Detection reads only local state: the active strategy, environment variables
and the devices TensorFlow lists. It never opens a connection; resolving a
TPU (which may contact a gRPC address) happens only in `auto_strategy`, and
only when the user or `TPU_NAME` asked for one or TPU devices are local.
"""

from __future__ import annotations

import dataclasses
import json
import os

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Environment:
    """A snapshot of what decides the strategy (all fields injectable).

    Args:
        active_strategy: `tf.distribute.Strategy` or `None`, the strategy of
            an enclosing `strategy.scope()`; `None` when there is none.
        tpu_name: String or `None`, the `TPU_NAME` environment variable.
        tpu_devices: Int, physical TPU devices visible to this process.
        tf_config: Dict, the parsed `TF_CONFIG` (empty when unset).
        gpus: Tuple of strings, the visible GPU device names.
    """

    active_strategy: object = None
    tpu_name: str | None = None
    tpu_devices: int = 0
    tf_config: dict = dataclasses.field(default_factory=dict)
    gpus: tuple = ()

    @property
    def cluster_workers(self) -> int:
        """Chief plus worker tasks listed in `TF_CONFIG`'s cluster."""
        cluster = self.tf_config.get("cluster", {}) or {}
        return len(cluster.get("worker", [])) + len(cluster.get("chief", []))

    @property
    def cluster_has_ps(self) -> bool:
        cluster = self.tf_config.get("cluster", {}) or {}
        return bool(cluster.get("ps"))


def parse_tf_config(raw: str | None) -> dict:
    """Parses a `TF_CONFIG` string; raises ValueError naming the problem."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(
            "The `TF_CONFIG` environment variable is not valid JSON "
            f"({e}). Received: TF_CONFIG={raw[:200]!r}. Expected e.g. "
            '{"cluster": {"worker": ["host1:port", "host2:port"]}, '
            '"task": {"type": "worker", "index": 0}}.'
        ) from None
    if not isinstance(value, dict):
        raise ValueError(
            "`TF_CONFIG` must be a JSON object with `cluster` and `task`. "
            f"Received: TF_CONFIG={raw[:200]!r}."
        )
    return value


def detect_environment() -> Environment:
    """Reads the local state that `auto_strategy` decides on.

    Cost: listing devices initialises TensorFlow's device list (once per
    process); nothing is sent over the network.
    """
    active = (
        tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    )
    return Environment(
        active_strategy=active,
        tpu_name=os.environ.get("TPU_NAME") or None,
        tpu_devices=len(tf.config.list_physical_devices("TPU")),
        tf_config=parse_tf_config(os.environ.get("TF_CONFIG")),
        gpus=tuple(d.name for d in tf.config.list_physical_devices("GPU")),
    )
