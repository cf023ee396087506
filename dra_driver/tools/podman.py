"""podman as a real CDI consumer: runs a container with the CDI devices prepare returned.

Used by the demo and the node tests. podman resolves CDI IDs with the upstream CDI library, so
a spec it accepts is a spec containerd and CRI-O accept too. No image can be pulled here, so a
busybox image is built locally from the host's static busybox.
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from dra_driver.base.errors import TransientFault

IMAGE = "localhost/dra-driver-busybox:latest"
BUSYBOX = Path("/bin/busybox")
_APPLETS = ("sh", "env", "cat", "ls", "grep", "sort")
# Some VMs forbid raising rlimits, which podman does by default; an empty list leaves them alone.
_CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n"
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))


class PodmanError(TransientFault, RuntimeError):
    """podman is missing, or a podman command failed; the message says which and why."""


def podman_problem() -> str | None:
    """Why podman cannot run containers here, or None if it can."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman runc busybox-static)"
    if os.geteuid() != 0:
        return "podman containers with CDI devices need root here"
    if not BUSYBOX.is_file():
        return f"{BUSYBOX} is missing (apt-get install busybox-static) to build the test image"
    return None


def _podman(*args: str, config_dir: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    conf = config_dir / "containers.conf"
    if not conf.exists():
        conf.write_text(_CONTAINERS_CONF)
    runtime = ["--runtime", runc] if (runc := shutil.which("runc")) else []
    command = ["podman", *runtime, "--cgroup-manager", "cgroupfs", *args]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "CONTAINERS_CONF": str(conf)},
    )


def ensure_image(config_dir: Path) -> None:
    if _podman("image", "exists", IMAGE, config_dir=config_dir).returncode == 0:
        return
    with tempfile.TemporaryDirectory() as root:
        bin_dir = Path(root, "bin")
        bin_dir.mkdir()
        shutil.copy2(BUSYBOX, bin_dir / "busybox")
        for applet in _APPLETS:
            (bin_dir / applet).symlink_to("busybox")
        archive = Path(root, "image.tar")
        subprocess.run(["tar", "-C", root, "-cf", str(archive), "bin"], check=True)
        result = _podman("import", str(archive), IMAGE, config_dir=config_dir)
    if result.returncode != 0:
        raise PodmanError(f"podman import of the busybox image failed: {result.stderr.strip()}")


def run_with_cdi_devices(cdi_device_ids: list[str], shell_command: str, rootfs: Path | None = None) -> str:
    """Runs `shell_command` in a fresh container given `cdi_device_ids`; returns its stdout.

    `rootfs`: a directory to run as the container's root instead of the busybox image (a test's
    own; podman makes the mount points of CDI mounts in it)."""
    if problem := podman_problem():
        raise PodmanError(problem)
    with tempfile.TemporaryDirectory() as config_dir:
        if rootfs is None:
            ensure_image(Path(config_dir))
        image = [IMAGE] if rootfs is None else ["--rootfs", str(rootfs)]
        devices = [arg for cdi_id in cdi_device_ids for arg in ("--device", cdi_id)]
        result = _podman(
            "run",
            "--rm",
            "--ulimit",
            "host",
            "--network",
            "none",
            *devices,
            *image,
            "/bin/sh",
            "-c",
            shell_command,
            config_dir=Path(config_dir),
        )
    if result.returncode != 0:
        raise PodmanError(f"podman run failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout
