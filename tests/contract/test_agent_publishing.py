"""The node agent as a real process publishes its slices, leaves them on SIGTERM, takes them
over on restart without writing, and `dra-driver cleanup` removes them."""

import subprocess
import sys
from pathlib import Path

import yaml

from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.node_config import NodeConfig
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess, start_agent
from tests.support.apiserver import ApiServer
from tests.support.nodes import simulated_node
from tests.support.publishing import SLICES, pool_problems, stored_slices
from tests.support.waiting import wait_until

DGX_H100 = node_inventory(simulated_node("dgx-h100"), NodeConfig())


def cleanup(kubeconfig: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_driver",
            "cleanup",
            "--node-name",
            NODE_NAME,
            "--kubeconfig",
            str(kubeconfig),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_agent_publishes_its_slices_and_leaves_them_on_sigterm(
    agent: AgentProcess, apiserver: ApiServer, agent_dirs: AgentDirs, kubeconfig: Path
) -> None:
    assert pool_problems(apiserver, DGX_H100) == []
    published = stored_slices(apiserver)

    assert agent.terminate() == 0
    assert stored_slices(apiserver) == published

    apiserver.reset_counts()
    restarted = start_agent(agent_dirs, kubeconfig)
    try:
        wait_until(lambda: apiserver.request_count("WATCH", SLICES) >= 1)
        assert apiserver.writes(SLICES) == 0
        assert "resourceslices published" not in restarted.log_events()
    finally:
        restarted.terminate()


def test_cleanup_removes_the_nodes_slices_and_dry_run_only_lists_them(
    agent: AgentProcess, apiserver: ApiServer, kubeconfig: Path
) -> None:
    agent.terminate()
    (name,) = (s["metadata"]["name"] for s in stored_slices(apiserver))

    listed = cleanup(kubeconfig, "--dry-run")
    assert listed.returncode == 0, listed.stderr
    documents = [doc for doc in yaml.safe_load_all(listed.stdout) if doc]
    assert documents == [{"verb": "delete", "name": name, "why": "cleanup"}]
    assert len(stored_slices(apiserver)) == 1

    removed = cleanup(kubeconfig)
    assert removed.returncode == 0, removed.stderr
    assert f"deleted resourceslice {name}" in removed.stdout
    assert stored_slices(apiserver) == []
    assert apiserver.request_count("DELETE", SLICES) == 1


def test_cleanup_reports_an_unreachable_api_server(short_dir: Path) -> None:
    server = ApiServer().start()
    kubeconfig = server.write_kubeconfig(short_dir / "kubeconfig")
    server.stop()

    result = cleanup(kubeconfig)

    assert result.returncode == 1
    assert result.stderr.startswith(
        "dra-driver cleanup: cannot tell whether an agent still serves node-a: LIST pods: no answer"
    )
    assert result.stderr.endswith("; --force skips this check\n")
    forced = cleanup(kubeconfig, "--force")
    assert forced.returncode == 1
    assert forced.stderr.startswith("dra-driver cleanup: LIST resourceslices: no answer")


def test_dry_run_prints_the_writes_and_makes_none(
    apiserver: ApiServer, agent_dirs: AgentDirs, kubeconfig: Path
) -> None:
    process = start_agent(agent_dirs, kubeconfig, extra=("--dry-run",))
    try:
        wait_until(lambda: "# dry run" in process.log_path.read_text())
        wait_until(lambda: apiserver.request_count("WATCH", SLICES) >= 1)
    finally:
        process.terminate()
    text = process.log_path.read_text()
    dry_run = text[text.index("# dry run") :]
    assert dry_run.startswith("# dry run: 1 ResourceSlice write(s) would be made")
    document = next(yaml.safe_load_all(dry_run.split("\n", 1)[1].split("\n{")[0]))
    assert document["verb"] == "create"
    assert document["body"]["spec"]["nodeName"] == NODE_NAME
    assert apiserver.writes(SLICES) == 0


def test_a_bad_sync_delay_stops_the_agent_with_the_flag_named(
    agent_dirs: AgentDirs, kubeconfig: Path
) -> None:
    process = start_agent(agent_dirs, kubeconfig, extra=("--sync-delay", "soon"), wait=False)

    assert process.process.wait(30) == 2
    assert "--sync-delay (DRA_DRIVER_SYNC_DELAY): 'soon' must be a number of seconds" in (
        process.log_path.read_text()
    )
