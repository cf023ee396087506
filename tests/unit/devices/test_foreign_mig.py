"""Dynamic MIG on a GPU with instances none of our claims made (issue 48): they are offered as
static devices, no placement overlapping one is published, and the counters hold what they take,
so the scheduler allocates only what NVML then creates."""

import itertools
from pathlib import Path

import pytest
from msgspec.structs import replace

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.mig import mig_counter_set
from dra_driver.devices.model import Device
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.hardware.catalog import gpu_models
from dra_driver.hardware.model import Gpu, MigResources
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.simulated_nodes import SimulatedNodeSpec, resolve_node_spec
from tests.support.nodes import all_profiles, mode_configs, simulated_node
from tests.unit.devices.test_mig_counters import counters_admit, creates_all, placement_number

DYNAMIC = NodeConfig(default=GpuSettings(mode="mig-dynamic"))
# GPU 0 of the mixed node: 2g.20gb at 0, 1g.10gb at 2 and 3, 3g.40gb at 4, all made at boot.
HAND_MADE = simulated_node("mixed")[0]
MIG_MODELS = sorted(key for key, model in gpu_models().items() if model.mig is not None)


def with_instances(gpu: Gpu, *starts: int) -> Gpu:
    return replace(gpu, mig_instances=tuple(i for i in gpu.mig_instances if i.placement.start in starts))


def slices(device: Device) -> set[int]:
    start = placement_number(device, "placementStart")
    return set(range(start, start + placement_number(device, "placementSize")))


def test_placements_overlapping_a_foreign_instance_are_left_out_and_the_instance_is_offered() -> None:
    gpu = with_instances(HAND_MADE, 4)  # 3g.40gb on slices 4-7
    inventory = node_inventory((gpu,), DYNAMIC)

    dynamic = [device for device in inventory.devices if device.consumes_counters]
    assert dynamic
    assert all(slices(device) <= {0, 1, 2, 3} for device in dynamic)
    (static,) = [device for device in inventory.devices if not device.consumes_counters]
    (instance,) = gpu.mig_instances
    assert (static.name, static.attributes["uuid"]) == ("gpu-0-mig-3g40gb-4", instance.uuid)
    # The full-GPU profile overlaps every instance: it is not offered at all.
    assert all(device.attributes["profile"] != "7g.80gb" for device in inventory.devices)


def test_the_counters_lose_what_the_foreign_instances_take() -> None:
    gpu = with_instances(HAND_MADE, 0, 4)
    full = mig_counter_set(replace(gpu, mig_instances=())).counters
    reduced = mig_counter_set(gpu).counters

    taken = MigResources.total(p for p in gpu.mig_profiles if p.name in ("2g.20gb", "3g.40gb"))
    assert reduced["multiprocessors"] == full["multiprocessors"] - taken.multiprocessors
    assert reduced["memory"] == full["memory"] - taken.memory_bytes
    assert reduced["ofa-engines"] == full["ofa-engines"] - taken.ofa_engines
    assert [reduced[f"memory-slice-{index}"] for index in range(8)] == [0, 0, 1, 1, 0, 0, 0, 0]


def test_an_unusable_foreign_instance_is_not_offered_but_its_slices_stay_taken() -> None:
    (instance,) = with_instances(HAND_MADE, 4).mig_instances
    gpu = replace(HAND_MADE, mig_instances=(replace(instance, uuid="", compute_slices=0),))
    inventory = node_inventory((gpu,), DYNAMIC)

    assert all(device.consumes_counters and slices(device) <= {0, 1, 2, 3} for device in inventory.devices)
    assert any("has no compute instance; not published" in note for note in inventory.notes)


def test_a_gpu_without_foreign_instances_offers_every_placement() -> None:
    gpu = replace(HAND_MADE, mig_instances=())
    inventory = node_inventory((gpu,), DYNAMIC)

    assert len(inventory.devices) == sum(len(profile.placements) for profile in gpu.mig_profiles)
    counters = inventory.counter_sets[0].counters
    assert [counters[f"memory-slice-{index}"] for index in range(8)] == [1] * 8


@pytest.mark.parametrize(
    "profile", [p for p in all_profiles() if any(g.mig_instances for g in simulated_node(p))]
)
def test_a_static_device_and_a_placement_never_share_a_name(profile: str) -> None:
    gpus = simulated_node(profile)
    inventory = node_inventory(gpus, mode_configs(gpus)["mig-dynamic"])

    names = [device.name for device in inventory.devices]
    assert len(names) == len(set(names))
    assert any(not device.consumes_counters for device in inventory.devices if device.type == "mig")


def foreign_spec(model: str, profile: str, start: int, directory: Path) -> SimulatedNodeSpec:
    path = directory / f"{model}-{profile}-{start}.yaml"
    path.write_text(
        f"gpus: [{{model: {model}, count: 1, migMode: enabled, "
        f"migInstances: [{{profile: '{profile}', start: {start}}}]}}]\n"
    )
    return resolve_node_spec(str(path))


async def nvml_admits(spec: SimulatedNodeSpec, gpu: Gpu, devices: list[Device]) -> bool:
    """Creates the placements' instances next to the foreign one; True if NVML lets every one be."""
    return await creates_all(SimulatedBackend("node-a", spec), gpu, devices)


@pytest.mark.parametrize("model", MIG_MODELS)
async def test_counters_and_nvml_agree_with_a_foreign_instance_of_each_profile(
    model: str, tmp_path: Path
) -> None:
    """Every placement, and every pair, the counters admit beside an instance made by hand, NVML
    creates, and the other way round: engines the instance holds (a "+me" profile's OFA) too."""
    profiles = gpu_models()[model].mig
    assert profiles is not None

    for profile in profiles.profiles:
        spec = foreign_spec(model, profile.name, profile.placements[0].start, tmp_path)
        (gpu,) = await SimulatedBackend("node-a", spec).discover()
        inventory = node_inventory((gpu,), DYNAMIC)
        (counter_set,) = inventory.counter_sets
        totals = dict(counter_set.counters)
        dynamic = [device for device in inventory.devices if device.consumes_counters]
        families = [[d] for d in dynamic] + [list(pair) for pair in itertools.combinations(dynamic, 2)]
        for family in families:
            assert counters_admit(family, totals) == await nvml_admits(spec, gpu, family), (
                profile.name,
                [device.name for device in family],
            )
