"""What the health parts of the agent agree on: the health of each published device."""

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class HealthStatus(enum.Enum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    # Not known yet (e.g. before the first check); kubelet shows it as Unknown too.
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    status: HealthStatus
    # Unix seconds of the last change of `status`.
    since: float
    # Why, for operators and the kubelet stream (at most 1024 characters there).
    message: str = ""


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """The health of every device the node publishes, by device name, in pool `pool`."""

    pool: str
    devices: Mapping[str, DeviceHealth] = field(default_factory=dict)
