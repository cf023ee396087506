"""The shipped DeviceClasses, and selectors users write, evaluated by a real CEL engine over every
device the driver produces for every simulated node profile and GPU mode."""

from functools import cache
from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.devices.classes import device_classes
from dra_driver.devices.extended_resources import (
    ExtendedResources,
    catalog_mig_profiles,
    mig_resource_name,
    vgpu_resource_name,
)
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.model import Device, device_to_api
from dra_driver.devices.node_config import NodeConfig
from dra_driver.devices.slices import MAX_ATTRIBUTES_AND_CAPACITIES
from tests.support.cel import selects
from tests.support.nodes import GIB, all_profiles, mode_configs, simulated_node

D = DEFAULT_DRIVER_NAME


@cache
def every_device() -> tuple[tuple[Device, dict[str, Any]], ...]:
    produced: dict[str, tuple[Device, dict[str, Any]]] = {}
    for profile in all_profiles():
        gpus = simulated_node(profile)
        for mode, config in mode_configs(gpus).items():
            for device in node_inventory(gpus, config).devices:
                produced[f"{profile}/{mode}/{device.name}"] = (device, device_to_api(device))
    return tuple(produced.values())


@pytest.mark.parametrize("device_class", device_classes(D), ids=lambda c: c["metadata"]["name"])
def test_each_class_selects_exactly_the_devices_of_its_kind(device_class: dict[str, Any]) -> None:
    (selector,) = device_class["spec"]["selectors"]
    # The sharing classes (gpu-time-sliced, gpu-mps) select whole GPUs.
    kind = device_class["metadata"]["name"].split(".")[0].split("-")[0]
    for device, rendered in every_device():
        assert selects(selector["cel"]["expression"], D, rendered) == (device.type == kind), device.name


def test_every_kind_of_device_is_produced() -> None:
    kinds = {
        (device.type, device.allow_multiple_allocations, bool(device.consumes_counters))
        for device, _ in every_device()
    }
    assert kinds >= {
        ("gpu", False, False),
        ("gpu", False, True),
        ("mig", False, False),
        ("mig", False, True),
        ("vgpu", True, False),
        ("vgpu", False, True),
    }


def test_selecting_by_product_name_finds_that_product_in_every_kind() -> None:
    expression = f'device.attributes["{D}"].productName == "NVIDIA H100 80GB HBM3"'
    chosen = [device for device, rendered in every_device() if selects(expression, D, rendered)]
    assert {device.attributes["productName"] for device in chosen} == {"NVIDIA H100 80GB HBM3"}
    assert {device.type for device in chosen} == {"gpu", "mig", "vgpu"}
    assert len(chosen) == sum(
        1 for d, _ in every_device() if d.attributes["productName"] == "NVIDIA H100 80GB HBM3"
    )


@pytest.mark.parametrize("gib", [10, 40, 80])
def test_selecting_by_memory_compares_quantities_not_text(gib: int) -> None:
    expression = f'device.capacity["{D}"].memory.compareTo(quantity("{gib}Gi")) >= 0'
    for device, rendered in every_device():
        assert selects(expression, D, rendered) == (device.capacity["memory"].value >= gib * GIB), device.name


def test_mig_profiles_and_compute_capability_select_as_users_expect() -> None:
    expression = (
        f'device.attributes["{D}"].type == "mig" && device.attributes["{D}"].profile == "1g.10gb" '
        f'&& device.attributes["{D}"].cudaComputeCapability.isGreaterThan(semver("8.9.0"))'
    )
    chosen = {device.name for device, rendered in every_device() if selects(expression, D, rendered)}
    assert chosen
    assert all("-mig-1g10gb-" in name for name in chosen)
    # H100 (9.0) has 1g.10gb; the A100-80GB 1g.10gb (8.0) must not be chosen.
    gpus_with_profile = {
        str(device.attributes["productName"])
        for device, rendered in every_device()
        if selects(expression, D, rendered)
    }
    assert gpus_with_profile == {"NVIDIA H100 80GB HBM3"}


def test_every_device_carries_the_topology_that_match_attribute_needs() -> None:
    """`matchAttribute: resource.kubernetes.io/pcieRoot` (or numaNode, fabricClique) only keeps
    devices together if every kind of device publishes it."""
    for device, rendered in every_device():
        assert "resource.kubernetes.io/pcieRoot" in rendered["attributes"], device.name
        assert "resource.kubernetes.io/numaNode" in rendered["attributes"], device.name
        assert "numaNode" in rendered["attributes"], device.name  # deprecated, kept for one release
        gpu_product = device.attributes["productName"]
        assert ("fabricClique" in device.attributes) == (gpu_product == "NVIDIA GB200"), device.name


# --- Extended-resource classes (--extended-resources) ----------------------------------------------


def _produced_profiles() -> set[str]:
    return {str(device.attributes["profile"]) for device, _ in every_device() if device.type == "mig"}


def _produced_partition_sizes() -> set[int]:
    return {
        device.capacity["memory"].value
        for device, _ in every_device()
        if device.type == "vgpu" and not device.allow_multiple_allocations
    }


@cache
def representatives() -> tuple[tuple[Device, dict[str, Any]], ...]:
    """One device per kind, GPU product, MIG profile, static or dynamic, and memory size: the
    2300 devices evaluated by 50 classes would take half a minute, and devices alike in all of
    these differ only in what no selector reads (GPU index, placement, slot)."""
    chosen: dict[tuple[object, ...], tuple[Device, dict[str, Any]]] = {}
    for device, rendered in every_device():
        key = (
            device.type,
            device.attributes.get("profile"),
            device.attributes["productName"],
            bool(device.consumes_counters),
            device.allow_multiple_allocations,
            device.capacity["memory"].value,
        )
        chosen.setdefault(key, (device, rendered))
    return tuple(chosen.values())


@cache
def extended_classes() -> tuple[dict[str, Any], ...]:
    extended = ExtendedResources(catalog_mig_profiles(), tuple(sorted(_produced_partition_sizes())))
    # Those naming a resource of their own, after the whole-GPU class (nvidia.com/gpu).
    return tuple(c for c in device_classes(D, extended) if "extendedResourceName" in c["spec"])[1:]


def test_the_simulated_profiles_cover_many_mig_profiles_and_partition_sizes() -> None:
    """Guards the tests below against passing over nothing."""
    assert {
        str(d.attributes["profile"]) for d, _ in representatives() if d.type == "mig"
    } == _produced_profiles()
    assert len(_produced_profiles()) >= 12
    assert {"1g.10gb", "1g.10gb+me", "3g.40gb", "7g.80gb"} <= _produced_profiles()
    assert len(_produced_partition_sizes()) >= 5


def test_each_mig_profile_class_selects_exactly_the_mig_devices_of_its_profile() -> None:
    for device_class in extended_classes():
        resource = device_class["spec"]["extendedResourceName"]
        if not resource.startswith("nvidia.com/mig-"):
            continue
        (selector,) = device_class["spec"]["selectors"]
        chosen = {
            device.name + "@" + str(device.attributes["parentUUID"])
            for device, rendered in representatives()
            if selects(selector["cel"]["expression"], D, rendered)
        }
        expected = {
            device.name + "@" + str(device.attributes["parentUUID"])
            for device, _ in representatives()
            if device.type == "mig" and mig_resource_name(str(device.attributes["profile"])) == resource
        }
        assert chosen == expected, resource


def test_each_partition_class_selects_exactly_the_partitions_of_its_size() -> None:
    for device_class in extended_classes():
        resource = device_class["spec"]["extendedResourceName"]
        if not resource.startswith("nvidia.com/vgpu-"):
            continue
        (selector,) = device_class["spec"]["selectors"]
        chosen = [
            device
            for device, rendered in representatives()
            if selects(selector["cel"]["expression"], D, rendered)
        ]
        assert chosen, resource
        assert all(device.type == "vgpu" and not device.allow_multiple_allocations for device in chosen)
        assert {vgpu_resource_name(device.capacity["memory"].value) for device in chosen} == {resource}
        assert len(chosen) == sum(
            1
            for device, _ in representatives()
            if device.type == "vgpu"
            and not device.allow_multiple_allocations
            and vgpu_resource_name(device.capacity["memory"].value) == resource
        )


def test_a_partition_as_large_as_a_shared_gpu_never_selects_the_shared_gpu() -> None:
    """Capacity mode publishes the whole GPU as a vgpu device whose memory is the GPU's: without
    the parentUUID check a partition class of that size would hand out a whole shared GPU."""
    shared = next(
        (device, rendered) for device, rendered in every_device() if device.allow_multiple_allocations
    )
    size = shared[0].capacity["memory"].value
    (device_class,) = [
        c for c in device_classes(D, ExtendedResources((), (size,))) if "extendedResourceName" in c["spec"]
    ][1:]
    expression = device_class["spec"]["selectors"][0]["cel"]["expression"]

    assert not selects(expression, D, shared[1])
    unguarded = expression.replace(f' && "parentUUID" in device.attributes["{D}"]', "")
    assert unguarded != expression
    assert selects(unguarded, D, shared[1])


# -- the standard NUMA attribute, across drivers ------------------------------------------------------

NIC_DRIVER = "nic.example.com"
NUMA = "resource.kubernetes.io/numaNode"


def nic(name: str, numa_node: int) -> dict[str, Any]:
    """A device of a second driver (a NIC), as such a driver publishes it: only the standard
    topology attribute in common with ours."""
    return {"name": name, "attributes": {"type": {"string": "nic"}, NUMA: {"int": numa_node}}}


def match_attribute(attribute: str, *devices: tuple[str, dict[str, Any]]) -> bool:
    """The scheduler's `matchAttribute` check on a candidate set: every device has the attribute
    (a fully qualified name, or a bare one in the device's own driver's domain) and all values
    are equal."""
    values = []
    for driver, device in devices:
        domain, _, short = attribute.rpartition("/")
        name = short if domain == driver else attribute
        value = device["attributes"].get(name)
        if value is None:
            return False
        values.append(value)
    return all(value == values[0] for value in values)


def allocations(
    gpu_selector: str, nics: list[dict[str, Any]], gpus: list[dict[str, Any]], attribute: str
) -> set[tuple[str, str]]:
    """(gpu, nic) pairs a claim with two requests (one GPU of ours by class selector, one NIC by
    driver) and one `matchAttribute` constraint over both could be allocated."""
    return {
        (gpu["name"], card["name"])
        for gpu in gpus
        if selects(gpu_selector, D, gpu)
        for card in nics
        if selects(f'device.driver == "{NIC_DRIVER}"', NIC_DRIVER, card)
        and match_attribute(attribute, (D, gpu), (NIC_DRIVER, card))
    }


def test_match_attribute_on_the_standard_numa_name_pairs_gpus_with_nics_of_their_numa_node() -> None:
    gpus = simulated_node("dgx-h100")
    rendered = [device_to_api(device) for device in node_inventory(gpus, NodeConfig()).devices]
    nics = [nic("nic-0", 0), nic("nic-1", 1)]
    gpu_class = next(c for c in device_classes(D) if c["metadata"]["name"].startswith("gpu."))
    gpu_selector = gpu_class["spec"]["selectors"][0]["cel"]["expression"]

    pairs = allocations(gpu_selector, nics, rendered, NUMA)

    numa_of_gpu = {f"gpu-{gpu.minor}": gpu.numa_node for gpu in gpus}
    assert pairs == {(gpu_name, f"nic-{numa}") for gpu_name, numa in numa_of_gpu.items()}
    assert set(numa_of_gpu.values()) == {0, 1}  # both NICs have partners
    # The driver-local name only exists on our devices: a constraint on it allocates nothing.
    assert allocations(gpu_selector, nics, rendered, f"{D}/numaNode") == set()


def test_a_selector_on_the_standard_numa_name_picks_the_devices_of_that_numa_node_in_every_kind() -> None:
    expression = 'device.attributes["resource.kubernetes.io"].numaNode == 1'
    chosen = [device for device, rendered in every_device() if selects(expression, D, rendered)]
    assert {device.type for device in chosen} == {"gpu", "mig", "vgpu"}
    assert len(chosen) == sum(1 for device, _ in every_device() if device.attributes.get(NUMA) == 1)
    assert all(device.attributes[NUMA] == device.attributes["numaNode"] == 1 for device in chosen)


def test_the_largest_device_stays_within_the_attribute_and_capacity_limit() -> None:
    """The API refuses a device with more than 32 attributes and capacities together; the
    standard NUMA attribute (and the partition type) each cost one of them."""
    largest, rendered = max(
        every_device(), key=lambda item: len(item[1]["attributes"]) + len(item[1].get("capacity", {}))
    )
    entries = len(rendered["attributes"]) + len(rendered.get("capacity", {}))
    assert entries <= MAX_ATTRIBUTES_AND_CAPACITIES, largest.name
    assert NUMA in rendered["attributes"], largest.name
