from typing import Any

import kubernetes_validate
import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.devices.gpus import whole_gpu_inventory
from dra_driver.devices.model import Version, bytes_quantity, device_to_api, semantic_version
from dra_driver.hardware.simulated import node_profiles, resolve_node_spec, simulated_gpus

KUBERNETES_VERSIONS = ["1.34.0", "1.35.0", "1.36.0", "1.37.0"]


def slice_of(devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu-dra-driver-dev-abcde"},
        "spec": {
            "driver": DEFAULT_DRIVER_NAME,
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 0, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@pytest.mark.parametrize("kubernetes", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("profile", sorted(node_profiles()))
def test_whole_gpu_devices_are_valid_resource_slice_devices(profile: str, kubernetes: str) -> None:
    inventory = whole_gpu_inventory(simulated_gpus("node-a", resolve_node_spec(profile)))
    kubernetes_validate.validate(
        slice_of([device_to_api(d) for d in inventory.devices]), kubernetes, strict=True
    )


def test_a_whole_gpu_carries_the_documented_attributes_and_capacity() -> None:
    gpu = simulated_gpus("node-a", resolve_node_spec("dgx-h100"))[3]
    device = whole_gpu_inventory((gpu,)).devices[0]

    assert device.name == "gpu-3"
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
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "resource.kubernetes.io/pciBusID": {"string": gpu.pci_bus_id},
            "resource.kubernetes.io/pcieRoot": {"string": gpu.pcie_root},
            "type": {"string": "gpu"},
            "uuid": {"string": gpu.uuid},
        },
        "capacity": {"memory": {"value": "81559Mi"}, "multiprocessors": {"value": "132"}},
    }


def test_inventory_is_sorted_by_name_and_maps_devices_to_gpus() -> None:
    gpus = simulated_gpus("n", resolve_node_spec("dgx-h100"))
    inventory = whole_gpu_inventory(tuple(reversed(gpus)))
    assert [d.name for d in inventory.devices] == sorted(f"gpu-{i}" for i in range(8))
    assert inventory.gpu_of_device["gpu-5"] is gpus[5]


@pytest.mark.parametrize(
    ("dotted", "semver"),
    [("580.95.05", "580.95.5"), ("9.0", "9.0.0"), ("13", "13.0.0"), ("535.104.05.1", "535.104.5")],
)
def test_nvidia_versions_become_semantic_versions(dotted: str, semver: str) -> None:
    assert semantic_version(dotted) == Version(semver)


@pytest.mark.parametrize(
    ("value", "quantity"),
    [
        (81559 * 2**20, "81559Mi"),
        (80 * 2**30, "80Gi"),
        (2**40, "1Ti"),
        (1536, "1536"),
        (3 * 1024, "3Ki"),
        (0, "0"),
    ],
)
def test_byte_counts_become_exact_quantities(value: int, quantity: str) -> None:
    assert bytes_quantity(value) == quantity
