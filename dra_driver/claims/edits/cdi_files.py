"""Writing the specs of `cdi` where the container runtime reads them.

Kept apart from the spec model so that the pure planners, which build container edits, import no
file I/O (the import contract in pyproject.toml checks this).
"""

import os
from pathlib import Path

from dra_driver.base.compact_json import compact_json
from dra_driver.claims.edits.cdi import (
    SPEC_SUFFIX,
    CdiSpec,
    ContainerEdits,
    claim_spec_prefix,
    node_spec,
    node_spec_file_name,
)
from dra_driver.state import durable_files


class CdiSpecDirectory:
    """The CDI directory the container runtime reads (/var/run/cdi in clusters).

    Specs live on tmpfs there and are rebuilt after a reboot, so writes are atomic but not fsynced.
    Such a write of a few kilobytes takes tens of microseconds, less than a hop to a worker thread
    costs, so the engine calls these methods on the event loop. Specs are written compact: runtimes
    do not care, and the indenting encoder is pure Python, several times slower than the C one.
    """

    def __init__(self, directory: Path, driver_name: str) -> None:
        self.directory = directory
        self._driver_name = driver_name
        # Every claim spec's path is this plus "<claim UID>.json".
        self._claim_path_start = os.path.join(directory, claim_spec_prefix(driver_name))

    def path_for(self, claim_uid: str) -> Path:
        return Path(self._claim_path(claim_uid))

    def _claim_path(self, claim_uid: str) -> str:
        # A string, not a Path: built on every prepare and unprepare.
        return f"{self._claim_path_start}{claim_uid}{SPEC_SUFFIX}"

    @property
    def node_spec_path(self) -> Path:
        return self.directory / node_spec_file_name(self._driver_name)

    def claim_uids(self) -> set[str]:
        """The claims that have a spec file of this driver here."""
        prefix = claim_spec_prefix(self._driver_name)
        if not self.directory.is_dir():
            return set()
        return {
            path.name.removeprefix(prefix).removesuffix(SPEC_SUFFIX)
            for path in self.directory.glob(f"{prefix}*{SPEC_SUFFIX}")
        }

    def _write(self, path: durable_files.StrPath, spec: CdiSpec) -> None:
        data = compact_json(spec.to_json()) + b"\n"
        try:
            durable_files.atomic_write(path, data, durable=False)
        except FileNotFoundError:
            # The directory went away (a tmpfs remounted, or an operator's cleanup): make it again.
            self.directory.mkdir(parents=True, exist_ok=True)
            durable_files.atomic_write(path, data, durable=False)

    def write(self, claim_uid: str, spec: CdiSpec) -> None:
        self._write(self._claim_path(claim_uid), spec)

    def write_node_spec(self, common: ContainerEdits) -> Path:
        """Replaces the node spec whole, so a container starting meanwhile sees old or new edits."""
        self._write(self.node_spec_path, node_spec(self._driver_name, common))
        return self.node_spec_path

    def remove(self, claim_uid: str) -> None:
        durable_files.remove(self._claim_path(claim_uid), durable=False)
