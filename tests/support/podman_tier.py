"""The node tier's podman support: skipped where it cannot run, unless CI insists, and the one
simulated node that module-scoped podman tests share."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kubernetes import client, config

from dra_driver.tools import podman
from tests.support.agent import AgentDirs, AgentProcess, start_agent
from tests.support.apiserver import ApiServer
from tests.support.publishing import add_node


def require_podman() -> None:
    """Skips the calling test where podman cannot run here; fails it instead when
    DRA_DRIVER_REQUIRE_PODMAN=1 (CI), so a missing install step cannot pass as a skip."""
    problem = podman.podman_problem()
    if problem is None:
        return
    if os.environ.get("DRA_DRIVER_REQUIRE_PODMAN") == "1":
        pytest.fail(f"DRA_DRIVER_REQUIRE_PODMAN=1 but {problem}")
    pytest.skip(problem)


@contextmanager
def simulated_node(
    driver: str, hardware: str, node_config: str
) -> Iterator[tuple[AgentProcess, client.ResourceV1Api]]:
    """One agent on simulated `hardware` writing CDI specs where podman reads them, with its own
    stand-in API server: module-scoped fixtures cannot use conftest's function-scoped ones, and
    sharing one agent means each test pays only for its containers. The root is short for the
    108-byte socket path limit; the agent must exit cleanly on the way out."""
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    server = ApiServer().start()
    try:
        add_node(server)
        kubeconfig = server.write_kubeconfig(root / "kubeconfig")
        node_config_path = root / "node-config.yaml"
        node_config_path.write_text(node_config)
        api_client = config.new_client_from_config(str(kubeconfig))
        agent = start_agent(
            AgentDirs(root=root / "node", driver_name=driver),
            kubeconfig,
            hardware=f"simulated:{hardware}",
            extra=("--cdi-dir", str(podman.CDI_DIRS[1]), "--node-config", str(node_config_path)),
        )
        try:
            yield agent, client.ResourceV1Api(api_client)
        finally:
            assert agent.terminate() == 0
            api_client.close()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
