"""The node agent's Prometheus metrics, on a registry of its own.

A registry of our own (not the client's global one) keeps in-process tests independent: each
controller under test can be given a fresh one.
"""

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass
class PublishMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    slice_writes: Counter = field(init=False)
    slice_api_errors: Counter = field(init=False)
    api_features_missing: Gauge = field(init=False)

    def __post_init__(self) -> None:
        self.slice_writes = Counter(
            "dra_driver_resourceslice_writes",
            "ResourceSlice writes that the API server accepted, by verb",
            ["verb"],
            registry=self.registry,
        )
        self.slice_api_errors = Counter(
            "dra_driver_resourceslice_api_errors",
            "Failed ResourceSlice API calls, by verb and HTTP status (0 = no answer)",
            ["verb", "status"],
            registry=self.registry,
        )
        self.api_features_missing = Gauge(
            "dra_driver_api_feature_missing",
            "1 when the API server drops the fields of this DRA feature, so the driver falls back",
            ["feature"],
            registry=self.registry,
        )
