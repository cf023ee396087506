"""What a node holds after its agent died: the MIG instances on the (simulated) GPUs, the claim
records, the CDI specs and the device metadata files, read straight from disk.

Crash tests must judge the node without the agent's help: right after a SIGKILL there is no
agent to ask, and once one is restarted it has already rolled back whatever the crash left, so
only the files tell what the crash left and whether the restart cleaned it up.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.agent.gpu_platform import SIMULATED_HARDWARE_STATE
from dra_driver.claims.edits.cdi import claim_spec_file_name
from dra_driver.claims.sharing.mps import daemon_pid
from dra_driver.claims.sharing.sharing import MpsDirectories
from dra_driver.claims.status.device_metadata import HOST_SUBDIR
from tests.support.agent import AgentDirs

# A MIG instance as both sides name it: GPU UUID, profile id, placement start and size. The GPU
# instance id is left out: it is whatever the GPU hands out, and no record keeps it.
MigKey = tuple[str, int, int, int]


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    mig_instances: frozenset[MigKey]
    # Claim UID -> the record file's JSON.
    records: dict[str, dict[str, Any]]
    # Claim UIDs that have a CDI spec of this driver.
    cdi_specs: frozenset[str]
    # Every file in the CDI directory, by name: what the container runtime would read.
    cdi_files: frozenset[str]
    # Claim UIDs that have device metadata files (KEP-5304).
    metadata_claims: frozenset[str]
    # Claim UID -> whether its MPS control daemon runs, for every claim with MPS directories.
    mps_daemons: dict[str, bool] = field(default_factory=dict)

    def record_state(self, uid: str) -> str | None:
        """The record's state ("preparing" or "prepared"), or None where the claim has none."""
        record = self.records.get(uid)
        return None if record is None else str(record["state"])

    def instances_named_by(self, uid: str) -> frozenset[MigKey]:
        record = self.records.get(uid)
        if record is None:
            return frozenset()
        return frozenset(
            (entry["gpuUUID"], entry["profileId"], entry["placementStart"], entry["placementSize"])
            for entry in record["migInstances"]
        )

    def mps_named_by_prepared(self) -> frozenset[str]:
        """The prepared claims whose record says they have an MPS daemon."""
        return frozenset(uid for uid in self.prepared_uids() if self.records[uid].get("mps"))

    def prepared_uids(self) -> frozenset[str]:
        return frozenset(uid for uid in self.records if self.record_state(uid) == "prepared")

    def owned_instances(self) -> frozenset[MigKey]:
        """The instances the prepared claims own: all a node at rest may have."""
        owned: frozenset[MigKey] = frozenset()
        for uid in self.prepared_uids():
            owned |= self.instances_named_by(uid)
        return owned


def _mig_instances(state_dir: Path) -> frozenset[MigKey]:
    """The simulated GPUs' instances, as SimulatedBackend keeps them across agent restarts."""
    path = state_dir / SIMULATED_HARDWARE_STATE
    if not path.exists():
        return frozenset()
    saved = json.loads(path.read_text())
    keys = [
        (gpu_uuid, entry["profileId"], entry["start"], entry["size"])
        for gpu_uuid, entries in saved["instances"].items()
        for entry in entries
    ]
    assert len(keys) == len(set(keys)), f"two instances with one placement in {path}: {keys}"
    return frozenset(keys)


def _records(state_dir: Path) -> dict[str, dict[str, Any]]:
    records = {}
    for path in sorted((state_dir / "claims").glob("*.json")):
        record: dict[str, Any] = json.loads(path.read_text())
        records[path.name.removesuffix(".json")] = record
    return records


def _mps_daemons(mps_dir: Path) -> dict[str, bool]:
    """Per claim directory: whether its daemon runs, judged as the agent judges it (the PID
    file names a live process that serves this pipe directory)."""
    if not mps_dir.is_dir():
        return {}
    return {
        entry.name: daemon_pid(MpsDirectories(mps_dir, entry.name)) is not None
        for entry in mps_dir.iterdir()
        if entry.is_dir()
    }


def _metadata_claims(state_dir: Path) -> frozenset[str]:
    """The claim UIDs that name a metadata file, temporary ones included (<uid>_<request>.json)."""
    root = state_dir / HOST_SUBDIR
    names = [path.name for path in root.iterdir()] if root.is_dir() else []
    return frozenset(name.removeprefix(".").partition("_")[0] for name in names)


def snapshot(dirs: AgentDirs) -> NodeSnapshot:
    files = frozenset(path.name for path in dirs.cdi_dir.iterdir()) if dirs.cdi_dir.is_dir() else frozenset()
    prefix, suffix = claim_spec_file_name(dirs.driver_name, "{uid}").split("{uid}")
    return NodeSnapshot(
        mig_instances=_mig_instances(dirs.state_dir),
        records=_records(dirs.state_dir),
        cdi_specs=frozenset(
            name.removeprefix(prefix).removesuffix(suffix)
            for name in files
            if name.startswith(prefix) and name.endswith(suffix)
        ),
        cdi_files=files,
        mps_daemons=_mps_daemons(dirs.root / "mps"),
        metadata_claims=_metadata_claims(dirs.state_dir),
    )
