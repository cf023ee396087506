"""The device metadata files of `device_metadata` on the host: written at prepare, removed at
unprepare, and found by claim UID at start-up.

Each file is replaced atomically (a container never sees half of one) but not fsynced. Durability
would buy nothing: after a power loss the node has a new boot ID, every record is dropped and
kubelet prepares its claims again, and a killed agent loses nothing that reached the page cache.
An fsync, on the other hand, would cost every prepare a disk flush per request.
"""

from collections.abc import Iterable, Sequence
from pathlib import Path

from dra_driver.claims.status import device_metadata
from dra_driver.claims.status.device_metadata import RequestMetadata, host_file_prefix
from dra_driver.kube.k8s_names import uid_problem
from dra_driver.state import durable_files

# Read by every user a container may run as; written only by the agent.
FILE_MODE = 0o644


class DeviceMetadataDirectory:
    """<state-dir>/dra-device-metadata: one file per claim and request, named by claim UID."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / device_metadata.HOST_SUBDIR
        # What the pure module builds host paths (and so CDI mounts) from.
        self.root = str(self.directory)

    def path_for(self, claim_uid: str, request: str) -> str:
        return device_metadata.host_path(self.root, claim_uid, request)

    def write(self, claim_uid: str, files: Sequence[RequestMetadata]) -> None:
        for metadata in files:
            path = self.path_for(claim_uid, metadata.request)
            try:
                durable_files.atomic_write(path, metadata.content, durable=False, mode=FILE_MODE)
            except FileNotFoundError:
                # The first prepare on this node, or an operator removed the directory.
                self.directory.mkdir(parents=True, exist_ok=True)
                durable_files.atomic_write(path, metadata.content, durable=False, mode=FILE_MODE)

    def remove(self, claim_uid: str, requests: Iterable[str] | None = None) -> None:
        """Removes the claim's files: those of `requests` where the caller knows them (a prepared
        claim's record does), else every file of the claim, found by its UID, temporary files a
        crash left among them."""
        if requests is not None:
            for request in requests:
                durable_files.unlink_if_present(self.path_for(claim_uid, request))
            return
        prefix = host_file_prefix(claim_uid)
        for entry in self._entries():
            if entry.name.removeprefix(".").startswith(prefix):
                durable_files.unlink_if_present(entry)

    def claim_uids(self) -> set[str]:
        """The claims that have a file here (or a temporary one). A name that does not start with
        a claim UID is not ours to judge, and is left alone."""
        uids = set()
        for entry in self._entries():
            uid, separator, _ = entry.name.removeprefix(".").partition(device_metadata.HOST_SEPARATOR)
            if separator and uid_problem(uid) is None:
                uids.add(uid)
        return uids

    def _entries(self) -> list[Path]:
        try:
            return list(self.directory.iterdir())
        except FileNotFoundError:
            return []
