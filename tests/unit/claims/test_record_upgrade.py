"""Records across releases: what 0.1.0 wrote is read by this code, and what this code writes is
read by 0.1.0 (a rollback), both with 0.1.0's own code, taken from this repository's history."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.claims.effect_entries import (
    ClaimMpsEntry,
    ComputeModeEntry,
    GpuMpsEntry,
    MigInstanceEntry,
    TimeSliceEntry,
    VfioEntry,
)
from dra_driver.claims.identity import claim_ref
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.records import ClaimRecord, DeviceFacts, PreparedDevice

# Release 0.1.0: the last commit whose records had one field per kind of side effect.
RELEASE = "80e924bf4fd13381182deaef7cc26263a650d3e5"
ROOT = Path(__file__).resolve().parents[3]

WHOLE, SHARE, MIG, MPS, VFIO = (f"3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a1{n}" for n in range(5))

# The same five claims in 0.1.0's model and in this one's (the VFIO claim in this one only).
RELEASE_RECORDS = f"""
from dra_driver.claims.identity import claim_ref
from dra_driver.claims.records import (
    ClaimRecord, ComputeModeRecord, DeviceFacts, MigInstanceRecord, PreparedDevice
)

def device(name, **more):
    return PreparedDevice(("gpu",), "node-a", name, (f"k8s.gpu/claim={{name}}",), **more)

RECORDS = [
    ClaimRecord(claim_ref("default", "whole", "{WHOLE}"), (device("gpu-0", exclusive_key="gpu-0"),)),
    ClaimRecord(
        claim_ref("default", "share", "{SHARE}"),
        (device("gpu-1-vgpu", share_id="s-1", memory_limit_bytes=4 << 30, cores_limit=25,
                facts=DeviceFacts("vgpu", "GPU-1", 1)),),
        generation=3,
    ),
    ClaimRecord(
        claim_ref("default", "mig", "{MIG}"), (), state="preparing",
        mig_instances=(MigInstanceRecord("GPU-2", 19, 3, 1),), reserved=("gpu-2-mig-1g10gb-3",),
    ),
    ClaimRecord(
        claim_ref("default", "mps", "{MPS}"),
        (device("gpu-3", exclusive_key="gpu-3", facts=DeviceFacts("gpu", "GPU-3", 3, admin_access=True)),),
        time_sliced_gpus=("GPU-3",), mps=True, mps_gpus=("GPU-4",),
        compute_modes=(ComputeModeRecord("GPU-3", "Prohibited"),),
    ),
]
"""


def _device(name: str, **more: object) -> PreparedDevice:
    return PreparedDevice(("gpu",), "node-a", name, (f"k8s.gpu/claim={name}",), **more)  # type: ignore[arg-type]


RECORDS = [
    ClaimRecord(claim_ref("default", "whole", WHOLE), (_device("gpu-0", exclusive_key="gpu-0"),)),
    ClaimRecord(
        claim_ref("default", "share", SHARE),
        (
            _device(
                "gpu-1-vgpu",
                share_id="s-1",
                memory_limit_bytes=4 << 30,
                cores_limit=25,
                facts=DeviceFacts("vgpu", "GPU-1", 1),
            ),
        ),
        generation=3,
    ),
    ClaimRecord(
        claim_ref("default", "mig", MIG),
        (),
        state="preparing",
        effects=(MigInstanceEntry("GPU-2", 19, 3, 1),),
        reserved=("gpu-2-mig-1g10gb-3",),
    ),
    ClaimRecord(
        claim_ref("default", "mps", MPS),
        (_device("gpu-3", exclusive_key="gpu-3", facts=DeviceFacts("gpu", "GPU-3", 3, admin_access=True)),),
        effects=(
            TimeSliceEntry("GPU-3"),
            ComputeModeEntry("GPU-3", "Prohibited"),
            ClaimMpsEntry(),
            GpuMpsEntry("GPU-4"),
        ),
    ),
]
VFIO_RECORD = ClaimRecord(
    claim_ref("default", "vm", VFIO),
    (_device("gpu-5", exclusive_key="gpu-5"),),
    effects=(VfioEntry("0000:c5:00.0", "nvidia"),),
)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """0.1.0's package, from git history (a clone without it cannot run these tests)."""
    tree = tmp_path_factory.mktemp("release-0.1.0")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", RELEASE, "dra_driver"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        pytest.fail(
            f"release 0.1.0 ({RELEASE}) is not in this clone's history; fetch it (git fetch --unshallow): "
            + archive.stderr.decode(errors="replace").strip()
        )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def _run_release(release: Path, state_dir: Path, action: str) -> dict[str, object]:
    """Runs 0.1.0's record store on `state_dir`: "write" saves its RECORDS; "read" loads what is
    there. Prints each record as 0.1.0 encodes it, and the records it set aside."""
    script = (
        RELEASE_RECORDS
        + f"""
import json, pathlib, dra_driver
from dra_driver.claims.record_store import ClaimRecordStore
assert pathlib.Path(dra_driver.__file__).is_relative_to({str(release)!r}), dra_driver.__file__
store = ClaimRecordStore(pathlib.Path({str(state_dir)!r}))
if {action!r} == "write":
    store.load_all()
    for record in RECORDS:
        store.save(record)
records, quarantined = store.load_all()
print(json.dumps({{
    "records": {{uid: record.to_json() for uid, record in records.items()}},
    "quarantined": sorted(q.problem for q in quarantined),
}}))
"""
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(release), "PATH": "/usr/bin:/bin"},
        cwd=state_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


def test_an_upgrade_reads_every_record_release_0_1_0_wrote(release: Path, tmp_path: Path) -> None:
    _run_release(release, tmp_path, "write")

    records, quarantined = ClaimRecordStore(tmp_path).load_all()

    assert quarantined == []
    assert records == {record.claim.uid: record for record in RECORDS}


def test_a_rollback_to_0_1_0_reads_what_this_release_wrote_and_sets_a_vfio_claim_aside(
    release: Path, tmp_path: Path
) -> None:
    (tmp_path / "old").mkdir()
    written_by_release = _run_release(release, tmp_path / "old", "write")
    store = ClaimRecordStore(tmp_path / "new")
    store.load_all()
    for record in [*RECORDS, VFIO_RECORD]:
        store.save(record)

    read_by_release = _run_release(release, tmp_path / "new", "read")

    assert read_by_release["records"] == written_by_release["records"], "as 0.1.0 wrote them itself"
    assert read_by_release["quarantined"] == ["version: expected one of (1, 2), got 3"]
