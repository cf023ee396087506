"""What the health parts of the agent agree on: the health of each published device."""

import enum
from collections.abc import Mapping

import msgspec


class HealthStatus(enum.Enum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    # Not known yet (e.g. before the first check); kubelet shows it as Unknown too.
    UNKNOWN = "unknown"


class DeviceHealth(msgspec.Struct, frozen=True):
    status: HealthStatus
    # Unix seconds of the last change of `status`.
    since: float
    # Why, for operators and the kubelet stream (at most 1024 characters there).
    message: str = ""


class NodeHealth(msgspec.Struct, frozen=True):
    """The health of every device the node publishes, by device name, in pool `pool`."""

    pool: str
    devices: Mapping[str, DeviceHealth] = msgspec.field(default_factory=dict)
