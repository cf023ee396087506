"""Prepare reads what a device stands for from its typed origin, never from its published
attributes: those are a contract with users and may be renamed or dropped for their sake."""

import pytest
from msgspec.structs import replace

from dra_driver.claims.claim_object import AllocatedDevice
from dra_driver.claims.claim_plan import PlannedDevice, plan_claim
from dra_driver.claims.effect_entries import MigInstanceEntry
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.opaque_config import GpuConfig, MigDeviceConfig, VgpuConfig
from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.model import AttributeValue, Device, device_to_api
from dra_driver.devices.node_config import NodeConfig
from dra_driver.devices.origins import DynamicMig, StaticMig, VgpuPartition, VgpuShare, WholeGpu
from tests.support.nodes import mode_configs, simulated_node

DRIVER = "gpu.dra-driver.dev"
POOL = "node-a"
REF = ClaimRef("default", "claim", "0b5d7a9e-2d6c-4d0e-9a57-3b1f0c2e8d41")
SHARE = "5f0c2a8e-7d1b-4c3a-9e6f-2b8d4a1c0e97"
_NODES = [("mixed", mode) for mode in mode_configs(simulated_node("mixed"))]


def _inventory(profile: str, mode: str) -> Inventory:
    """Under vgpu.enforcement hami-core, so that one claim may take every kind of device (a share
    under mps must be its claim's only device)."""
    gpus = simulated_node(profile)
    config = mode_configs(gpus)[mode]
    hami = replace(config.default, enforcement="hami-core")
    entries = tuple(
        replace(entry, settings=replace(entry.settings, enforcement="hami-core")) for entry in config.gpus
    )
    return node_inventory(gpus, NodeConfig(default=hami, gpus=entries))


def _results(inventory: Inventory) -> list[AllocatedDevice]:
    """One result per device, but one vGPU per GPU: a claim takes at most one share of a GPU."""
    shared_gpus: set[str] = set()
    results: list[AllocatedDevice] = []
    for device in inventory.devices:
        if device.type == "vgpu":
            gpu = inventory.gpu_of_device[device.name].uuid
            if gpu in shared_gpus:
                continue
            shared_gpus.add(gpu)
        results.append(
            AllocatedDevice(
                request=f"r{len(results)}",
                pool=POOL,
                device=device.name,
                share_id=SHARE if device.allow_multiple_allocations else None,
                position=len(results),
            )
        )
    return results


def _renamed(inventory: Inventory, rename: dict[str, str | None]) -> Inventory:
    """The same inventory with the published attributes renamed (or dropped, for None)."""

    def attributes(device: Device) -> dict[str, AttributeValue]:
        kept = {rename.get(name, name): value for name, value in device.attributes.items()}
        return {name: value for name, value in kept.items() if name is not None}

    devices = tuple(replace(device, attributes=attributes(device)) for device in inventory.devices)
    return replace(inventory, devices=devices, device_by_name={device.name: device for device in devices})


def _what_prepare_does(planned: tuple[PlannedDevice, ...]) -> list[tuple[object, ...]]:
    return [
        (d.name, d.gpu.uuid, type(d.config), d.create_mig, d.existing_mig, d.exclusive_key, d.cdi_name)
        for d in planned
    ]


# Every attribute prepare once read back, renamed; and then every attribute gone.
_RENAMES: list[dict[str, str | None]] = [
    {
        "type": "kind",
        "uuid": "id",
        "profileId": "migProfileId",
        "placementStart": "start",
        "parentUUID": "parent",
    },
]


@pytest.mark.parametrize(("profile", "mode"), _NODES)
@pytest.mark.parametrize("strip_all", [False, True])
def test_renaming_or_dropping_published_attributes_leaves_the_prepare_plan_unchanged(
    profile: str, mode: str, strip_all: bool
) -> None:
    inventory = _inventory(profile, mode)
    rename: dict[str, str | None] = (
        {name: None for device in inventory.devices for name in device.attributes}
        if strip_all
        else _RENAMES[0]
    )
    renamed = _renamed(inventory, rename)
    assert all("type" not in device_to_api(device)["attributes"] for device in renamed.devices), (
        "the renaming must reach the API rendering"
    )

    results = _results(inventory)
    before = plan_claim(REF, results, (), inventory, DRIVER, POOL)
    after = plan_claim(REF, results, (), renamed, DRIVER, POOL)

    assert _what_prepare_does(after) == _what_prepare_does(before)
    assert len(after) == len(results) > 0


def test_each_mode_records_the_facts_prepare_needs() -> None:
    dynamic = _inventory("mixed", "mig-dynamic")
    origins = {type(origin) for origin in dynamic.origin_of_device.values()}
    assert DynamicMig in origins
    name, origin = next((n, o) for n, o in dynamic.origin_of_device.items() if isinstance(o, DynamicMig))
    (planned,) = plan_claim(REF, [AllocatedDevice("r", POOL, name)], (), dynamic, DRIVER, POOL)
    assert planned.create_mig == MigInstanceEntry(
        origin.gpu.uuid, origin.profile.profile_id, origin.placement.start, origin.placement.size
    )
    assert isinstance(planned.config, MigDeviceConfig)
    # Admin access only watches: it creates nothing.
    (watching,) = plan_claim(
        REF, [AllocatedDevice("r", POOL, name, admin_access=True)], (), dynamic, DRIVER, POOL
    )
    assert watching.create_mig is None and watching.existing_mig is None

    static = _inventory("mixed", "default")
    static_origins = [o for o in static.origin_of_device.values() if isinstance(o, StaticMig)]
    assert static_origins, "the mixed node has static MIG instances"
    assert all(o.instance in o.gpu.mig_instances for o in static_origins)
    assert {type(o) for o in static.origin_of_device.values()} >= {WholeGpu, StaticMig}

    capacity = _inventory("mixed", "vgpu-capacity")
    shares = [o for o in capacity.origin_of_device.values() if isinstance(o, VgpuShare)]
    assert shares and all(o.memory_step > 0 for o in shares)

    partitions = _inventory("mixed", "vgpu-partitions")
    slots = {name: o for name, o in partitions.origin_of_device.items() if isinstance(o, VgpuPartition)}
    assert slots
    for name, slot in slots.items():
        device = partitions.device_by_name[name]
        assert device.capacity["memory"].value == slot.memory_bytes
        assert device.capacity["cores"].value == slot.cores
    (share,) = plan_claim(REF, [AllocatedDevice("r", POOL, next(iter(slots)))], (), partitions, DRIVER, POOL)
    assert isinstance(share.config, VgpuConfig)
    whole = next(n for n, o in partitions.origin_of_device.items() if isinstance(o, WholeGpu))
    (gpu,) = plan_claim(REF, [AllocatedDevice("r", POOL, whole)], (), partitions, DRIVER, POOL)
    assert isinstance(gpu.config, GpuConfig)


def test_the_log_name_of_a_mig_instance_comes_from_its_origin() -> None:
    dynamic = _inventory("mixed", "mig-dynamic")
    name, origin = next((n, o) for n, o in dynamic.origin_of_device.items() if isinstance(o, DynamicMig))
    found = dynamic.dynamic_mig_name(origin.gpu.uuid, origin.profile.profile_id, origin.placement.start)
    assert found == name
    assert dynamic.dynamic_mig_name("GPU-none", origin.profile.profile_id, origin.placement.start) is None
