"""The device model: what each kind of device looks like, and that names parse back."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.model import Version, device_to_api, quantity, semantic_version
from dra_driver.devices.naming import (
    MigName,
    VgpuPartitionName,
    WholeGpuName,
    mig_profile_token,
    natural_key,
    parse_device_name,
)
from dra_driver.devices.node_config import Enforcement, GpuEntry, GpuSettings, NodeConfig, VgpuPartitionSize
from tests.support.nodes import GIB, all_profiles, mode_configs, simulated_node


def test_a_whole_gpu_carries_the_documented_attributes_and_capacity() -> None:
    gpu = simulated_node("dgx-h100")[3]
    device = node_inventory((gpu,), NodeConfig()).devices[0]

    assert device_to_api(device) == {
        "name": "gpu-3",
        "attributes": {
            "architecture": {"string": "Hopper"},
            "brand": {"string": "Nvidia"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "driverVersion": {"version": "580.95.5"},
            "index": {"int": 3},
            "minor": {"int": 3},
            "numaNode": {"int": 0},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "resource.kubernetes.io/pciBusID": {"string": gpu.pci_bus_id},
            "resource.kubernetes.io/numaNode": {"int": 0},
            "resource.kubernetes.io/pcieRoot": {"string": gpu.pcie_root},
            "type": {"string": "gpu"},
            "uuid": {"string": gpu.uuid},
        },
        "capacity": {"memory": {"value": "81559Mi"}, "multiprocessors": {"value": "132"}},
    }


def test_nvlink_cliques_are_published_where_the_hardware_reports_one() -> None:
    with_clique = node_inventory(simulated_node("gb200x4"), NodeConfig())
    without = node_inventory(simulated_node("dgx-h100"), NodeConfig())

    cliques = {device.attributes["fabricClique"] for device in with_clique.devices}
    assert len(cliques) == 1
    assert all("fabricClique" not in device.attributes for device in without.devices)


def test_dynamic_mig_offers_every_placement_of_every_profile_and_no_whole_gpu() -> None:
    gpus = simulated_node("dgx-h100-mig")
    inventory = node_inventory(gpus, mode_configs(gpus)["mig-dynamic"])

    per_gpu = sum(len(profile.placements) for profile in gpus[0].mig_profiles)
    assert len(inventory.devices) == 8 * per_gpu
    assert {device.type for device in inventory.devices} == {"mig"}
    assert len(inventory.counter_sets) == 8
    three_g = inventory.device_by_name["gpu-0-mig-3g40gb-4"]
    assert three_g.attributes["profile"] == "3g.40gb"
    assert three_g.capacity["memory"].value == 40448 * 2**20
    (consumption,) = three_g.consumes_counters
    assert consumption.counter_set == "gpu-0"
    assert {name for name in consumption.counters if name.startswith("memory-slice-")} == {
        f"memory-slice-{index}" for index in range(4, 8)
    }


def test_dynamic_mig_can_be_limited_to_some_profiles() -> None:
    gpu = simulated_node("dgx-h100-mig")[0]
    config = NodeConfig(
        gpus=(GpuEntry("gpus[0]", 0, None, GpuSettings(mode="mig-dynamic", mig_profiles=("3g.40gb",))),)
    )
    names = [device.name for device in node_inventory((gpu,), config).devices]
    assert sorted(names) == ["gpu-0-mig-3g40gb-0", "gpu-0-mig-3g40gb-4"]


def test_static_mig_publishes_the_existing_instances_with_their_uuids() -> None:
    gpus = simulated_node("mixed")
    inventory = node_inventory(gpus, NodeConfig())
    static_gpu = next(gpu for gpu in gpus if gpu.mig_instances)
    devices = [device for device in inventory.devices if inventory.gpu_of_device[device.name] == static_gpu]

    assert sorted(str(device.attributes["uuid"]) for device in devices) == sorted(
        instance.uuid for instance in static_gpu.mig_instances
    )
    assert all(device.type == "mig" and not device.consumes_counters for device in devices)
    assert all(device.attributes["parentUUID"] == static_gpu.uuid for device in devices)
    empty = [gpu for gpu in gpus if gpu.mig_mode.value == "enabled" and not gpu.mig_instances]
    assert [note.split(" (")[0] for note in inventory.notes] == [f"GPU {gpu.index}" for gpu in empty]
    assert all("in MIG mode without MIG instances, so it offers nothing" in note for note in inventory.notes)


def test_capacity_mode_shares_memory_and_cores_and_defaults_to_the_whole_gpu() -> None:
    gpu = simulated_node("l4x8")[0]
    config = NodeConfig(default=GpuSettings(mode="vgpu-capacity", memory_step=GIB))
    (device,) = node_inventory((gpu,), config).devices

    rendered = device_to_api(device)
    assert rendered["allowMultipleAllocations"] is True
    assert rendered["attributes"]["type"] == {"string": "vgpu"}
    assert rendered["capacity"] == {
        "cores": {
            "value": "100",
            "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
        },
        "memory": {
            "value": "23034Mi",
            "requestPolicy": {"default": "22Gi", "validRange": {"min": "1Gi", "max": "22Gi", "step": "1Gi"}},
        },
        # Under the default vgpu.enforcement, mps: the MPS server's 48 clients, one per share
        # unless the share asks for more.
        "clients": {
            "value": "48",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "48", "step": "1"}},
        },
    }


@pytest.mark.parametrize("enforcement", ["hami-core", "none"])
def test_capacity_mode_counts_no_clients_where_no_mps_server_holds_the_shares(
    enforcement: Enforcement,
) -> None:
    gpu = simulated_node("l4x8")[0]
    config = NodeConfig(default=GpuSettings(mode="vgpu-capacity", memory_step=GIB, enforcement=enforcement))
    (device,) = node_inventory((gpu,), config).devices

    assert sorted(device.capacity) == ["cores", "memory"]


def test_partitions_mode_offers_fixed_sizes_and_the_whole_gpu_on_shared_counters() -> None:
    gpu = simulated_node("l4x8")[0]
    config = NodeConfig(
        default=GpuSettings(
            mode="vgpu-partitions", partitions=(VgpuPartitionSize(10 * GIB), VgpuPartitionSize(4 * GIB, 20))
        )
    )
    inventory = node_inventory((gpu,), config)

    # Smallest partitions first, the whole GPU last (devices.order, binpack).
    assert [device.name for device in inventory.devices] == [
        "gpu-0-vgpu-4gi-0",
        "gpu-0-vgpu-4gi-1",
        "gpu-0-vgpu-4gi-2",
        "gpu-0-vgpu-4gi-3",
        "gpu-0-vgpu-4gi-4",
        "gpu-0-vgpu-10gi-0",
        "gpu-0-vgpu-10gi-1",
        "gpu-0",
    ]
    (counter_set,) = inventory.counter_sets
    # Under the default vgpu.enforcement, mps, each partition is one of the MPS server's clients.
    assert counter_set.counters == {"memory": gpu.memory_bytes, "cores": 100, "clients": 48}
    ten = inventory.device_by_name["gpu-0-vgpu-10gi-1"]
    assert ten.capacity["cores"].value == 100 * 10 * GIB // gpu.memory_bytes
    assert ten.consumes_counters[0].counters == {
        "memory": 10 * GIB,
        "cores": ten.capacity["cores"].value,
        "clients": 1,
    }
    # The whole GPU is nobody's MPS client: memory and cores already keep it apart from partitions.
    assert inventory.device_by_name["gpu-0"].consumes_counters[0].counters == {
        "memory": gpu.memory_bytes,
        "cores": 100,
    }


def test_partitions_mode_counts_no_clients_without_mps() -> None:
    gpu = simulated_node("l4x8")[0]
    config = NodeConfig(
        default=GpuSettings(
            mode="vgpu-partitions", partitions=(VgpuPartitionSize(4 * GIB),), enforcement="none"
        )
    )
    inventory = node_inventory((gpu,), config)

    (counter_set,) = inventory.counter_sets
    assert counter_set.counters == {"memory": gpu.memory_bytes, "cores": 100}
    assert all("clients" not in device.consumes_counters[0].counters for device in inventory.devices)


@pytest.mark.parametrize("profile", all_profiles())
def test_every_device_name_parses_back_to_what_it_stands_for(profile: str) -> None:
    gpus = simulated_node(profile)
    for config in mode_configs(gpus).values():
        inventory = node_inventory(gpus, config)
        for device in inventory.devices:
            gpu = inventory.gpu_of_device[device.name]
            parsed = parse_device_name(device.name)
            assert parsed is not None and parsed.minor == gpu.minor, device.name
            if isinstance(parsed, MigName):
                assert parsed.profile_token == mig_profile_token(str(device.attributes["profile"]))
                assert parsed.start == device.attributes["placementStart"]
            elif isinstance(parsed, VgpuPartitionName):
                assert device.type == "vgpu" and not device.allow_multiple_allocations
                assert parsed.size_token == quantity(device.capacity["memory"].value).lower()
            else:
                assert device.type in ("gpu", "vgpu") and parsed == WholeGpuName(gpu.minor)


@pytest.mark.parametrize(
    ("profile", "token"),
    [
        ("1g.10gb", "1g10gb"),
        ("1g.10gb+me", "1g10gb-me"),
        ("1g.24gb+me.all", "1g24gb-meall"),
        ("1g.24gb-me", "1g24gb-no-me"),
    ],
)
def test_profile_tokens_keep_suffixes_apart(profile: str, token: str) -> None:
    assert mig_profile_token(profile) == token


@given(st.lists(st.integers(min_value=0, max_value=300), min_size=1, unique=True))
def test_names_sort_by_gpu_number_not_by_text(minors: list[int]) -> None:
    names = [f"gpu-{minor}" for minor in minors]
    assert sorted(names, key=natural_key) == [f"gpu-{minor}" for minor in sorted(minors)]


def test_names_that_are_not_ours_do_not_parse() -> None:
    for name in ("gpu", "gpu-01", "gpu-0-mig-1g10gb", "gpu-0-vgpu-10gi", "cpu-0", "gpu-0-mig--0"):
        assert parse_device_name(name) is None, name


@pytest.mark.parametrize(
    ("dotted", "semver"),
    [("580.95.05", "580.95.5"), ("9.0", "9.0.0"), ("13", "13.0.0"), ("535.104.05.1", "535.104.5")],
)
def test_nvidia_versions_become_semantic_versions(dotted: str, semver: str) -> None:
    assert semantic_version(dotted) == Version(semver)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (81559 * 2**20, "81559Mi"),
        (80 * 2**30, "80Gi"),
        (2**40, "1Ti"),
        (1536, "1536"),
        (1000, "1k"),
        (5 * 10**6, "5M"),
        (100, "100"),
        (3 * 1024, "3Ki"),
        (0, "0"),
    ],
)
def test_counts_become_exact_quantities(value: int, text: str) -> None:
    assert quantity(value) == text


def test_a_gpu_without_numa_affinity_has_no_numa_attribute() -> None:
    gpu = replace(simulated_node("t4x4")[0], numa_node=None)
    (device,) = node_inventory((gpu,), NodeConfig()).devices
    assert "numaNode" not in device.attributes
    assert "resource.kubernetes.io/numaNode" not in device.attributes


def test_an_unknown_sm_count_is_left_out_rather_than_published_as_zero() -> None:
    gpu = replace(simulated_node("t4x4")[0], multiprocessors=0)
    for mode in ("gpu", "vgpu-capacity"):
        (device,) = node_inventory((gpu,), NodeConfig(default=GpuSettings(mode=mode))).devices
        assert "multiprocessors" not in device.capacity and "multiprocessors" not in device.attributes


def test_static_instances_nothing_can_run_on_are_left_out_with_a_note() -> None:
    gpu = next(gpu for gpu in simulated_node("mixed") if gpu.mig_instances)
    first, second, *_ = gpu.mig_instances
    bare = replace(first, uuid="", compute_instance_id=-1, compute_slices=0, multiprocessors=0)
    split = (
        replace(second, compute_slices=1),
        replace(second, compute_instance_id=1, uuid="MIG-other", compute_slices=1),
    )
    foreign = replace(second, gpu_instance_id=99, profile_id=12345, uuid="MIG-foreign")
    odd = replace(gpu, mig_instances=(bare, *split, foreign))

    inventory = node_inventory((odd,), NodeConfig())

    assert inventory.devices == ()
    assert [note.split(" instance ")[-1] for note in inventory.notes] == [
        f"{first.gpu_instance_id} has no compute instance; not published",
        f"{second.gpu_instance_id} is split into several compute instances; not published",
        f"{second.gpu_instance_id} is split into several compute instances; not published",
        "99 has profile id 12345, which the GPU does not list; not published",
    ]
