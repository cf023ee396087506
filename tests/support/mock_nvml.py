"""The mock libnvidia-ml.so.1 (tests/mock_nvml/mock_nvml.c): building it, describing a simulated
node to it, laying out a driver root and a sysfs tree around it, and injecting faults.

The node file is rendered from the same catalog and the same node-name-derived UUIDs as the
simulated backend, so the NVML backend over the mock and the simulated backend describe the same
GPUs, and any difference between them is a bug in one of the two.
"""

import ctypes.util
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver.hardware.model import Gpu, MigMode
from dra_driver.hardware.nvml import _ARCHITECTURES, _BRANDS
from dra_driver.hardware.simulated_nodes import (
    SimulatedNodeSpec,
    mig_instance_uuid,
    resolve_node_spec,
    simulated_gpus,
)

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "mock_nvml" / "mock_nvml.c"
LIBRARY = REPO / "build" / "mock-nvml" / "libnvidia-ml.so.1"
LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
MIB = 2**20
_MIG_MODES = {MigMode.UNSUPPORTED: 0, MigMode.DISABLED: 1, MigMode.ENABLED: 2}
_ARCHITECTURE_CODES = {name: code for code, name in _ARCHITECTURES.items()}
_BRAND_CODES = {name: code for code, name in _BRANDS.items()}


# On a machine with an NVIDIA driver installed, the default search path finds its NVML whatever
# the driver root: there is no "driver missing" to test.
HOST_HAS_NVML = ctypes.util.find_library("nvidia-ml") is not None
WITHOUT_HOST_NVML = pytest.mark.skipif(HOST_HAS_NVML, reason="this machine has its own libnvidia-ml")


def build_library() -> Path:
    """Builds the mock with `make mock-nvml` (which rebuilds only when the source is newer)."""
    if not LIBRARY.exists() or LIBRARY.stat().st_mtime < SOURCE.stat().st_mtime:
        result = subprocess.run(
            ["make", "--no-print-directory", "-s", "mock-nvml"],
            check=False,
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"building the mock NVML library failed:\n{result.stdout}{result.stderr}")
    return LIBRARY


def _cuda_integer(version: str) -> int:
    major, _, minor = version.partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


def _fabric(clique: str | None) -> str:
    if clique is None:
        return "-"
    cluster, _, clique_id = clique.rpartition(".")
    return f"{uuid.UUID(cluster).hex}:{clique_id}"


def _gpu_lines(gpu: Gpu, max_gpu_instances: int, boot: Iterable[tuple[int, int, int]]) -> list[str]:
    major, minor = gpu.cuda_compute_capability.split(".")
    lines = [
        " ".join(
            map(
                str,
                (
                    "gpu",
                    gpu.uuid,
                    gpu.minor,
                    gpu.pci_bus_id,
                    "233010de",
                    _ARCHITECTURE_CODES[gpu.architecture],
                    _BRAND_CODES[gpu.brand],
                    major,
                    minor,
                    gpu.memory_bytes // MIB,
                    gpu.multiprocessors,
                    _MIG_MODES[gpu.mig_mode],
                    max_gpu_instances,
                    _fabric(gpu.fabric_clique),
                    gpu.product_name,
                ),
            )
        )
    ]
    for profile in gpu.mig_profiles:
        placements = " ".join(f"{p.start} {p.size}" for p in profile.placements)
        lines.append(
            f"profile {profile.nvml_enum} {profile.profile_id} {profile.compute_slices} "
            f"{profile.max_instances} {profile.multiprocessors} {profile.copy_engines} {profile.decoders} "
            f"{profile.encoders} {profile.jpeg_engines} {profile.ofa_engines} {profile.memory_bytes // MIB} "
            f"{len(profile.placements)} {placements}"
        )
    for gpu_instance_id in range(1, max_gpu_instances + 1):
        for profile in gpu.mig_profiles:
            for placement in profile.placements:
                mig_uuid = mig_instance_uuid(gpu.uuid, gpu_instance_id, profile.profile_id, placement.start)
                lines.append(f"miguuid {gpu_instance_id} {profile.profile_id} {placement.start} {mig_uuid}")
    lines += [f"instance {gi} {profile_id} {start}" for gi, profile_id, start in boot]
    return lines


def render_node(node_name: str, spec: SimulatedNodeSpec) -> str:
    """The mock's node file for `spec` on node `node_name` (format: the comment in mock_nvml.c)."""
    lines = [f"driver {spec.driver_version}", f"cuda {_cuda_integer(spec.cuda_driver_version)}"]
    gpus = simulated_gpus(node_name, spec)
    for gpu, group in zip(gpus, spec.group_of_each_gpu(), strict=True):
        geometry = group.model.mig
        boot = [(i.gpu_instance_id, i.profile_id, i.placement.start) for i in gpu.mig_instances]
        lines += _gpu_lines(gpu, geometry.max_gpu_instances if geometry else 0, boot)
    return "\n".join(lines) + "\n"


def make_sysfs(root: Path, gpus: Iterable[Gpu]) -> Path:
    """A sysfs with each GPU's PCI device under its PCIe root, its NUMA node and its IOMMU group, as
    the simulated backend reports them; returns the directory to pass as the sysfs root."""
    for gpu in gpus:
        device = root / "devices" / gpu.pcie_root / gpu.pci_bus_id
        device.mkdir(parents=True, exist_ok=True)
        (device / "numa_node").write_text(f"{-1 if gpu.numa_node is None else gpu.numa_node}\n")
        if gpu.iommu_group is not None:
            group = root / "kernel" / "iommu_groups" / str(gpu.iommu_group)
            group.mkdir(parents=True, exist_ok=True)
            (device / "iommu_group").symlink_to(group)
        link = root / "bus" / "pci" / "devices" / gpu.pci_bus_id
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(device)
    return root


# Driver programs the agent requires at start (time slicing, MPS); stand-ins that refuse to run,
# so a test that reached one would fail loudly rather than pass on a fake.
DRIVER_PROGRAMS = ("nvidia-smi", "nvidia-cuda-mps-control")


def make_driver_root(
    root: Path,
    driver_version: str,
    library: Path | None = None,
    library_dir: str = LIBRARY_DIR,
    program_dir: str = "usr/bin",
) -> Path:
    """A driver root holding the mock (`library`, else the one built here) as a real driver
    installs NVML (the versioned file and the SONAME symlink beside it), and the driver programs
    the agent looks for (directories relative to the root)."""
    directory = root / library_dir
    directory.mkdir(parents=True, exist_ok=True)
    versioned = directory / f"libnvidia-ml.so.{driver_version}"
    shutil.copyfile(library or build_library(), versioned)
    (directory / "libnvidia-ml.so.1").symlink_to(versioned.name)
    programs = root / program_dir
    programs.mkdir(parents=True, exist_ok=True)
    for name in DRIVER_PROGRAMS:
        program = programs / name
        program.write_text(f"#!/bin/sh\necho '{name} is not part of the mock driver' >&2\nexit 1\n")
        program.chmod(0o755)
    return root


@dataclass
class MockNode:
    """One node presented by the mock: its files and the environment that points the mock at them."""

    directory: Path
    node_name: str
    spec: SimulatedNodeSpec

    @classmethod
    def create(cls, directory: Path, node_name: str, profile: str | SimulatedNodeSpec) -> "MockNode":
        spec = resolve_node_spec(profile) if isinstance(profile, str) else profile
        node = cls(directory, node_name, spec)
        directory.mkdir(parents=True, exist_ok=True)
        node.node_file.write_text(render_node(node_name, spec))
        node.faults.mkdir(exist_ok=True)
        make_sysfs(node.sysfs, simulated_gpus(node_name, spec))
        return node

    @property
    def node_file(self) -> Path:
        return self.directory / "node.txt"

    @property
    def state_file(self) -> Path:
        return self.directory / "mig-state.txt"

    @property
    def faults(self) -> Path:
        return self.directory / "faults"

    @property
    def sysfs(self) -> Path:
        return self.directory / "sys"

    @property
    def proc(self) -> Path:
        """What stands for /proc: the mock keeps the MIG capability files there."""
        return self.directory / "proc"

    @property
    def pci_devices(self) -> Path:
        return self.sysfs / "bus" / "pci" / "devices"

    def environment(self) -> dict[str, str]:
        return {
            "MOCK_NVML_NODE": str(self.node_file),
            "MOCK_NVML_STATE": str(self.state_file),
            "MOCK_NVML_FAULTS": str(self.faults),
            "MOCK_NVML_PROC": str(self.proc),
        }

    def xid(self, gpu_index: int, xid: int) -> None:
        """An XID event on the GPU, for the next nvmlEventSetWait_v2 watching it."""
        name = f"xid-{time.time_ns():020d}-{gpu_index}-{xid}"
        temporary = self.faults / f".{name}"
        temporary.write_text("")
        temporary.replace(self.faults / name)

    def lose(self, gpu_index: int) -> None:
        """The GPU falls off the bus: XID 79, and GPU_IS_LOST from every call on it from now on."""
        (self.faults / f"lost-{gpu_index}").write_text("")
        self.xid(gpu_index, 79)

    def fail_next(self, function: str, code: int) -> None:
        """The next call of the NVML C function `function` returns `code`."""
        (self.faults / f"fail-{function}").write_text(f"{code}\n")

    def run_processes(self, entries: Iterable[tuple[int, int, int, int, int]]) -> None:
        """(GPU index, GPU instance id or -1, compute instance id or -1, pid, bytes) per process."""
        (self.faults / "processes").write_text("".join(" ".join(map(str, entry)) + "\n" for entry in entries))

    def set_utilization(self, percent_by_gpu: dict[int, int]) -> None:
        """nvmlDeviceGetUtilizationRates(...).gpu of each GPU by index (others: 0)."""
        (self.faults / "utilization").write_text("".join(f"{g} {p}\n" for g, p in percent_by_gpu.items()))

    def set_process_utilization(self, entries: Iterable[tuple[int, int, int]]) -> None:
        """(GPU index, pid, SM percent) per sample nvmlDeviceGetProcessUtilization returns."""
        (self.faults / "process-utilization").write_text("".join(f"{g} {p} {u}\n" for g, p, u in entries))

    def hang(self, function: str) -> Path:
        """Calls of the NVML C function `function` wait until the returned file is removed."""
        path = self.faults / f"hang-{function}"
        path.write_text("")
        return path

    def hung(self, function: str) -> bool:
        """Whether a call of `function` has waited on its `hang` file."""
        return (self.faults / f"hung-{function}").exists()
