"""A real CDI consumer: podman starts a container with the CDI IDs that prepare returned.

podman resolves the IDs through the upstream CDI library against the spec files the agent wrote
into /var/run/cdi, so this proves the files, their version and the IDs are what runtimes accept.
"""

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from dra_driver import kubelet_client, podman
from dra_driver.hardware.simulated_nodes import resolve_node_spec, simulated_gpus
from dra_driver.kubelet_client import ClaimArg
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess, start_agent
from tests.support.claims import allocate

# A driver name of the test's own, so its spec files cannot clash with anything else in /var/run/cdi.
DRIVER = "gpu.podman-test.dra-driver.dev"


@pytest.fixture
def require_podman() -> None:
    problem = podman.podman_problem()
    if problem is None:
        return
    if os.environ.get("DRA_DRIVER_REQUIRE_PODMAN") == "1":
        pytest.fail(f"DRA_DRIVER_REQUIRE_PODMAN=1 but {problem}")
    pytest.skip(problem)


@pytest.fixture
def podman_agent(require_podman: None, short_dir: Path, kubeconfig: Path) -> Iterator[AgentProcess]:
    dirs = AgentDirs(root=short_dir / "node", driver_name=DRIVER)
    agent = start_agent(dirs, kubeconfig, extra=("--cdi-dir", str(podman.CDI_DIRS[1])))
    yield agent
    agent.terminate()


def test_container_sees_the_gpus_prepare_returned(
    podman_agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    uid = allocate(claims_api, "pair", {"first": "gpu-2", "second": "gpu-5"}, pool=NODE_NAME, driver=DRIVER)
    claim = ClaimArg("default", "pair", uid)
    sockets = podman_agent.dirs
    answer = asyncio.run(kubelet_client.prepare(sockets.dra_socket, "v1", [claim]))["claims"][uid]
    assert answer["error"] == ""
    cdi_ids = [cdi_id for device in answer["devices"] for cdi_id in device["cdi_device_ids"]]
    try:
        seen = podman.run_with_cdi_devices(cdi_ids, "env | grep ^DRA_ | sort")
    finally:
        unprepared = asyncio.run(kubelet_client.unprepare(sockets.dra_socket, "v1", [claim]))
    gpus = simulated_gpus(NODE_NAME, resolve_node_spec("dgx-h100"))

    assert seen.splitlines() == [
        f"DRA_DEVICE_GPU_2={gpus[2].uuid}",
        "DRA_DEVICE_GPU_2_PRODUCT_NAME=NVIDIA H100 80GB HBM3",
        f"DRA_DEVICE_GPU_5={gpus[5].uuid}",
        "DRA_DEVICE_GPU_5_PRODUCT_NAME=NVIDIA H100 80GB HBM3",
    ]
    assert unprepared["claims"][uid]["error"] == ""
    assert not (podman.CDI_DIRS[1] / f"k8s.{DRIVER}-claim_{uid}.json").exists()


def test_an_unprepared_claim_can_no_longer_be_used_by_a_container(
    podman_agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    uid = allocate(claims_api, "done", {"gpu": "gpu-0"}, pool=NODE_NAME, driver=DRIVER)
    claim = ClaimArg("default", "done", uid)
    socket = podman_agent.dirs.dra_socket
    cdi_ids = asyncio.run(kubelet_client.prepare(socket, "v1", [claim]))["claims"][uid]["devices"][0][
        "cdi_device_ids"
    ]
    asyncio.run(kubelet_client.unprepare(socket, "v1", [claim]))

    with pytest.raises(podman.PodmanError, match="unresolvable CDI devices"):
        podman.run_with_cdi_devices(cdi_ids, "true")
