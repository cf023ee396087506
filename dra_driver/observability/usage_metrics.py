"""GPU usage as Prometheus metrics: per GPU, and per claim, pod and container, as of the last
usage sample.

Apart from the other metrics because it is a different kind of metric: not counters and gauges
that the agent's parts update as things happen, but a collector that serves the whole of the
last sample at each scrape, from rows the usage sampler hands it (`usage.attribution`'s rows,
read through the Protocols here). Its labels follow dcgm-exporter's. Like `metrics.py`, it
imports nothing of the driver (the import contract in pyproject.toml).
"""

import threading
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric


class UsageGpu(Protocol):
    """The GPU a usage row is about: the labels both kinds of row open with (GPU_LABELS)."""

    @property
    def gpu(self) -> str: ...
    @property
    def uuid(self) -> str: ...
    @property
    def model(self) -> str: ...


class GpuUsageRow(UsageGpu, Protocol):
    """One GPU's usage (`usage.attribution.GpuRow`); utilization None: the hardware has no figure."""

    @property
    def memory_used_bytes(self) -> int: ...
    @property
    def memory_total_bytes(self) -> int: ...
    @property
    def utilization(self) -> float | None: ...
    @property
    def processes(self) -> int: ...


class ClaimUsageRow(UsageGpu, Protocol):
    """One claim's device as one pod's container uses it (`usage.attribution.ClaimRow`)."""

    @property
    def device(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def pod(self) -> str: ...
    @property
    def container(self) -> str: ...
    @property
    def claim(self) -> str: ...
    @property
    def memory_limit_bytes(self) -> int: ...
    @property
    def compute_limit(self) -> float: ...
    @property
    def memory_used_bytes(self) -> int | None: ...
    @property
    def utilization(self) -> float | None: ...


# dcgm-exporter's label names where they overlap (gpu, UUID, modelName, namespace, pod, container),
# so dashboards can join the two; `device` and `claim` are DRA's own.
GPU_LABELS = ("gpu", "UUID", "modelName")
CLAIM_LABELS = (*GPU_LABELS, "device", "namespace", "pod", "container", "claim")


def _gpu_values(row: UsageGpu) -> list[str]:
    return [row.gpu, row.uuid, row.model]


class UsageMetrics:
    """GPU usage by device and by claim, pod and container, as of the last sample.

    A collector rather than labelled gauges: each sample replaces the whole set in one assignment,
    so a scrape never sees half of one sample, and a claim or pod that is gone has no series left
    (the set of series is bounded by what is prepared now, not by what ever was).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._lock = threading.Lock()
        self._gpus: tuple[GpuUsageRow, ...] = ()
        self._claims: tuple[ClaimUsageRow, ...] = ()
        self.sample_errors = Counter(
            "dra_driver_usage_sample_errors",
            "Usage samples that could not read a source (nvml, podresources, cgroups)",
            ["source"],
            registry=registry,
        )
        for source in ("nvml", "podresources", "cgroups"):
            self.sample_errors.labels(source=source)
        self.sample_duration = Gauge(
            "dra_driver_usage_sample_duration_seconds",
            "How long the last usage sample took (NVML, kubelet and /proc reads together)",
            registry=registry,
        )
        self.last_sample = Gauge(
            "dra_driver_usage_last_sample_timestamp_seconds",
            "Unix time of the last completed usage sample",
            registry=registry,
        )
        registry.register(self)

    def publish(self, gpus: Iterable[GpuUsageRow], claims: Iterable[ClaimUsageRow]) -> None:
        gpu_rows, claim_rows = tuple(gpus), tuple(claims)
        with self._lock:
            self._gpus, self._claims = gpu_rows, claim_rows

    def describe(self) -> Iterator[Metric]:
        return self._families((), ())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            gpus, claims = self._gpus, self._claims
        return self._families(gpus, claims)

    @staticmethod
    def _families(gpus: tuple[GpuUsageRow, ...], claims: tuple[ClaimUsageRow, ...]) -> Iterator[Metric]:
        def family(name: str, text: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=list(labels))

        memory_used = family("dra_driver_gpu_memory_used_bytes", "GPU memory in use", GPU_LABELS)
        memory_total = family("dra_driver_gpu_memory_total_bytes", "GPU memory in all", GPU_LABELS)
        utilization = family(
            "dra_driver_gpu_utilization_ratio",
            "Fraction of the last sample period a kernel ran on the GPU (NVML utilization.gpu / 100)",
            GPU_LABELS,
        )
        processes = family("dra_driver_gpu_processes", "Compute processes running on the GPU", GPU_LABELS)
        for gpu in gpus:
            values = _gpu_values(gpu)
            memory_used.add_metric(values, gpu.memory_used_bytes)
            memory_total.add_metric(values, gpu.memory_total_bytes)
            processes.add_metric(values, gpu.processes)
            if gpu.utilization is not None:
                utilization.add_metric(values, gpu.utilization)
        claim_used = family(
            "dra_driver_claim_memory_used_bytes",
            "GPU memory the claim's processes on the device use (absent where they cannot be told apart)",
            CLAIM_LABELS,
        )
        claim_limit = family(
            "dra_driver_claim_memory_limit_bytes",
            "GPU memory the claim may use on the device: the vGPU share, the MIG size or the whole GPU",
            CLAIM_LABELS,
        )
        claim_utilization = family(
            "dra_driver_claim_utilization_ratio",
            "SM utilisation of the claim's processes (per-process NVML samples), or of the device "
            "when the claim is its only user",
            CLAIM_LABELS,
        )
        claim_compute = family(
            "dra_driver_claim_compute_limit_ratio",
            "Fraction of the GPU's compute the claim may use: the vGPU share's cores, the MIG "
            "instance's share of SMs, 1 for a whole GPU",
            CLAIM_LABELS,
        )
        for row in claims:
            values = [
                *_gpu_values(row),
                row.device,
                row.namespace,
                row.pod,
                row.container,
                row.claim,
            ]
            claim_limit.add_metric(values, row.memory_limit_bytes)
            claim_compute.add_metric(values, row.compute_limit)
            if row.memory_used_bytes is not None:
                claim_used.add_metric(values, row.memory_used_bytes)
            if row.utilization is not None:
                claim_utilization.add_metric(values, row.utilization)
        yield from (memory_used, memory_total, utilization, processes)
        yield from (claim_used, claim_limit, claim_utilization, claim_compute)
