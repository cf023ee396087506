"""The claim engine on every kind of device: static and dynamic MIG (through the simulated
backend), shared and admin access, opaque configs, two-phase records and recovery."""

import asyncio
import json
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from dra_driver.claims.calls import RawClaim
from dra_driver.claims.edits.gpu_edits import NvmlEdits
from dra_driver.claims.edits.vgpu_edits import HamiCore
from dra_driver.claims.effect_entries import MigInstanceEntry, TimeSliceEntry
from dra_driver.claims.effects.hami_core import HamiCoreDirectories
from dra_driver.claims.engine import ClaimEngine, SharingControls
from dra_driver.claims.identity import ClaimRef, claim_ref
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.sharing.mps import SimulatedMps
from dra_driver.devices.node_config import GpuEntry, GpuSettings, NodeConfig
from dra_driver.hardware.model import ComputeMode, HardwareErrorReason, MigInstance, MigMode, Placement
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.simulated_nodes import resolve_node_spec
from dra_driver.hardware.time_slicing import SimulatedTimeSlicer
from tests.support.engines import simulated_engine, simulated_hardware
from tests.support.memory_claims import MemoryClaims
from tests.support.nodes import simulated_node

DRIVER = "gpu.dra-driver.dev"
DYNAMIC = NodeConfig(default=GpuSettings(mode="mig-dynamic"))
# HAMi-core's limits as advisory variables (no MPS daemon, no library): what these tests look at.
CAPACITY = NodeConfig(default=GpuSettings(mode="vgpu-capacity", enforcement="none"))
HAMI_CORE_CAPACITY = NodeConfig(default=GpuSettings(mode="vgpu-capacity", enforcement="hami-core"))


def node(
    tmp: Path,
    profile: str,
    config: NodeConfig,
    claims: MemoryClaims,
    sharing: SharingControls | None = None,
    hami_core: HamiCore | None = None,
) -> tuple[ClaimEngine, SimulatedBackend]:
    hardware = simulated_hardware(tmp, profile)
    engine = simulated_engine(
        tmp, claims, profile, config, hardware=hardware, sharing=sharing, hami_core=hami_core
    )
    return engine, hardware


def spec_env(tmp: Path, uid: str) -> list[str]:
    (spec,) = (tmp / "cdi").glob(f"*{uid}*")
    return [
        env
        for device in json.loads(spec.read_text())["devices"]
        for env in device["containerEdits"].get("env", [])
    ]


def file_text(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


async def instances(hardware: SimulatedBackend) -> list[tuple[str, int, Placement]]:
    return [
        (gpu.uuid, instance.profile_id, instance.placement)
        for gpu in await hardware.discover()
        for instance in gpu.mig_instances
    ]


async def test_dynamic_mig_creates_the_instance_at_the_placement_and_unprepare_destroys_it(
    tmp_path: Path,
) -> None:
    claims = MemoryClaims()
    claim = claims.add("mig", {"device": "gpu-1-mig-1g10gb-3"})

    engine, hardware = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
    await engine.load_state()
    outcome = (await engine.prepare([claim]))[claim[2]]
    assert outcome.error == ""
    gpu_1 = simulated_node("dgx-h100-mig")[1]
    ((gpu, profile_id, placement),) = await instances(hardware)
    assert (gpu, profile_id, placement) == (gpu_1.uuid, 19, Placement(3, 1))
    env = spec_env(tmp_path, claim[2])
    assert f"DRA_DEVICE_GPU_1_MIG_1G10GB_3_PARENT={gpu_1.uuid}" in env
    assert "DRA_DEVICE_GPU_1_MIG_1G10GB_3_PROFILE=1g.10gb" in env
    assert await engine.unprepare([claim]) == {claim[2]: ""}
    assert await instances(hardware) == []


async def test_a_failed_creation_leaves_no_instance_record_or_spec_and_frees_the_device(
    tmp_path: Path,
) -> None:
    claims = MemoryClaims()
    # Overlapping placements (the scheduler's counters never allow this): the second creation fails
    # after the first succeeded, and the first must be destroyed again.
    overlapping = claims.add(
        "overlap", {"device": "gpu-0-mig-3g40gb-4"}, {"request": "other", "device": "gpu-0-mig-1g10gb-5"}
    )
    flaky = claims.add("flaky", {"device": "gpu-1-mig-7g80gb-0"})

    engine, hardware = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
    await engine.load_state()
    error = (await engine.prepare([overlapping]))[overlapping[2]].error
    assert "cannot create its MIG instance" in error and "overlap the existing 3g.40gb instance" in error
    assert await instances(hardware) == []
    hardware.fail_next("create_mig_instance", HardwareErrorReason.INSUFFICIENT_RESOURCES)
    assert "cannot create its MIG instance" in (await engine.prepare([flaky]))[flaky[2]].error
    assert not list((tmp_path / "state" / "claims").iterdir())
    assert not (tmp_path / "cdi").exists() or not list((tmp_path / "cdi").iterdir())
    assert (await engine.prepare([flaky]))[flaky[2]].error == "", "the device was freed"
    assert len(await instances(hardware)) == 1


async def test_a_refused_creation_leaves_an_instance_made_by_hand_at_that_placement(tmp_path: Path) -> None:
    """A slice published before an operator made a 3g.40gb by hand at start 4 hands out that
    placement; NVML refuses it, and the rollback (which destroys by profile and placement) must
    not take the operator's instance: nothing of the claim's stands there."""
    claims = MemoryClaims()
    stale = claims.add("stale", {"device": "gpu-0-mig-3g40gb-4"})

    engine, hardware = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
    await engine.load_state()
    (gpu, *_) = await hardware.discover()
    (profile,) = [profile for profile in gpu.mig_profiles if profile.name == "3g.40gb"]
    by_hand = await hardware.create_mig_instance(gpu.uuid, profile.profile_id, Placement(4, 4))
    error = (await engine.prepare([stale]))[stale[2]].error
    assert "cannot create its MIG instance" in error
    assert await instances(hardware) == [(gpu.uuid, profile.profile_id, by_hand.placement)]
    assert not list((tmp_path / "state" / "claims").iterdir())


async def test_a_prepare_cut_short_is_rolled_back_at_the_next_start(tmp_path: Path) -> None:
    claims = MemoryClaims()
    claim = claims.add("mig", {"device": "gpu-2-mig-2g20gb-4"})
    gpu_2 = simulated_node("dgx-h100-mig")[2]

    async def crash_after_creation() -> None:
        engine, hardware = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
        await engine.load_state()
        wanted = MigInstanceEntry(gpu_2.uuid, 14, 4, 2)
        ClaimRecordStore(tmp_path / "state").save(
            ClaimRecord(claim=claim_ref(*claim), devices=(), state="preparing", effects=(wanted,))
        )
        await hardware.create_mig_instance(gpu_2.uuid, 14, Placement(4, 2))

    async def restart() -> None:
        engine, hardware = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
        assert len(await instances(hardware)) == 1, "the simulated GPU kept its instance"
        await engine.load_state()
        assert await instances(hardware) == []
        assert engine.prepared_claims == {}
        assert (await engine.prepare([claim]))[claim[2]].error == ""
        assert len(await instances(hardware)) == 1

    await crash_after_creation()
    await restart()


async def test_records_of_an_earlier_boot_are_forgotten(tmp_path: Path) -> None:
    claims = MemoryClaims()
    claim = claims.add("whole", {"device": "gpu-0"})

    async def boot(boot_id: str) -> dict[str, ClaimRecord]:
        engine, _ = node(tmp_path, "t4x4", NodeConfig(), claims)
        await engine.load_state(boot_id)
        if not engine.prepared_claims:
            await engine.prepare([claim])
        return engine.prepared_claims

    assert list(await boot("boot-1")) == [claim[2]]
    assert list(await boot("boot-1")) == [claim[2]]
    # An unflushed record the power loss cut short: dropped with the rest, not reported as corrupt.
    (tmp_path / "state" / "claims" / "0e5a4b1c-2d3e-4f50-8a6b-7c8d9e0f1a2b.json").write_bytes(b"")
    engine, _ = node(tmp_path, "t4x4", NodeConfig(), claims)
    assert await engine.load_state("boot-2") == []
    assert engine.prepared_claims == {}
    assert not list((tmp_path / "cdi").iterdir())
    assert not list((tmp_path / "state" / "claims").iterdir())


async def test_static_mig_uses_the_existing_instance(tmp_path: Path) -> None:
    claims = MemoryClaims()
    claim = claims.add("static", {"device": "gpu-0-mig-1g10gb-2"})
    existing = next(i for i in simulated_node("mixed")[0].mig_instances if i.placement.start == 2)

    engine, hardware = node(tmp_path, "mixed", NodeConfig(), claims)
    await engine.load_state()
    assert (await engine.prepare([claim]))[claim[2]].error == ""
    assert len(await instances(hardware)) == 8, "the two static GPUs' instances, nothing created"
    assert f"DRA_DEVICE_GPU_0_MIG_1G10GB_2={existing.uuid}" in spec_env(tmp_path, claim[2])


async def test_admin_access_and_shares_are_not_exclusive_but_plain_devices_are(tmp_path: Path) -> None:
    claims = MemoryClaims()
    share = "3f1c7a52-9c1e-4e43-9d57-4c6f3f1e2a10"
    other_share = "6b0d3c1e-1f2a-4b3c-8d4e-5f6a7b8c9d0e"
    first = claims.add("a", {"device": "gpu-0", "shareID": share, "consumedCapacity": {"memory": "8Gi"}})
    second = claims.add("b", {"device": "gpu-0", "shareID": other_share})
    no_share = claims.add("c", {"device": "gpu-0"})
    admin = claims.add("d", {"device": "gpu-0", "adminAccess": True})

    engine, _ = node(tmp_path, "t4x4", CAPACITY, claims)
    await engine.load_state()
    outcomes = await engine.prepare([first, second, no_share, admin])
    errors = {uid: outcome.error for uid, outcome in outcomes.items()}
    assert errors[first[2]] == errors[second[2]] == errors[admin[2]] == ""
    assert "shareID is missing: device gpu-0 allows multiple allocations" in errors[no_share[2]]


async def test_a_bad_opaque_config_is_that_claims_error_naming_the_field(tmp_path: Path) -> None:
    claims = MemoryClaims()
    config = sharing_config({"strategy": "Timeslicing"})
    bad = claims.add("bad", {"device": "gpu-0"}, config=config)
    good = claims.add("good", {"device": "gpu-1"})

    engine, _ = node(tmp_path, "t4x4", NodeConfig(), claims)
    await engine.load_state()
    errors = {uid: outcome.error for uid, outcome in (await engine.prepare([bad, good])).items()}
    assert errors[good[2]] == ""
    assert 'sharing.strategy: "Timeslicing" is not one of TimeSlicing, MPS' in errors[bad[2]]


async def test_a_vgpu_share_gets_its_limits_in_cuda_order_and_the_config_knobs(tmp_path: Path) -> None:
    claims = MemoryClaims()
    config = [
        {
            "source": "FromClass",
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "resource.dra-driver.dev/v1alpha1",
                    "kind": "VgpuConfig",
                    "memoryOversubscription": True,
                    "coreLimitPolicy": "Force",
                },
            },
        }
    ]
    share = "3f1c7a52-9c1e-4e43-9d57-4c6f3f1e2a10"
    claim = claims.add(
        "vgpu",
        {"device": "gpu-2", "shareID": share, "consumedCapacity": {"memory": "8Gi", "cores": "30"}},
        {"request": "gpu", "device": "gpu-1", "shareID": share, "consumedCapacity": {"memory": "1Gi"}},
        config=config,
    )

    engine, _ = node(tmp_path, "t4x4", CAPACITY, claims)
    await engine.load_state()
    assert (await engine.prepare([claim]))[claim[2]].error == ""
    env = spec_env(tmp_path, claim[2])
    # gpu-1 comes before gpu-2 on the PCI bus, whatever order the results list them in.
    for expected in (
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_DEVICE_MEMORY_LIMIT_0=1024m",
        "CUDA_DEVICE_SM_LIMIT_0=100",
        "CUDA_DEVICE_MEMORY_LIMIT_1=8192m",
        "CUDA_DEVICE_SM_LIMIT_1=30",
        "CUDA_OVERSUBSCRIBE=true",
        "GPU_CORE_UTILIZATION_POLICY=force",
    ):
        assert expected in env


def sharing_config(sharing: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "source": "FromClaim",
            "requests": [],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "resource.dra-driver.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": sharing,
                },
            },
        }
    ]


async def test_time_slicing_is_set_for_the_claim_and_restored_when_it_goes(tmp_path: Path) -> None:
    claims = MemoryClaims()
    claim = claims.add(
        "ts",
        {"device": "gpu-1"},
        config=sharing_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}),
    )
    gpu_1 = simulated_node("t4x4")[1].uuid
    slicer = SimulatedTimeSlicer(gpu.uuid for gpu in simulated_node("t4x4"))
    runtime = Path(tempfile.mkdtemp(prefix="mps-"))

    try:
        engine, _ = node(
            tmp_path, "t4x4", NodeConfig(), claims, SharingControls(slicer, SimulatedMps(runtime))
        )
        await engine.load_state()
        assert (await engine.prepare([claim]))[claim[2]].error == ""
        assert await slicer.current(gpu_1) == "Long"
        assert engine.prepared_claims[claim[2]].entries(TimeSliceEntry) == (TimeSliceEntry(gpu_1),)
        assert await engine.unprepare([claim]) == {claim[2]: ""}
        assert await slicer.current(gpu_1) == "Default"
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    assert [(s.gpu_uuid, s.interval) for s in slicer.history] == [(gpu_1, "Long"), (gpu_1, "Default")]


async def test_an_mps_claim_runs_its_own_control_daemon_while_prepared(tmp_path: Path) -> None:
    claims = MemoryClaims()
    claim = claims.add(
        "mps",
        {"device": "gpu-0"},
        {"request": "gpu", "device": "gpu-2"},
        config=sharing_config({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 40}}),
    )
    runtime = Path(tempfile.mkdtemp(prefix="mps-"))
    mps = SimulatedMps(runtime)
    slicer = SimulatedTimeSlicer(gpu.uuid for gpu in simulated_node("t4x4"))

    try:
        engine, _ = node(tmp_path, "t4x4", NodeConfig(), claims, SharingControls(slicer, mps))
        await engine.load_state()
        outcome = (await engine.prepare([claim]))[claim[2]]
        assert outcome.error == ""
        assert await mps.is_running(claim[2])
        mps_id = f"k8s.{DRIVER}/claim={claim[2]}-mps"
        assert all(mps_id in device.cdi_device_ids for device in outcome.devices)
        env = spec_env(tmp_path, claim[2])
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40" in env
        assert await engine.unprepare([claim]) == {claim[2]: ""}
        assert not await mps.is_running(claim[2])
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


async def test_hami_core_enforcement_mounts_the_library_and_a_claim_directory_that_goes_with_the_claim(
    tmp_path: Path,
) -> None:
    claims = MemoryClaims()
    share = "3f1c7a52-9c1e-4e43-9d57-4c6f3f1e2a10"
    claim = claims.add("vgpu", {"device": "gpu-0", "shareID": share, "consumedCapacity": {"memory": "2Gi"}})
    library = tmp_path / "libvgpu.so"
    library.write_bytes(b"\x7fELF")
    hami = HamiCore(PurePosixPath(library), PurePosixPath(tmp_path / "vgpu"))
    stale = tmp_path / "vgpu" / "claims" / "11111111-2222-4333-8444-555555555555"
    stale.mkdir(parents=True)

    engine, _ = node(tmp_path, "t4x4", HAMI_CORE_CAPACITY, claims, hami_core=hami)
    await engine.load_state()
    assert not stale.exists(), "a directory no prepared claim owns is swept at start"
    assert (await engine.prepare([claim]))[claim[2]].error == ""
    (spec_file,) = (tmp_path / "cdi").glob(f"*{claim[2]}*")
    mounts = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["mounts"]
    targets = {mount["containerPath"]: mount["hostPath"] for mount in mounts}
    assert targets["/usr/local/vgpu/libvgpu.so"] == str(library)
    preload = Path(targets["/etc/ld.so.preload"])
    assert file_text(preload) == "/usr/local/vgpu/libvgpu.so\n"
    assert await engine.unprepare([claim]) == {claim[2]: ""}
    assert file_text(preload) is None


def test_the_hami_core_directory_is_made_by_its_effects_apply_and_nowhere_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine makes every change of a prepare through an effect's `apply` (effects/contract.py):
    with that apply a no-op, a prepare leaves no HAMi-core directory behind, and writes no
    "preparing" record for it either (no entry names the directory)."""
    claims = MemoryClaims()
    share = "3f1c7a52-9c1e-4e43-9d57-4c6f3f1e2a10"
    claim = claims.add("vgpu", {"device": "gpu-0", "shareID": share, "consumedCapacity": {"memory": "2Gi"}})
    hami = HamiCore(PurePosixPath(tmp_path / "libvgpu.so"), PurePosixPath(tmp_path / "vgpu"))
    applied: list[object] = []

    async def record_only(self: HamiCoreDirectories, ref: ClaimRef, actions: object) -> dict[object, object]:
        applied.append(actions)
        return {}

    monkeypatch.setattr(HamiCoreDirectories, "apply", record_only)
    writes: list[str] = []
    write = ClaimRecordStore.write

    async def counted(self: ClaimRecordStore, record: ClaimRecord) -> None:
        writes.append(record.state)
        await write(self, record)

    monkeypatch.setattr(ClaimRecordStore, "write", counted)

    async def scenario() -> None:
        engine, _ = node(tmp_path, "t4x4", HAMI_CORE_CAPACITY, claims, hami_core=hami)
        await engine.load_state()
        assert (await engine.prepare([claim]))[claim[2]].error == ""

    asyncio.run(scenario())
    assert len(applied) == 1
    assert not Path(hami.claim_dir(claim[2])).exists()
    assert "preparing" not in writes


class SlowClaims(MemoryClaims):
    """A slow API server: a GET takes 0.2 s, and `getting` is set once one has begun."""

    def __init__(self) -> None:
        super().__init__()
        self.getting = asyncio.Event()

    async def get(self, namespace: str, name: str) -> object:
        self.getting.set()
        await asyncio.sleep(0.2)
        return await super().get(namespace, name)


async def test_an_unprepare_sent_during_a_prepare_is_not_overtaken_by_it(tmp_path: Path) -> None:
    claims = SlowClaims()
    claim = claims.add("raced", {"device": "gpu-0"})

    engine, _ = node(tmp_path, "t4x4", NodeConfig(), claims)
    await engine.load_state()
    preparing = asyncio.create_task(engine.prepare([claim]))
    await claims.getting.wait()  # the prepare is waiting for its GET
    assert await engine.unprepare([claim]) == {claim[2]: ""}
    assert (await preparing)[claim[2]].error == ""
    assert engine.prepared_claims == {}, "the unprepare came last, so nothing stays prepared"


async def test_admin_access_to_a_mig_device_monitors_its_gpu_without_creating_an_instance(
    tmp_path: Path,
) -> None:
    claims = MemoryClaims()
    admin = claims.add("admin", {"device": "gpu-3-mig-1g10gb-0", "adminAccess": True})

    engine, hardware = node(tmp_path, "dgx-h100-mig", DYNAMIC, claims)
    await engine.load_state()
    assert (await engine.prepare([admin]))[admin[2]].error == ""
    assert await instances(hardware) == []
    env = spec_env(tmp_path, admin[2])
    assert "DRA_DEVICE_GPU_3_MIG_1G10GB_0_MIG_MONITOR=true" in env
    assert f"DRA_DEVICE_GPU_3_MIG_1G10GB_0={simulated_node('dgx-h100-mig')[3].uuid}" in env


def test_on_real_gpus_mig_admin_access_gets_only_the_monitor_capability(tmp_path: Path) -> None:
    mig = tmp_path / "proc" / "driver" / "nvidia" / "capabilities" / "mig"
    mig.mkdir(parents=True)
    (mig / "config").write_text("DeviceFileMinor: 1\nDeviceFileMode: 256\n")
    (mig / "monitor").write_text("DeviceFileMinor: 2\nDeviceFileMode: 292\n")
    gpu = simulated_node("dgx-h100-mig")[0]

    edits = NvmlEdits(proc_root=tmp_path / "proc").mig_monitor("gpu-0-mig-7g80gb-0", gpu)

    assert [node.path for node in edits.nodes()] == ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap2"]


class RecordingBackend(SimulatedBackend):
    """The simulated GPUs, remembering every MIG instance created and compute mode set: a rollback
    hides a side effect from the end state, not from this."""

    def __init__(self, root: Path, profile: str) -> None:
        super().__init__("node-a", resolve_node_spec(profile), root / "hardware.json")
        self.changes: list[tuple[str, str]] = []

    async def create_mig_instance(self, gpu_uuid: str, profile_id: int, placement: Placement) -> MigInstance:
        self.changes.append(("mig", gpu_uuid))
        return await super().create_mig_instance(gpu_uuid, profile_id, placement)

    async def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        self.changes.append((mode, gpu_uuid))
        await super().set_compute_mode(gpu_uuid, mode)


SHARE_A = "3f1c7a52-9c1e-4e43-9d57-4c6f3f1e2a10"
SHARE_B = "8b2d4e61-0a3c-4f5e-9d7b-1c2e3f4a5b6c"


@pytest.mark.parametrize(
    ("vgpus", "refusal"),
    [
        (
            [{"consumedCapacity": {"memory": "100Gi"}}],
            '.consumedCapacity.memory: "100Gi" is more than the 23034Mi of device gpu-6',
        ),
        ([{"consumedCapacity": {"memory": "lots"}}], '.consumedCapacity.memory: "lots" is not a whole'),
        ([{"consumedCapacity": {"cores": "0"}}], '.consumedCapacity.cores: "0" is out of range'),
        (
            [
                {"consumedCapacity": {"memory": "1Gi"}},
                {"shareID": SHARE_B, "consumedCapacity": {"memory": "2Gi"}},
            ],
            "devices gpu-6 and gpu-6 are both shares of GPU 6",
        ),
    ],
    ids=["over-the-gpu", "malformed", "no-cores", "two-shares-of-one-gpu"],
)
async def test_a_claim_refused_for_its_vgpu_grant_creates_no_mig_instance_and_changes_no_sharing(
    tmp_path: Path, vgpus: list[dict[str, Any]], refusal: str
) -> None:
    """Every reason to refuse a claim is found in its plan: a grant refused after the MIG instance
    and the time slice were applied would be rolled back, but they would have happened."""
    claims = MemoryClaims()
    claim = claims.add(
        "mixed",
        {"request": "mig", "device": "gpu-2-mig-1g10gb-0"},
        {"request": "whole", "device": "gpu-4"},
        *(
            {"request": f"vgpu{n}", "device": "gpu-6", "shareID": SHARE_A, **vgpu}
            for n, vgpu in enumerate(vgpus)
        ),
        config=[
            {**entry, "requests": ["whole"]}
            for entry in sharing_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})
        ],
    )
    error, hardware, slicer = await refused_without_side_effects(tmp_path, claims, claim)
    assert refusal in error
    assert hardware.changes == [], "a side effect was applied before the claim was refused"
    assert slicer.history == ()


def config_entry(kind: str, request: str, sharing: dict[str, Any]) -> dict[str, Any]:
    (entry,) = sharing_config(sharing)
    return {
        **entry,
        "requests": [request],
        "opaque": {**entry["opaque"], "parameters": {**entry["opaque"]["parameters"], "kind": kind}},
    }


def mps(**settings: Any) -> dict[str, Any]:
    return {"strategy": "MPS", "mps": settings}


@pytest.mark.parametrize(
    ("mig_sharing", "whole_sharing", "refusal"),
    [
        (None, mps(), "devices gpu-2-mig-1g10gb-0 do not use MPS while the claim's other devices do"),
        (
            mps(defaultActiveThreadPercentage=20),
            mps(defaultActiveThreadPercentage=40),
            "have different MPS settings",
        ),
        (
            mps(defaultPerDevicePinnedMemoryLimit={"5": "1Gi"}),
            mps(defaultPerDevicePinnedMemoryLimit={"5": "1Gi"}),
            "key '5' names no device of this claim; its devices are 0: gpu-2-mig-1g10gb-0 "
            "(a MIG instance not created yet), 1: gpu-4",
        ),
        (
            mps(defaultPinnedDeviceMemoryLimit="512Ki"),
            mps(defaultPinnedDeviceMemoryLimit="512Ki"),
            "MPS takes limits in whole MiB, so it must be at least 1Mi",
        ),
    ],
    ids=["mps-on-some", "two-mps-settings", "per-device-key", "under-1Mi"],
)
async def test_a_claim_refused_for_its_sharing_config_creates_no_mig_instance(
    tmp_path: Path, mig_sharing: dict[str, Any] | None, whole_sharing: dict[str, Any], refusal: str
) -> None:
    """The sharing rules read the claim's configs alone, so they refuse it before the dynamic MIG
    instance is created (issue 48: they used to run after it, and roll it back)."""
    claims = MemoryClaims()
    config = [config_entry("GpuConfig", "whole", whole_sharing)]
    if mig_sharing is not None:
        config.append(config_entry("MigDeviceConfig", "mig", mig_sharing))
    claim = claims.add(
        "mps",
        {"request": "mig", "device": "gpu-2-mig-1g10gb-0"},
        {"request": "whole", "device": "gpu-4"},
        config=config,
    )
    error, hardware, slicer = await refused_without_side_effects(tmp_path, claims, claim)
    assert refusal in error
    assert hardware.changes == [], "a side effect was applied before the claim was refused"
    assert slicer.history == ()


async def refused_without_side_effects(
    tmp_path: Path, claims: MemoryClaims, claim: RawClaim
) -> tuple[str, "RecordingBackend", SimulatedTimeSlicer]:
    """Prepares `claim` on the mixed node (dynamic MIG where it can, vGPU shares elsewhere),
    which must refuse it, and checks that the GPUs end as they began: the refusal's error."""
    gpus = simulated_node("mixed")
    modes = {
        MigMode.ENABLED: GpuSettings(mode="mig-dynamic"),
        # Not mps: a share under MPS must be its claim's only device (refused for that first).
        MigMode.UNSUPPORTED: GpuSettings(mode="vgpu-capacity", enforcement="none"),
    }
    mixed = NodeConfig(
        gpus=tuple(
            GpuEntry(f"gpus[{gpu.index}]", gpu.index, None, modes[gpu.mig_mode])
            for gpu in gpus
            if gpu.mig_mode in modes
        )
    )
    hardware = RecordingBackend(tmp_path, "mixed")
    slicer = SimulatedTimeSlicer(gpu.uuid for gpu in gpus)
    runtime = Path(tempfile.mkdtemp(prefix="mps-"))
    sharing = SharingControls(slicer, SimulatedMps(runtime), compute_modes=hardware)

    try:
        engine = simulated_engine(tmp_path, claims, "mixed", mixed, hardware=hardware, sharing=sharing)
        await engine.load_state()
        before = await instances(hardware)
        error = (await engine.prepare([claim]))[claim.uid].error
        assert await instances(hardware) == before
        assert [await slicer.current(gpu.uuid) for gpu in gpus] == ["Default"] * len(gpus)
        assert [await hardware.compute_mode(gpu.uuid) for gpu in gpus] == ["Default"] * len(gpus)
        assert claim.uid not in engine.prepared_claims
        return error, hardware, slicer
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
