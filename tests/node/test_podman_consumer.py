"""A real CDI consumer: podman starts a container with the CDI IDs that prepare returned.

podman resolves the IDs through the upstream CDI library against the spec files the agent wrote
into /var/run/cdi, so this proves the files, their version and the IDs are what runtimes accept.
"""

import os
import platform
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from dra_driver.claims.edits.cdi import common_device_id
from dra_driver.claims.edits.cdi_files import CdiSpecDirectory
from dra_driver.claims.edits.driver_edits import common_edits, control_device_nodes
from dra_driver.hardware.driver_root import DeviceRoot, discover_driver
from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from dra_driver.tools import kubelet_client, podman
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support import podman_tier
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess, start_agent
from tests.support.claims import allocate

# A driver name of the test's own, so its spec files cannot clash with anything else in /var/run/cdi.
DRIVER = "gpu.podman-test.dra-driver.dev"


@pytest.fixture
def require_podman() -> None:
    podman_tier.require_podman()


@pytest.fixture
def podman_agent(require_podman: None, short_dir: Path, kubeconfig: Path) -> Iterator[AgentProcess]:
    dirs = AgentDirs(root=short_dir / "node", driver_name=DRIVER)
    agent = start_agent(dirs, kubeconfig, extra=("--cdi-dir", str(podman.CDI_DIRS[1])))
    yield agent
    agent.terminate()


async def test_container_sees_the_gpus_prepare_returned(
    podman_agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    uid = allocate(claims_api, "pair", {"first": "gpu-2", "second": "gpu-5"}, pool=NODE_NAME, driver=DRIVER)
    claim = ClaimArg("default", "pair", uid)
    sockets = podman_agent.dirs
    answer = (await kubelet_client.prepare(sockets.dra_socket, "v1", [claim]))["claims"][uid]
    assert answer["error"] == ""
    cdi_ids = [cdi_id for device in answer["devices"] for cdi_id in device["cdi_device_ids"]]
    try:
        seen = podman.run_with_cdi_devices(cdi_ids, "env | grep ^DRA_ | sort")
    finally:
        unprepared = await kubelet_client.unprepare(sockets.dra_socket, "v1", [claim])
    gpus = simulated_gpus(NODE_NAME, resolve_node_spec("dgx-h100"))

    assert seen.splitlines() == [
        f"DRA_DEVICE_GPU_2={gpus[2].uuid}",
        "DRA_DEVICE_GPU_2_PRODUCT_NAME=NVIDIA H100 80GB HBM3",
        f"DRA_DEVICE_GPU_5={gpus[5].uuid}",
        "DRA_DEVICE_GPU_5_PRODUCT_NAME=NVIDIA H100 80GB HBM3",
    ]
    assert unprepared["claims"][uid]["error"] == ""
    assert not (podman.CDI_DIRS[1] / f"k8s.{DRIVER}-claim_{uid}.json").exists()


async def test_an_unprepared_claim_can_no_longer_be_used_by_a_container(
    podman_agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    uid = allocate(claims_api, "done", {"gpu": "gpu-0"}, pool=NODE_NAME, driver=DRIVER)
    claim = ClaimArg("default", "done", uid)
    socket = podman_agent.dirs.dra_socket
    cdi_ids = (await kubelet_client.prepare(socket, "v1", [claim]))["claims"][uid]["devices"][0][
        "cdi_device_ids"
    ]
    await kubelet_client.unprepare(socket, "v1", [claim])

    with pytest.raises(podman.PodmanError, match="unresolvable CDI devices"):
        podman.run_with_cdi_devices(cdi_ids, "true")


def test_the_node_spec_gives_a_container_the_driver_files_and_control_nodes(
    require_podman: None, tmp_path: Path
) -> None:
    """A driver root of fake files and a dev root whose control nodes are copies of /dev/null:
    podman must accept the spec (CDI 0.5.0 for the nodes' hostPath) and the container must see
    the library at its SONAME path, read-only, and the nodes as character devices."""
    root = tmp_path / "driver"
    library = root / "usr/lib64/libnvidia-ml.so.580.95.05"
    library.parent.mkdir(parents=True)
    library.write_text("fake NVML 580.95.05\n")
    (root / "usr/lib64/libnvidia-ml.so.1").symlink_to(library.name)
    (root / "dev").mkdir()
    for node in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        os.mknod(root / "dev" / node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    # A driver name of this test run's own: the spec lands in the runtime's real CDI directory.
    driver = f"n{secrets.token_hex(4)}.podman-test.dra-driver.dev"
    edits = common_edits(
        discover_driver(root, "580.95.05"),
        control_device_nodes(DeviceRoot(root, root)),
        root,
        platform.machine(),
    )
    spec_path = CdiSpecDirectory(podman.CDI_DIRS[1], driver).write_node_spec(edits)
    try:
        seen = podman.run_with_cdi_devices(
            [common_device_id(driver)],
            "cat /usr/lib64/libnvidia-ml.so.1; for n in /dev/nvidia*; do [ -c $n ] && echo $n; done; "
            "(echo changed > /usr/lib64/libnvidia-ml.so.1) 2>/dev/null || echo read-only",
        )
    finally:
        spec_path.unlink()

    assert seen.splitlines() == [
        "fake NVML 580.95.05",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidiactl",
        "read-only",
    ]
