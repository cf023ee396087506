"""Dynamic MIG counters admit exactly the sets of placements NVML lets coexist.

The scheduler allocates partitionable devices by summing counter consumption; the simulated
backend refuses instances the way NVML does (overlapping memory slices, instance limits, engine
totals). For every MIG model the two must agree, or the scheduler would hand out placements that
fail at prepare (or keep free ones from being used).
"""

import asyncio
import random
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.model import Device
from dra_driver.devices.naming import parse_device_name
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.hardware.catalog import gpu_models
from dra_driver.hardware.model import Gpu, HardwareError, HardwareErrorReason, Placement
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.simulated_nodes import SimulatedNodeSpec, resolve_node_spec

MIG_MODELS = sorted(key for key, model in gpu_models().items() if model.mig is not None)


@cache
def node_spec(model: str, directory: Path) -> SimulatedNodeSpec:
    """Read once per model: the spec is immutable, and parsing the file for each of the thousands
    of fresh GPUs the exhaustive test creates took half its time."""
    path = directory / f"{model}.yaml"
    path.write_text(f"gpus: [{{model: {model}, count: 1, migMode: enabled}}]\n")
    return resolve_node_spec(str(path))


@cache
def placement_devices(model: str, directory: Path) -> tuple[Gpu, tuple[Device, ...], dict[str, int]]:
    (gpu,) = asyncio.run(SimulatedBackend("node-a", node_spec(model, directory)).discover())
    inventory = node_inventory((gpu,), NodeConfig(default=GpuSettings(mode="mig-dynamic")))
    (counter_set,) = inventory.counter_sets
    return gpu, inventory.devices, dict(counter_set.counters)


def placement_number(device: Device, attribute: str) -> int:
    value = device.attributes[attribute]
    assert isinstance(value, int)
    return value


def counters_admit(devices: list[Device], totals: dict[str, int]) -> bool:
    used: Counter[str] = Counter()
    for device in devices:
        (consumption,) = device.consumes_counters
        used.update(consumption.counters)
    return all(used[name] <= totals[name] for name in used)


async def nvml_admits(model: str, directory: Path, gpu: Gpu, devices: list[Device]) -> bool:
    """Creates the instances one by one on a fresh simulated GPU; True if every one succeeds."""
    return await creates_all(SimulatedBackend("node-a", node_spec(model, directory)), gpu, devices)


async def creates_all(backend: SimulatedBackend, gpu: Gpu, devices: list[Device]) -> bool:
    """Creates the placements' instances one by one; True if NVML lets every one be."""
    for device in devices:
        profile = next(p for p in gpu.mig_profiles if p.name == device.attributes["profile"])
        start = placement_number(device, "placementStart")
        placement = Placement(start, placement_number(device, "placementSize"))
        assert parse_device_name(device.name) is not None
        try:
            await backend.create_mig_instance(gpu.uuid, profile.profile_id, placement)
        except HardwareError as error:
            assert error.reason is HardwareErrorReason.INSUFFICIENT_RESOURCES, error
            return False
    return True


def disjoint_families(devices: tuple[Device, ...]) -> list[list[Device]]:
    """Every set of placements whose memory slices do not overlap (where the hard cases are)."""
    families: list[list[Device]] = []

    def slices(device: Device) -> set[int]:
        start, size = placement_number(device, "placementStart"), placement_number(device, "placementSize")
        return set(range(start, start + size))

    def extend(chosen: list[Device], used: set[int], rest: tuple[Device, ...]) -> None:
        families.append(chosen)
        for position, device in enumerate(rest):
            if not slices(device) & used:
                extend([*chosen, device], used | slices(device), rest[position + 1 :])

    extend([], set(), devices)
    return families


@pytest.mark.parametrize("model", MIG_MODELS)
def test_counters_and_nvml_agree_on_every_set_of_non_overlapping_placements(
    model: str, tmp_path: Path
) -> None:
    gpu, devices, totals = placement_devices(model, tmp_path)
    families = disjoint_families(devices)
    shuffle = random.Random(model)

    async def check_every_family() -> None:  # one event loop: a loop per family cost as much as the check
        for family in families:
            order = shuffle.sample(family, len(family))
            assert counters_admit(family, totals) == await nvml_admits(model, tmp_path, gpu, order), [
                d.name for d in family
            ]

    asyncio.run(check_every_family())
    # Memory slices alone would admit every family; the engine counters must refuse some (two "+me").
    assert any(not counters_admit(family, totals) for family in families)


@settings(max_examples=300)
@given(
    model=st.sampled_from(MIG_MODELS), picks=st.lists(st.integers(min_value=0, max_value=1000), max_size=8)
)
def test_counters_and_nvml_agree_on_random_sets_of_placements(
    model: str, picks: list[int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tmp_path_factory.getbasetemp()
    gpu, devices, totals = placement_devices(model, directory)
    chosen = list(
        {devices[pick % len(devices)].name: devices[pick % len(devices)] for pick in picks}.values()
    )
    assert counters_admit(chosen, totals) == asyncio.run(nvml_admits(model, directory, gpu, chosen))
