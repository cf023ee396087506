"""The host side of HAMi-core enforcement: per-claim directories and files the CDI mounts name.

They are runtime state like the CDI specs: created before the spec that mounts them, removed
with the claim, and swept at start when no prepared claim owns them (a crash in between).
"""

import shutil
from collections.abc import Sequence
from pathlib import Path

from dra_driver.claims.edits.vgpu_edits import HamiCore, HostDirectory, HostEntry, HostFile
from dra_driver.kube.k8s_names import uid_problem
from dra_driver.state import durable_files


def create_host_entries(entries: Sequence[HostEntry]) -> None:
    for entry in entries:
        path = Path(entry.path)
        match entry:
            case HostDirectory(mode=mode):
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(mode)
            case HostFile(content=content, mode=mode):
                path.parent.mkdir(parents=True, exist_ok=True)
                durable_files.atomic_write(path, content.encode(), durable=False, mode=mode)


def remove_claim_directory(hami_core: HamiCore, claim_uid: str) -> None:
    shutil.rmtree(Path(hami_core.claim_dir(claim_uid)), ignore_errors=True)


def claim_directory_uids(hami_core: HamiCore) -> set[str]:
    """The claims that have a directory; entries whose names are not claim UIDs are not ours."""
    claims = Path(hami_core.state_dir) / "claims"
    if not claims.is_dir():
        return set()
    return {entry.name for entry in claims.iterdir() if uid_problem(entry.name) is None}
