"""The claim engine writes, mounts and removes KEP-5304 device metadata files: on whole GPUs,
dynamic MIG and vGPU shares, idempotently, and with crash leftovers cleaned up at start."""

import errno
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.calls import RawClaim
from dra_driver.claims.edits.cdi import CdiSpec
from dra_driver.claims.edits.cdi_files import CdiSpecDirectory
from dra_driver.claims.effect_entries import MigInstanceEntry
from dra_driver.claims.engine import ClaimEngine
from dra_driver.claims.identity import claim_ref
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.records import ClaimRecord
from dra_driver.devices.node_config import GpuSettings, NodeConfig
from dra_driver.hardware.model import Placement
from dra_driver.hardware.simulated import SimulatedBackend
from tests.support.device_metadata_schema import metadata_stream, validate_metadata
from tests.support.engines import POOL, simulated_engine, simulated_hardware
from tests.support.memory_claims import MemoryClaims
from tests.support.nodes import inventory_for, simulated_node

DRIVER = DEFAULT_DRIVER_NAME
KIND = f"k8s.{DRIVER}/claim"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
DYNAMIC = NodeConfig(default=GpuSettings(mode="mig-dynamic"))
# HAMi-core's limits as advisory variables (no MPS daemon, no library): what these tests look at.
CAPACITY = NodeConfig(default=GpuSettings(mode="vgpu-capacity", enforcement="none"))


def metadata_file(root: Path, uid: str, request: str) -> Path:
    return root / "state" / "dra-device-metadata" / f"{uid}_{request}.json"


def files_of(root: Path, uid: str) -> list[str]:
    """The names of the claim's files, temporary ones included."""
    directory = root / "state" / "dra-device-metadata"
    names = [path.name for path in directory.iterdir()] if directory.is_dir() else []
    return sorted(name for name in names if name.removeprefix(".").startswith(f"{uid}_"))


def spec_of(root: Path, uid: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads((root / "cdi" / f"k8s.{DRIVER}-claim_{uid}.json").read_text())
    return spec


def mounts_of(root: Path, uid: str) -> dict[str, tuple[str, list[str]]]:
    """The claim spec's metadata mounts: CDI device -> (container path, host path and options)."""
    return {
        device["name"]: (mount["containerPath"], [mount["hostPath"], *mount["options"]])
        for device in spec_of(root, uid)["devices"]
        for mount in device["containerEdits"].get("mounts", [])
        if mount["containerPath"].startswith(CONTAINER_DIR)
    }


def devices_in(path: Path) -> dict[str, dict[str, Any]]:
    """The devices of a metadata file's newest object, by name, each object validated first."""
    documents = metadata_stream(path.read_bytes())
    for document in documents:
        validate_metadata(document)
    return {device["name"]: device for request in documents[0]["requests"] for device in request["devices"]}


async def test_each_request_gets_a_file_mounted_at_its_standard_path_by_its_first_device(
    tmp_path: Path,
) -> None:
    claims = MemoryClaims()
    claim = claims.add(
        "train",
        {"request": "pair", "device": "gpu-1"},
        {"request": "pair", "device": "gpu-3"},
        {"request": "single", "device": "gpu-0"},
    )
    inventory = inventory_for("t4x4")

    engine = simulated_engine(tmp_path, claims)
    await engine.load_state()
    outcome = (await engine.prepare([claim]))[claim[2]]
    assert outcome.error == ""
    uid = claim[2]
    assert {d.device: d.cdi_device_ids for d in outcome.devices} == {
        "gpu-1": (f"{KIND}={uid}-gpu-1", f"{KIND}={uid}-pair.metadata"),
        "gpu-3": (f"{KIND}={uid}-gpu-3",),
        "gpu-0": (f"{KIND}={uid}-gpu-0", f"{KIND}={uid}-single.metadata"),
    }
    assert mounts_of(tmp_path, uid) == {
        f"{uid}-pair.metadata": (
            f"{CONTAINER_DIR}/resourceclaims/train/pair/{DRIVER}-metadata.json",
            [str(metadata_file(tmp_path, uid, "pair")), "ro", "nosuid", "nodev", "noexec", "bind"],
        ),
        f"{uid}-single.metadata": (
            f"{CONTAINER_DIR}/resourceclaims/train/single/{DRIVER}-metadata.json",
            [str(metadata_file(tmp_path, uid, "single")), "ro", "nosuid", "nodev", "noexec", "bind"],
        ),
    }
    pair = devices_in(metadata_file(tmp_path, uid, "pair"))
    assert sorted(pair) == ["gpu-1", "gpu-3"]
    for name, device in {**pair, **devices_in(metadata_file(tmp_path, uid, "single"))}.items():
        published = inventory.device_by_name[name].attributes
        assert device["pool"] == POOL and device["driver"] == DRIVER
        assert device["attributes"]["uuid"] == {"string": published["uuid"]}
        assert set(device["attributes"]) == set(published)
    assert metadata_file(tmp_path, uid, "pair").stat().st_mode & 0o777 == 0o644


async def test_a_template_claim_is_mounted_under_its_pod_claim_name(tmp_path: Path) -> None:
    claims = MemoryClaims()
    claim = claims.add(
        "pod-7-gpus-x4k2p",
        {"request": "gpu", "device": "gpu-2"},
        annotations={"resource.kubernetes.io/pod-claim-name": "gpus"},
    )

    engine = simulated_engine(tmp_path, claims)
    await engine.load_state()
    assert (await engine.prepare([claim]))[claim[2]].error == ""
    ((container_path, _),) = mounts_of(tmp_path, claim[2]).values()
    assert container_path == f"{CONTAINER_DIR}/resourceclaimtemplates/gpus/gpu/{DRIVER}-metadata.json"
    (document, _) = metadata_stream(metadata_file(tmp_path, claim[2], "gpu").read_bytes())
    assert document["podClaimName"] == "gpus"
    assert document["metadata"]["name"] == "pod-7-gpus-x4k2p"


async def test_a_dynamic_mig_device_lists_the_uuid_of_the_instance_prepare_created(tmp_path: Path) -> None:
    claims = MemoryClaims()
    claim = claims.add("mig", {"request": "slice", "device": "gpu-1-mig-1g10gb-3"})

    hardware = simulated_hardware(tmp_path, "dgx-h100-mig")
    engine = simulated_engine(tmp_path, claims, "dgx-h100-mig", DYNAMIC, hardware=hardware)
    await engine.load_state()
    assert (await engine.prepare([claim]))[claim[2]].error == ""
    ((instance,),) = [gpu.mig_instances for gpu in await hardware.discover() if gpu.mig_instances]
    created = instance.uuid
    device = devices_in(metadata_file(tmp_path, claim[2], "slice"))["gpu-1-mig-1g10gb-3"]
    assert created.startswith("MIG-")
    assert device["attributes"]["uuid"] == {"string": created}
    assert device["attributes"]["profile"] == {"string": "1g.10gb"}
    assert device["attributes"]["parentUUID"] == {"string": simulated_node("dgx-h100-mig")[1].uuid}


async def test_a_vgpu_share_lists_its_limits_and_share_id(tmp_path: Path) -> None:
    claims = MemoryClaims()
    share = "3f1c7a52-9c1e-4e43-9d57-4c6f3f1e2a10"
    claim = claims.add(
        "vgpu",
        {
            "request": "gpu",
            "device": "gpu-2",
            "shareID": share,
            "consumedCapacity": {"memory": "8Gi", "cores": "30"},
        },
    )

    engine = simulated_engine(tmp_path, claims, "t4x4", CAPACITY)
    await engine.load_state()
    assert (await engine.prepare([claim]))[claim[2]].error == ""
    attributes = devices_in(metadata_file(tmp_path, claim[2], "gpu"))["gpu-2"]["attributes"]
    assert attributes["memoryLimit"] == {"int": 8 * 2**30}
    assert attributes["coresLimit"] == {"int": 30}
    assert attributes["shareID"] == {"string": share}


async def test_a_second_prepare_answers_the_same_and_leaves_the_files_untouched(tmp_path: Path) -> None:
    claims = MemoryClaims()
    claim = claims.add("again", {"request": "gpu", "device": "gpu-0"})
    path = metadata_file(tmp_path, claim[2], "gpu")

    engine = simulated_engine(tmp_path, claims)
    await engine.load_state()
    first = (await engine.prepare([claim]))[claim[2]]
    content, inode = path.read_bytes(), path.stat().st_ino
    restarted = simulated_engine(tmp_path, claims)
    await restarted.load_state()
    assert (await restarted.prepare([claim]))[claim[2]] == first
    assert (await engine.prepare([claim]))[claim[2]] == first
    assert (path.read_bytes(), path.stat().st_ino) == (content, inode)


async def test_unprepare_removes_the_claims_files(tmp_path: Path) -> None:
    claims = MemoryClaims()
    claim = claims.add("gone", {"request": "a", "device": "gpu-0"}, {"request": "b", "device": "gpu-1"})

    engine = simulated_engine(tmp_path, claims)
    await engine.load_state()
    assert (await engine.prepare([claim]))[claim[2]].error == ""
    assert files_of(tmp_path, claim[2]) == [f"{claim[2]}_a.json", f"{claim[2]}_b.json"]
    assert await engine.unprepare([claim]) == {claim[2]: ""}
    assert list((tmp_path / "state" / "dra-device-metadata").iterdir()) == []


def leave_orphan(root: Path, uid: str) -> list[str]:
    """Files as a crash between writing them and the claim's record leaves them: one file and the
    temporary sibling of another. Returns their names."""
    directory = root / "state" / "dra-device-metadata"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{uid}_gpu.json").write_text("{}\n")
    (directory / f".{uid}_other.json.1a2b3c4d.tmp").write_text("{")
    return files_of(root, uid)


async def test_the_start_removes_files_no_record_owns_and_keeps_those_of_prepared_claims(
    tmp_path: Path,
) -> None:
    claims = MemoryClaims()
    kept = claims.add("kept", {"request": "gpu", "device": "gpu-0"})
    orphan = str(uuid.uuid4())
    assert len(leave_orphan(tmp_path, orphan)) == 2
    foreign = [
        tmp_path / "state" / "dra-device-metadata" / name for name in ("notes.txt", "not-a-uid_gpu.json")
    ]

    async def prepare_then_restart() -> None:
        engine = simulated_engine(tmp_path, claims)
        await engine.load_state()
        assert (await engine.prepare([kept]))[kept[2]].error == ""
        for path in foreign:
            path.write_text("an operator's\n")
        restarted: ClaimEngine = simulated_engine(tmp_path, claims)
        await restarted.load_state()

    await prepare_then_restart()
    assert files_of(tmp_path, orphan) == []
    assert all(path.is_file() for path in foreign), "a file not named by a claim UID is not ours to remove"
    assert metadata_file(tmp_path, kept[2], "gpu").is_file()


async def test_an_unprepare_of_a_claim_without_record_removes_its_files(tmp_path: Path) -> None:
    uid = str(uuid.uuid4())
    assert len(leave_orphan(tmp_path, uid)) == 2

    assert (
        await simulated_engine(tmp_path, MemoryClaims()).unprepare([RawClaim("default", "lost", uid)])
    ) == {uid: ""}
    assert files_of(tmp_path, uid) == []


async def test_a_prepare_cut_short_is_rolled_back_with_its_files(tmp_path: Path) -> None:
    claims = MemoryClaims()
    claim = claims.add("mig", {"request": "gpu", "device": "gpu-2-mig-2g20gb-4"})
    gpu_2 = simulated_node("dgx-h100-mig")[2]
    assert len(leave_orphan(tmp_path, claim[2])) == 2

    async def crash_after_the_files(hardware: SimulatedBackend) -> None:
        wanted = MigInstanceEntry(gpu_2.uuid, 14, 4, 2)
        ClaimRecordStore(tmp_path / "state").save(
            ClaimRecord(claim=claim_ref(*claim), devices=(), state="preparing", effects=(wanted,))
        )
        await hardware.create_mig_instance(gpu_2.uuid, 14, Placement(4, 2))

    async def restart(hardware: SimulatedBackend) -> None:
        engine = simulated_engine(tmp_path, claims, "dgx-h100-mig", DYNAMIC, hardware=hardware)
        await engine.load_state()
        assert files_of(tmp_path, claim[2]) == []
        assert (await engine.prepare([claim]))[claim[2]].error == ""

    hardware = simulated_hardware(tmp_path, "dgx-h100-mig")
    await crash_after_the_files(hardware)
    await restart(hardware)
    assert "gpu-2-mig-2g20gb-4" in devices_in(metadata_file(tmp_path, claim[2], "gpu"))


async def test_a_prepare_that_fails_after_writing_the_files_takes_them_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims = MemoryClaims()
    claim = claims.add("unlucky", {"request": "gpu", "device": "gpu-0"})

    def full_disk(self: CdiSpecDirectory, claim_uid: str, spec: CdiSpec) -> None:
        assert files_of(tmp_path, claim_uid) == [f"{claim_uid}_gpu.json"], "the files come before the spec"
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(CdiSpecDirectory, "write", full_disk)

    engine = simulated_engine(tmp_path, claims)
    await engine.load_state()
    assert "No space left on device" in (await engine.prepare([claim]))[claim[2]].error
    assert files_of(tmp_path, claim[2]) == []


async def test_a_bad_pod_claim_name_refuses_a_new_prepare_but_not_a_prepared_claim(tmp_path: Path) -> None:
    """The annotation is mutable: one edited after the prepare must not break kubelet's retries."""
    claims = MemoryClaims()
    claim = claims.add("edited", {"request": "gpu", "device": "gpu-0"})
    fresh = claims.add(
        "fresh",
        {"request": "gpu", "device": "gpu-1"},
        annotations={"resource.kubernetes.io/pod-claim-name": "../x"},
    )

    async def scenario() -> tuple[str, str]:
        engine = simulated_engine(tmp_path, claims)
        await engine.load_state()
        first = (await engine.prepare([claim]))[claim[2]]
        claims.claims[("default", "edited")]["metadata"]["annotations"] = {
            "resource.kubernetes.io/pod-claim-name": "../x"
        }
        again = (await engine.prepare([claim]))[claim[2]]
        assert again == first
        return again.error, (await engine.prepare([fresh]))[fresh[2]].error

    again, refused = await scenario()
    assert again == ""
    assert (
        "metadata.annotations['resource.kubernetes.io/pod-claim-name']: '../x' is not a DNS label" in refused
    )
    assert files_of(tmp_path, fresh[2]) == []
