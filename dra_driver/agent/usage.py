"""The usage sampler, wired to the running agent: the platform's reader of usage, the claim
engine's records, the published devices and kubelet's PodResources socket."""

from collections.abc import Mapping

from dra_driver.agent.gpu_platform import Platform
from dra_driver.agent.pool import NodePool
from dra_driver.claims.engine import ClaimEngine
from dra_driver.config.settings import NodeSettings
from dra_driver.devices.inventory import Inventory
from dra_driver.hardware.usage import UsageReader
from dra_driver.observability.usage_metrics import UsageMetrics
from dra_driver.usage.attribution import DeviceFacts
from dra_driver.usage.facts import device_facts
from dra_driver.usage.pod_resources import PodResourcesClient
from dra_driver.usage.sampler import UsageSampler, UsageSources


class _FactsOfInventory:
    """Device facts of the pool's current inventory, rebuilt only when a new one is published."""

    def __init__(self, pool: NodePool) -> None:
        self._pool = pool
        self._inventory: Inventory | None = None
        self._facts: Mapping[str, DeviceFacts] = {}

    def __call__(self) -> Mapping[str, DeviceFacts]:
        inventory = self._pool.inventory
        if inventory is not self._inventory:
            self._inventory, self._facts = inventory, device_facts(inventory)
        return self._facts


def usage_sampler(
    settings: NodeSettings,
    platform: Platform,
    engine: ClaimEngine,
    pool: NodePool,
    metrics: UsageMetrics,
    reader: UsageReader | None = None,
) -> UsageSampler | None:
    """None when usage metrics are off (--usage-interval 0)."""
    if settings.usage_interval <= 0:
        return None
    sources = UsageSources(
        reader=reader or platform.usage_reader(),
        driver_name=settings.driver_name,
        claims=lambda: engine.prepared_claims.values(),  # noqa: PLW0108 - the dict is replaced per turn
        facts=_FactsOfInventory(pool),
        gpus=lambda: platform.gpus,
        pod_resources=PodResourcesClient(settings.pod_resources_socket),
        proc_root=settings.proc_root if settings.usage_processes else None,
        pod_logs_dir=settings.pod_logs_dir,
    )
    return UsageSampler(sources, metrics, settings.usage_interval)
