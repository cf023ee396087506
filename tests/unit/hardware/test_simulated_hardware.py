import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from dra_driver.hardware.catalog import MigGeometry, gpu_models
from dra_driver.hardware.mig_rules import mig_rejection
from dra_driver.hardware.model import (
    HardwareError,
    HardwareErrorReason,
    MigInstance,
    MigMode,
    Placement,
)
from dra_driver.hardware.simulated import FAULT_OPERATIONS, SimulatedBackend, SimulatedEvent
from dra_driver.hardware.simulated_nodes import (
    MAX_SIMULATED_GPUS,
    node_profiles,
    parse_node_spec,
    resolve_node_spec,
    simulated_gpus,
)

REQUIRED_PROFILES = {
    "dgx-a100-40gb",
    "dgx-a100-80gb",
    "dgx-h100",
    "hgx-h200",
    "b200x8",
    "gb200x4",
    "a30x4",
    "l4x8",
    "t4x4",
    "dgx-h100-mig",
    "dgx-a100-80gb-mig",
    "b200x8-mig",
    "mixed",
}
# A100-SXM4-80GB profile ids.
ID_1G_10GB, ID_1G_10GB_ME, ID_2G_20GB, ID_3G_40GB, ID_7G_80GB = 19, 20, 14, 9, 0


def backend_for(raw: object, node_name: str = "n") -> SimulatedBackend:
    return SimulatedBackend(node_name, parse_node_spec(raw, "test node"))


def single_gpu(model: str, mig_mode: str = "enabled") -> SimulatedBackend:
    return backend_for({"gpus": [{"model": model, "count": 1, "migMode": mig_mode}]})


async def first_uuid(backend: SimulatedBackend) -> str:
    return (await backend.discover())[0].uuid


async def hardware_error(call: Awaitable[object]) -> HardwareError:
    """Awaits a backend call that must fail and returns its error."""
    with pytest.raises(HardwareError) as raised:
        await call
    return raised.value


# --- profiles and GPUs -------------------------------------------------------------------------


def test_the_packaged_profiles_are_the_documented_ones() -> None:
    assert set(node_profiles()) == REQUIRED_PROFILES


@pytest.mark.parametrize("profile", sorted(REQUIRED_PROFILES))
def test_every_profile_resolves_to_gpus_with_unique_identities(profile: str) -> None:
    spec = resolve_node_spec(profile)
    gpus = simulated_gpus("node-a", spec)
    count = sum(group.count for group in spec.groups)

    assert len(gpus) == count
    assert len({g.uuid for g in gpus}) == len({g.pci_bus_id for g in gpus}) == count
    assert [g.index for g in gpus] == [g.minor for g in gpus] == list(range(count))
    assert [g.numa_node for g in gpus] == [0] * (count // 2) + [1] * (count - count // 2)
    for gpu, group in zip(gpus, spec.group_of_each_gpu(), strict=True):
        assert gpu.uuid.startswith("GPU-")
        assert gpu.memory_bytes == group.model.memory_mib * 2**20
        assert gpu.mig_mode is group.mig_mode


@pytest.mark.parametrize(
    "profile", ["dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h200", "b200x8", "gb200x4", "a30x4"]
)
def test_the_whole_gpu_profiles_have_mig_capable_gpus_with_mig_disabled(profile: str) -> None:
    gpus = simulated_gpus("n", resolve_node_spec(profile))
    assert {gpu.mig_mode for gpu in gpus} == {MigMode.DISABLED}
    assert all(gpu.memory_slices > 0 and gpu.mig_profiles and not gpu.mig_instances for gpu in gpus)


@pytest.mark.parametrize("profile", ["l4x8", "t4x4"])
def test_gpus_without_mig_report_it_unsupported_and_no_geometry(profile: str) -> None:
    gpus = simulated_gpus("n", resolve_node_spec(profile))
    assert {(gpu.mig_mode, gpu.memory_slices, gpu.mig_profiles) for gpu in gpus} == {
        (MigMode.UNSUPPORTED, 0, ())
    }


def test_only_the_gb200_profile_reports_a_fabric_clique() -> None:
    cliques = {
        name: {gpu.fabric_clique for gpu in simulated_gpus("n", spec)}
        for name, spec in node_profiles().items()
    }
    assert cliques.pop("gb200x4") == {"5f2c1a9e-7b3d-4e8a-9c61-0d4b8e2f7a13.1"}
    assert set(map(frozenset, cliques.values())) == {frozenset({None})}


def test_the_dynamic_mig_profiles_start_with_mig_enabled_and_no_instances() -> None:
    for name, model in (("dgx-h100-mig", "NVIDIA H100 80GB HBM3"), ("b200x8-mig", "NVIDIA B200")):
        gpus = simulated_gpus("n", resolve_node_spec(name))
        assert {(gpu.product_name, gpu.mig_mode, gpu.mig_instances) for gpu in gpus} == {
            (model, MigMode.ENABLED, ())
        }
        assert len(gpus) == 8


def test_the_mixed_profile_has_every_gpu_state() -> None:
    gpus = simulated_gpus("n", resolve_node_spec("mixed"))
    summary = [
        (
            gpu.product_name,
            gpu.mig_mode,
            [(i.profile_id, i.placement.start, i.gpu_instance_id) for i in gpu.mig_instances],
        )
        for gpu in gpus
    ]
    balanced = [(ID_2G_20GB, 0, 1), (ID_1G_10GB, 2, 2), (ID_1G_10GB, 3, 3), (ID_3G_40GB, 4, 4)]
    a100 = "NVIDIA A100-SXM4-80GB"
    assert summary == [
        (a100, MigMode.ENABLED, balanced),
        (a100, MigMode.ENABLED, balanced),
        (a100, MigMode.ENABLED, []),
        (a100, MigMode.ENABLED, []),
        (a100, MigMode.DISABLED, []),
        (a100, MigMode.DISABLED, []),
        ("NVIDIA L4", MigMode.UNSUPPORTED, []),
        ("NVIDIA L4", MigMode.UNSUPPORTED, []),
    ]
    # mig-parted's all-balanced names, at placements NVML would have chosen.
    names = {p.profile_id: p.name for p in gpus[0].mig_profiles}
    assert sorted(names[i.profile_id] for i in gpus[0].mig_instances) == [
        "1g.10gb",
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
    ]
    assert gpus[0].mig_instances[3].placement == Placement(4, 4)
    assert gpus[0].mig_instances[0].uuid != gpus[1].mig_instances[0].uuid
    assert SimulatedBackend("n", resolve_node_spec("mixed")).description == (
        "simulated profile mixed: "
        "2x NVIDIA A100-SXM4-80GB (MIG enabled: 2g.20gb, 1g.10gb, 1g.10gb, 3g.40gb), "
        "2x NVIDIA A100-SXM4-80GB (MIG enabled), 2x NVIDIA A100-SXM4-80GB, 2x NVIDIA L4"
    )


def test_uuids_are_the_same_on_every_run_and_differ_between_nodes() -> None:
    spec = resolve_node_spec("dgx-h100")
    assert simulated_gpus("node-a", spec) == simulated_gpus("node-a", spec)
    assert {g.uuid for g in simulated_gpus("node-a", spec)}.isdisjoint(
        g.uuid for g in simulated_gpus("node-b", spec)
    )


def test_uuids_and_addresses_are_the_ones_earlier_releases_gave() -> None:
    """Claims prepared before an upgrade name these UUIDs; they must never change."""
    gpus = simulated_gpus("node-a", resolve_node_spec("dgx-h100"))
    assert (gpus[0].uuid, gpus[0].pci_bus_id, gpus[0].pcie_root) == (
        "GPU-0800c878-41ab-5532-b44f-fb3fb25fc2d7",
        "0000:18:00.0",
        "pci0000:00",
    )
    assert (gpus[7].uuid, gpus[7].pci_bus_id, gpus[7].pcie_root) == (
        "GPU-9bcc0053-7fc0-582a-ab7a-7f304b932934",
        "0000:6c:00.0",
        "pci0000:30",
    )
    mixed = simulated_gpus("node-a", resolve_node_spec("mixed"))
    assert mixed[0].uuid == "GPU-0800c878-41ab-5532-b44f-fb3fb25fc2d7"
    assert mixed[0].mig_instances[0].uuid == "MIG-17e620f1-c408-5319-b021-0c9657a13dd9"


# --- node files ---------------------------------------------------------------------------------


async def test_a_yaml_file_describes_a_custom_node(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        "driverVersion: '570.124.06'\n"
        "cudaDriverVersion: '12.8'\n"
        "fabricClique: 00000000-0000-0000-0000-000000000001.7\n"
        "gpus:\n"
        "  - model: H100-SXM5-80GB\n"
        "    count: 1\n"
        "    migMode: enabled\n"
        "    migInstances: [{profile: 3g.40gb, start: 4}]\n"
        "  - {model: L4, count: 2, migMode: disabled}\n"
    )

    backend = SimulatedBackend("n", resolve_node_spec(str(path)))
    gpus = await backend.discover()

    assert [g.product_name for g in gpus] == ["NVIDIA H100 80GB HBM3", "NVIDIA L4", "NVIDIA L4"]
    assert {(g.driver_version, g.cuda_driver_version, g.fabric_clique) for g in gpus} == {
        ("570.124.06", "12.8", "00000000-0000-0000-0000-000000000001.7")
    }
    assert [(i.profile_id, i.placement) for i in gpus[0].mig_instances] == [(ID_3G_40GB, Placement(4, 4))]
    assert [g.mig_mode for g in gpus] == [MigMode.ENABLED, MigMode.UNSUPPORTED, MigMode.UNSUPPORTED]
    assert backend.description == (
        f"simulated file {path}: 1x NVIDIA H100 80GB HBM3 (MIG enabled: 3g.40gb), 2x NVIDIA L4"
    )


A100 = "{model: A100-SXM4-80GB, count: 1, migMode: enabled, migInstances: [%s]}"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "gpus: [{model: Z100, count: 1}]",
            "field gpus[0].model: unknown GPU model 'Z100'; known models: A10, ",
        ),
        (
            "gpus: [{model: L4, count: 0}]",
            "field gpus[0].count: 0 is out of range; expected an integer from 1 to 16",
        ),
        (
            "gpus: [{model: L4, count: true}]",
            "field gpus[0].count: expected an integer from 1 to 16, got true",
        ),
        ("gpus: [{model: L4}]", "field gpus[0].count: required"),
        (
            "gpus: [{model: L4, count: 1, mig: all}]",
            "field gpus[0].mig: unknown field (allowed here: model, count",
        ),
        ("model: L4\ncount: 2\n", "field model, count: unknown fields (allowed here: driverVersion"),
        ("driverVersion: '580'\n", "field gpus: required"),
        ("gpus: []", "field gpus: expected a non-empty list of GPU groups, got a list"),
        ("gpus: {model: L4}", "field gpus: expected a non-empty list of GPU groups"),
        (
            "gpus: [L4]",
            "field gpus[0]: expected an object with fields model, count, migMode, migInstances, "
            'got the string "L4"',
        ),
        (
            "gpus: [{model: L4, count: 9}, {model: T4, count: 8}]",
            f"field gpus: 17 GPUs in all; a simulated node has at most {MAX_SIMULATED_GPUS}",
        ),
        (
            "gpus: [{model: L4, count: 1}, {model: L4, count: 1, migMode: enabled}]",
            "field gpus[1].migMode: model L4 does not support MIG; only 'disabled' is allowed",
        ),
        (
            "gpus: [{model: A30-24GB, count: 1, migMode: on}]",
            "field gpus[0].migMode: expected one of enabled, disabled, got true",
        ),
        (
            "gpus: [{model: A30-24GB, count: 1, migInstances: [{profile: 4g.24gb, start: 0}]}]",
            "field gpus[0].migInstances: pre-existing MIG instances need migMode: enabled",
        ),
        (
            "gpus: [{model: L4, count: 1, migInstances: [{profile: 1g.5gb, start: 0}]}]",
            "field gpus[0].migInstances: pre-existing MIG instances need migMode: enabled",
        ),
        (
            "gpus: [{model: A30-24GB, count: 1, migMode: enabled, migInstances: {profile: 4g.24gb}}]",
            "field gpus[0].migInstances: expected a list of {profile, start} mappings, got an object",
        ),
        (
            f"gpus: [{A100 % '{profile: 1g.5gb, start: 0}'}]",
            "field gpus[0].migInstances[0].profile: unknown MIG profile '1g.5gb'; "
            "this model's profiles: 1g.10gb, ",
        ),
        (
            f"gpus: [{A100 % '{profile: 3g.40gb, start: 2}'}]",
            "field gpus[0].migInstances[0].start: 2 is not a placement start of 3g.40gb; allowed: 0, 4",
        ),
        (
            f"gpus: [{A100 % '{profile: 3g.40gb, start: true}'}]",
            "field gpus[0].migInstances[0].start: expected an integer, got true",
        ),
        (
            f"gpus: [{A100 % '{profile: 3g.40gb}'}]",
            "field gpus[0].migInstances[0].start: required",
        ),
        (
            f"gpus: [{A100 % '{profile: 3g.40gb, start: 0, size: 4}'}]",
            "field gpus[0].migInstances[0].size: unknown field (allowed here: profile, start)",
        ),
        (
            "gpus: [{model: L4, count: 1}, "
            + A100 % "{profile: 3g.40gb, start: 4}, {profile: 1g.10gb, start: 5}"
            + "]",
            "field gpus[1].migInstances[1]: 1g.10gb at placement (start 5, size 1): "
            "its memory slices overlap the existing 3g.40gb instance at placement (start 4, size 4)",
        ),
        (
            f"gpus: [{A100 % '{profile: 1g.10gb+me, start: 0}, {profile: 1g.10gb+me, start: 1}'}]",
            "field gpus[0].migInstances[1]: 1g.10gb+me at placement (start 1, size 1): "
            "the GPU already has the most instances of this profile it allows (1)",
        ),
        (
            "gpus: [{model: A30-24GB, count: 1, migMode: enabled, "
            "migInstances: [{profile: 1g.6gb+me, start: 0}, {profile: 2g.12gb+me, start: 2}]}]",
            "field gpus[0].migInstances[1]: 2g.12gb+me at placement (start 2, size 2): together with the "
            "existing instances it needs more than the GPU has: jpeg engines 2 > 1, ofa engines 2 > 1",
        ),
        (
            "driverVersion: latest\ngpus: [{model: L4, count: 1}]",
            "field driverVersion: expected a dotted version",
        ),
        (
            "cudaDriverVersion: 13\ngpus: [{model: L4, count: 1}]",
            "field cudaDriverVersion: expected a dotted version",
        ),
        (
            "fabricClique: not-a-uuid.1\ngpus: [{model: L4, count: 1}]",
            "field fabricClique: expected '<cluster UUID>.<clique id>'",
        ),
        (
            "fabricClique: 00000000-0000-0000-0000-000000000001\ngpus: [{model: L4, count: 1}]",
            "field fabricClique: expected '<cluster UUID>.<clique id>'",
        ),
        (
            "- L4\n",
            "top level: expected an object with fields driverVersion, cudaDriverVersion, fabricClique, gpus",
        ),
        ("gpus: [{model: [L4\n", "not valid YAML"),
    ],
)
def test_bad_node_files_name_the_file_and_the_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(content)
    with pytest.raises(HardwareError) as raised:
        resolve_node_spec(str(path))
    assert str(raised.value).startswith(f"simulated node file {path}: ")
    assert message in str(raised.value)


def test_a_missing_file_and_an_unknown_profile_are_clear(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="cannot read it: No such file or directory"):
        resolve_node_spec(str(tmp_path / "absent.yaml"))
    with pytest.raises(
        HardwareError, match="unknown simulated node profile 'dgx-z'; known profiles: a30x4, "
    ):
        resolve_node_spec("dgx-z")


def test_catalog_models_carry_the_catalog_facts() -> None:
    h100 = gpu_models()["H100-SXM5-80GB"]
    assert (h100.product_name, h100.memory_mib, h100.multiprocessors) == ("NVIDIA H100 80GB HBM3", 81559, 132)
    assert h100.mig is not None
    assert (h100.mig.memory_slices, h100.mig.max_gpu_instances) == (8, 7)
    assert gpu_models()["L4"].mig is None


# --- MIG operations -----------------------------------------------------------------------------


async def test_create_gives_the_lowest_free_id_and_one_compute_instance_spanning_it() -> None:
    backend = single_gpu("A100-SXM4-80GB")
    gpu = await first_uuid(backend)

    first = await backend.create_mig_instance(gpu, ID_3G_40GB, Placement(0, 4))
    second = await backend.create_mig_instance(gpu, ID_1G_10GB, Placement(4, 1))
    await backend.destroy_mig_instance(gpu, first.gpu_instance_id)
    third = await backend.create_mig_instance(gpu, ID_2G_20GB, Placement(0, 2))

    assert (first.gpu_instance_id, second.gpu_instance_id, third.gpu_instance_id) == (1, 2, 1)
    assert first == MigInstance(
        uuid=first.uuid,
        profile_id=ID_3G_40GB,
        placement=Placement(0, 4),
        gpu_instance_id=1,
        compute_instance_id=0,
        compute_slices=3,
        multiprocessors=42,
    )
    assert first.uuid.startswith("MIG-")
    assert first.uuid != third.uuid
    assert (await backend.discover())[0].mig_instances == (third, second)


async def test_mig_uuids_are_stable_across_backends_of_the_same_node() -> None:
    async def create_one() -> str:
        backend = single_gpu("H100-SXM5-80GB")
        return (await backend.create_mig_instance(await first_uuid(backend), 19, Placement(3, 1))).uuid

    assert await create_one() == await create_one()


@pytest.mark.parametrize(
    ("profile_id", "placement", "reason", "detail"),
    [
        (
            ID_3G_40GB,
            Placement(2, 4),
            HardwareErrorReason.INVALID_ARGUMENT,
            "profile 3g.40gb (id 9) at placement (start 2, size 4): placement (start 2, size 4) is not "
            "one the profile has; its placements: (start 0, size 4), (start 4, size 4)",
        ),
        (
            ID_1G_10GB,
            Placement(0, 2),
            HardwareErrorReason.INVALID_ARGUMENT,
            "profile 1g.10gb (id 19) at placement (start 0, size 2): placement (start 0, size 2) is not one",
        ),
        (
            ID_7G_80GB,
            Placement(0, 8),
            HardwareErrorReason.INSUFFICIENT_RESOURCES,
            "its memory slices overlap the existing 2g.20gb instance at placement (start 0, size 2)",
        ),
        (
            ID_1G_10GB,
            Placement(3, 1),
            HardwareErrorReason.INSUFFICIENT_RESOURCES,
            "its memory slices overlap the existing 1g.10gb instance at placement (start 3, size 1)",
        ),
        (
            ID_1G_10GB_ME,
            Placement(2, 1),
            HardwareErrorReason.INSUFFICIENT_RESOURCES,
            "overlap the existing 1g.10gb instance",
        ),
        (
            42,
            Placement(0, 1),
            HardwareErrorReason.INVALID_ARGUMENT,
            "cannot create a GPU instance: profile id 42 is not a MIG profile of NVIDIA A100-SXM4-80GB; its "
            "profiles: 1g.10gb (id 19), 1g.10gb+me (id 20), ",
        ),
    ],
)
async def test_create_refuses_what_nvml_refuses_and_changes_nothing(
    profile_id: int, placement: Placement, reason: HardwareErrorReason, detail: str
) -> None:
    backend = SimulatedBackend("n", resolve_node_spec("mixed"))
    before = await backend.discover()

    error = await hardware_error(backend.create_mig_instance(before[0].uuid, profile_id, placement))

    assert error.reason is reason
    assert str(error).startswith(f"GPU 0 ({before[0].uuid}): cannot create a GPU instance")
    assert detail in str(error)
    assert await backend.discover() == before


async def test_create_refuses_a_profile_past_its_instance_limit() -> None:
    backend = single_gpu("A100-SXM4-80GB")
    gpu = await first_uuid(backend)
    await backend.create_mig_instance(gpu, ID_3G_40GB, Placement(0, 4))
    await backend.create_mig_instance(gpu, ID_3G_40GB, Placement(4, 4))
    await backend.destroy_mig_instance(gpu, 2)
    await backend.create_mig_instance(gpu, ID_1G_10GB_ME, Placement(4, 1))

    error = await hardware_error(backend.create_mig_instance(gpu, ID_1G_10GB_ME, Placement(5, 1)))

    assert error.reason is HardwareErrorReason.INSUFFICIENT_RESOURCES
    assert "the GPU already has the most instances of this profile it allows (1)" in str(error)


async def test_create_refuses_what_would_take_more_engines_than_the_gpu_has() -> None:
    backend = single_gpu("A30-24GB")
    gpu = await first_uuid(backend)
    await backend.create_mig_instance(gpu, 21, Placement(0, 1))  # 1g.6gb+me

    error = await hardware_error(backend.create_mig_instance(gpu, 6, Placement(2, 2)))  # 2g.12gb+me

    assert error.reason is HardwareErrorReason.INSUFFICIENT_RESOURCES
    assert str(error).endswith(
        "profile 2g.12gb+me (id 6) at placement (start 2, size 2): together with the existing instances it "
        "needs more than the GPU has: jpeg engines 2 > 1, ofa engines 2 > 1"
    )


def test_the_gpu_instance_limit_is_enforced_where_slices_would_allow_more() -> None:
    """No catalogued GPU can reach its instance limit with slices to spare, so the rule is
    checked on a geometry that can."""
    a100 = gpu_models()["A100-SXM4-80GB"].mig
    assert a100 is not None
    one_instance_only = MigGeometry(
        memory_slices=a100.memory_slices, max_gpu_instances=1, profiles=a100.profiles, capacity=a100.capacity
    )
    profile = a100.profile(ID_1G_10GB)
    assert profile is not None

    rejection = mig_rejection(one_instance_only, [(profile, Placement(0, 1))], profile, Placement(1, 1))

    assert rejection == (
        HardwareErrorReason.INSUFFICIENT_RESOURCES,
        "the GPU already has the most GPU instances it allows (1)",
    )
    assert mig_rejection(a100, [(profile, Placement(0, 1))], profile, Placement(1, 1)) is None


@pytest.mark.parametrize(
    ("gpu_index", "mode"), [(4, "disabled"), (6, "unsupported")], ids=["mig-disabled", "no-mig"]
)
async def test_mig_calls_on_a_gpu_without_mig_enabled_are_not_supported(gpu_index: int, mode: str) -> None:
    backend = SimulatedBackend("n", resolve_node_spec("mixed"))
    gpu = (await backend.discover())[gpu_index]

    created = await hardware_error(backend.create_mig_instance(gpu.uuid, ID_1G_10GB, Placement(0, 1)))
    destroyed = await hardware_error(backend.destroy_mig_instance(gpu.uuid, 1))

    assert (created.reason, destroyed.reason) == (HardwareErrorReason.NOT_SUPPORTED,) * 2
    assert str(created) == (
        f"GPU {gpu_index} ({gpu.uuid}): cannot create a GPU instance: MIG mode is {mode} on this GPU"
    )


async def test_calls_on_an_unknown_gpu_or_instance_are_not_found() -> None:
    backend = SimulatedBackend("n", resolve_node_spec("mixed"))
    gpu = (await backend.discover())[0].uuid

    unknown_gpu = await hardware_error(backend.create_mig_instance("GPU-nope", ID_1G_10GB, Placement(0, 1)))
    unknown_gpu_destroy = await hardware_error(backend.destroy_mig_instance("GPU-nope", 1))
    unknown_instance = await hardware_error(backend.destroy_mig_instance(gpu, 9))

    assert {unknown_gpu.reason, unknown_gpu_destroy.reason, unknown_instance.reason} == {
        HardwareErrorReason.NOT_FOUND
    }
    assert str(unknown_gpu) == "no GPU with UUID GPU-nope on this simulated node (8 GPUs)"
    assert str(unknown_instance) == (
        f"GPU 0 ({gpu}): cannot destroy GPU instance 9: no such instance "
        "(existing GPU instance ids: 1, 2, 3, 4)"
    )


async def test_concurrent_creates_of_one_placement_admit_exactly_one() -> None:
    backend = single_gpu("H100-SXM5-80GB")
    gpu = await first_uuid(backend)

    results: list[MigInstance | BaseException] = await asyncio.gather(
        *(backend.create_mig_instance(gpu, 9, Placement(4, 4)) for _ in range(8)), return_exceptions=True
    )

    assert sum(isinstance(result, MigInstance) for result in results) == 1
    assert {result.reason for result in results if isinstance(result, HardwareError)} == {
        HardwareErrorReason.INSUFFICIENT_RESOURCES
    }
    assert len((await backend.discover())[0].mig_instances) == 1


# --- fault injection ----------------------------------------------------------------------------


@pytest.mark.parametrize("operation", FAULT_OPERATIONS)
async def test_fail_next_fails_exactly_the_next_call(operation: str) -> None:
    backend = SimulatedBackend("n", resolve_node_spec("dgx-h100-mig"))
    gpu = await first_uuid(backend)
    await backend.create_mig_instance(gpu, 19, Placement(0, 1))
    calls: dict[str, Callable[[], Coroutine[Any, Any, object]]] = {
        "discover": backend.discover,
        "create_mig_instance": lambda: backend.create_mig_instance(gpu, 19, Placement(1, 1)),
        "destroy_mig_instance": lambda: backend.destroy_mig_instance(gpu, 1),
    }
    backend.fail_next(operation, HardwareErrorReason.GPU_LOST)

    error = await hardware_error(calls[operation]())

    assert error.reason is HardwareErrorReason.GPU_LOST
    assert str(error) == f"simulated {operation} failure injected by fail_next (gpu-lost)"
    assert (await backend.discover())[0].mig_instances[0].gpu_instance_id == 1
    await calls[operation]()


async def test_fail_next_counts_and_leaves_state_alone() -> None:
    backend = single_gpu("H100-SXM5-80GB")
    gpu = await first_uuid(backend)
    backend.fail_next("create_mig_instance", HardwareErrorReason.OTHER)
    backend.fail_next("create_mig_instance", HardwareErrorReason.INSUFFICIENT_RESOURCES)
    assert len(await backend.discover()) == 1  # other operations are not armed

    reasons = [
        (await hardware_error(backend.create_mig_instance(gpu, 19, Placement(0, 1)))).reason for _ in range(2)
    ]

    assert reasons == [HardwareErrorReason.OTHER, HardwareErrorReason.INSUFFICIENT_RESOURCES]
    assert (await backend.discover())[0].mig_instances == ()
    assert (await backend.create_mig_instance(gpu, 19, Placement(0, 1))).gpu_instance_id == 1
    with pytest.raises(ValueError, match="cannot inject a fault into 'close'; operations: discover, "):
        backend.fail_next("close", HardwareErrorReason.OTHER)


async def test_xids_are_recorded_once_and_taken_in_order() -> None:
    backend = SimulatedBackend("n", resolve_node_spec("dgx-h100"))
    first, second = (gpu.uuid for gpu in (await backend.discover())[:2])

    backend.raise_xid(first, 48)
    backend.raise_xid(second, 94)

    assert backend.take_events() == (SimulatedEvent(first, 48), SimulatedEvent(second, 94))
    assert backend.take_events() == ()
    with pytest.raises(HardwareError, match="no GPU with UUID GPU-x"):
        backend.raise_xid("GPU-x", 48)


async def test_a_lost_gpu_leaves_discover_reports_xid_79_and_refuses_mig_calls() -> None:
    backend = SimulatedBackend("n", resolve_node_spec("dgx-h100-mig"))
    gpus = await backend.discover()
    lost = gpus[3].uuid
    await backend.create_mig_instance(lost, 19, Placement(0, 1))

    backend.lose_gpu(lost)
    backend.lose_gpu(lost)

    assert [gpu.uuid for gpu in await backend.discover()] == [g.uuid for g in gpus if g.uuid != lost]
    assert backend.take_events() == (SimulatedEvent(lost, 79),)
    created = await hardware_error(backend.create_mig_instance(lost, 19, Placement(1, 1)))
    destroyed = await hardware_error(backend.destroy_mig_instance(lost, 1))
    assert (created.reason, destroyed.reason) == (HardwareErrorReason.GPU_LOST,) * 2
    assert (
        str(destroyed)
        == f"GPU 3 ({lost}): cannot destroy a GPU instance: the GPU is lost (fell off the bus, XID 79)"
    )


async def test_mig_instances_outlive_a_restart_in_the_state_file_and_a_broken_one_is_named(
    tmp_path: Path,
) -> None:
    spec = parse_node_spec(
        {"gpus": [{"model": "A100-SXM4-80GB", "count": 1, "migMode": "enabled"}]}, "test node"
    )
    state_file = tmp_path / "simulated-hardware.json"
    backend = SimulatedBackend("node-a", spec, state_file)
    gpu = await first_uuid(backend)
    made = await backend.create_mig_instance(gpu, ID_3G_40GB, Placement(0, 4))

    assert (await SimulatedBackend("node-a", spec, state_file).discover())[0].mig_instances == (made,)

    state_file.write_text(state_file.read_text().replace('"profileId"', '"profile"'))
    with pytest.raises(
        HardwareError,
        match=r"is unreadable: instances\.GPU-[0-9a-f-]+\[0\]\.profile: unknown field "
        r"\(allowed here: gi, profileId, start, size\)$",
    ):
        SimulatedBackend("node-a", spec, state_file)
