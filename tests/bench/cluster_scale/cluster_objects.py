"""Making and clearing what every run needs on the cluster: the DeviceClasses, the fake Nodes,
a namespace with its ServiceAccount, the claim templates, and an empty pool between runs."""

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from dra_driver.devices.classes import device_classes
from tests.bench.cluster_scale import objects
from tests.bench.cluster_scale.api import CORE, RESOURCE, Api
from tests.bench.cluster_scale.fleet import node_name
from tests.bench.cluster_scale.needs import Need
from tests.bench.cluster_scale.publish import DRIVER

WAIT = 300.0
SLICES = f"{RESOURCE}/resourceslices"


async def wait_for(what: str, probe: Callable[[], Awaitable[bool]], within: float = WAIT) -> None:
    """Polls `probe` until it holds; TimeoutError naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while not await probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:.0f}s")
        await asyncio.sleep(0.1)


async def create_classes(api: Api) -> None:
    for device_class in device_classes(DRIVER):
        await api.create(f"{RESOURCE}/deviceclasses", device_class)


def _ready(node: Mapping[str, object]) -> bool:
    status = node.get("status")
    conditions = status.get("conditions", []) if isinstance(status, dict) else []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def add_nodes(api: Api, names: Iterable[str], kubelet_version: str) -> None:
    """Creates the Nodes that do not exist yet and waits until kwok has them all Ready."""
    wanted = list(names)
    listed = await api.get(f"{CORE}/nodes")
    existing = {item["metadata"]["name"] for item in (listed or {}).get("items", [])}
    missing = [name for name in wanted if name not in existing]
    for start in range(0, len(missing), 50):
        await asyncio.gather(
            *(
                api.create(f"{CORE}/nodes", objects.fake_node(name, kubelet_version))
                for name in missing[start : start + 50]
            )
        )

    async def all_ready() -> bool:
        found = await api.get(f"{CORE}/nodes")
        ready = {item["metadata"]["name"] for item in (found or {}).get("items", []) if _ready(item)}
        return set(wanted) <= ready

    await wait_for(f"{len(wanted)} kwok nodes Ready", all_ready)


async def set_node_count(api: Api, count: int, kubelet_version: str) -> None:
    """Exactly `count` fake Nodes, all Ready: the ones missing made, the ones beyond deleted."""
    listed = await api.get(f"{CORE}/nodes")
    names = sorted(item["metadata"]["name"] for item in (listed or {}).get("items", []))
    await asyncio.gather(*(api.delete(f"{CORE}/nodes/{name}") for name in names[count:]))
    await add_nodes(api, [node_name(index) for index in range(count)], kubelet_version)


async def clear_slices(api: Api) -> None:
    """No ResourceSlice of ours left: the next run's fleet starts from an empty pool."""
    await api.delete(SLICES, (("fieldSelector", f"spec.driver={DRIVER}"),), within=WAIT)

    async def none_left() -> bool:
        found = await api.get(f"{SLICES}?fieldSelector=spec.driver%3D{DRIVER}")
        return not (found or {}).get("items")

    await wait_for("our ResourceSlices deleted", none_left)


async def make_namespace_ready(api: Api, name: str) -> None:
    """Waits for the namespace's default ServiceAccount, without which no pod is admitted."""

    async def account() -> bool:
        return await api.get(f"{CORE}/namespaces/{name}/serviceaccounts/default") is not None

    await wait_for(f"namespace {name}'s default ServiceAccount", account)


async def make_namespace(api: Api, name: str, needs: Iterable[Need]) -> dict[Need, str]:
    """The namespace, once its default ServiceAccount exists, and one claim template per need."""
    await api.create(f"{CORE}/namespaces", objects.namespace(name))
    await make_namespace_ready(api, name)
    templates: dict[Need, str] = {}
    for need in dict.fromkeys(needs):
        template = f"need-{len(templates)}"
        await api.create(
            f"{RESOURCE}/namespaces/{name}/resourceclaimtemplates",
            objects.claim_template(template, need, DRIVER),
        )
        templates[need] = template
    return templates


async def drop_namespace(api: Api, name: str) -> None:
    """Every pod deleted at once, every claim gone (so their devices are free), then the namespace."""
    await api.delete(f"{CORE}/namespaces/{name}/pods", within=WAIT)

    async def no_claims() -> bool:
        found = await api.get(f"{RESOURCE}/namespaces/{name}/resourceclaims")
        return not (found or {}).get("items")

    await wait_for(f"namespace {name}'s claims deleted", no_claims)
    await api.delete(f"{CORE}/namespaces/{name}")
