"""The device metadata files of `device_metadata` on the host: written at prepare, removed at
unprepare, and found by claim UID at start-up.

Each file is replaced atomically (a container never sees half of one) but not fsynced. Durability
would buy nothing: after a power loss the node has a new boot ID, every record is dropped and
kubelet prepares its claims again, and a killed agent loses nothing that reached the page cache.
An fsync, on the other hand, would cost every prepare a disk flush per request.
"""

from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path, PurePosixPath

from dra_driver.claims import device_metadata
from dra_driver.claims.device_metadata import RequestMetadata
from dra_driver.kube.k8s_names import uid_problem
from dra_driver.state import durable_files

# Read by every user a container may run as; written only by the agent.
FILE_MODE = 0o644
DIRECTORY_MODE = 0o755


class DeviceMetadataDirectory:
    """<state-dir>/dra-device-metadata: one directory per claim UID, one file per request."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / device_metadata.HOST_SUBDIR

    @property
    def root(self) -> PurePosixPath:
        """What the pure module builds host paths (and so CDI mounts) from."""
        return PurePosixPath(self.directory)

    def claim_directory(self, claim_uid: str) -> Path:
        return self.directory / claim_uid

    def write(self, claim_uid: str, files: Sequence[RequestMetadata]) -> None:
        if not files:
            return
        claim_directory = self.claim_directory(claim_uid)
        claim_directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        for metadata in files:
            path = device_metadata.host_path(self.root, claim_uid, metadata.request)
            durable_files.atomic_write(path, metadata.content, durable=False, mode=FILE_MODE)

    def remove(self, claim_uid: str) -> bool:
        """Removes the claim's files (and any temporary one a crash left) and their directory;
        returns whether there was anything to remove."""
        claim_directory = self.claim_directory(claim_uid)
        try:
            entries = list(claim_directory.iterdir())
        except FileNotFoundError:
            return False
        for entry in entries:
            durable_files.unlink_if_present(entry)
        with suppress(FileNotFoundError):
            claim_directory.rmdir()
        return True

    def claim_uids(self) -> set[str]:
        """The claims that have a directory here. Anything not named like a claim UID is not
        ours to judge, and is left alone."""
        try:
            entries = list(self.directory.iterdir())
        except FileNotFoundError:
            return set()
        return {entry.name for entry in entries if uid_problem(entry.name) is None}
