"""`dra-driver cleanup` against the stand-in API server: which kubeconfig it reads (as kubectl
would), which slices it deletes (one node, or with --all-nodes every node, never another
driver's), and that it leaves a node alone while an agent pod still runs there."""

from pathlib import Path
from typing import Any

import pytest

from dra_driver.cli import main
from dra_driver.devices.inventory import node_inventory
from dra_driver.devices.node_config import NodeConfig
from dra_driver.devices.slices import plan_slices, slices_to_api
from tests.support.apiserver import ApiServer
from tests.support.nodes import simulated_node
from tests.support.publishing import DRIVER, SLICES, add_node, json_request, stored_slices

OTHER_DRIVER = "other.example.com"
AGENT_NAMESPACE = "dra-driver"


def publish(server: ApiServer, node: str, driver: str = DRIVER) -> None:
    """The slices an agent on `node` would publish, created as it would."""
    inventory = node_inventory(simulated_node("t4x4", node), NodeConfig())
    for body in slices_to_api(plan_slices(inventory, "1.35"), driver, node):
        json_request("POST", f"{server.url}/apis/resource.k8s.io/v1/resourceslices", body)


def agent_pod(server: ApiServer, name: str, node: str, phase: str, driver: str = DRIVER) -> None:
    """A pod of the shipped DaemonSet for `driver`, as kubelet reports it."""
    path = f"{server.url}/api/v1/namespaces/{AGENT_NAMESPACE}/pods"
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dra-driver"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "agent",
                    "image": "dra-driver",
                    "env": [{"name": "DRA_DRIVER_NAME", "value": driver}],
                }
            ],
        },
    }
    created = json_request("POST", path, pod)
    json_request("PUT", f"{path}/{name}/status", {**created, "status": {"phase": phase}})


def owners(server: ApiServer) -> list[tuple[str, str]]:
    return sorted({(s["spec"]["driver"], s["spec"]["nodeName"]) for s in stored_slices(server)})


@pytest.fixture
def cluster(apiserver: ApiServer) -> ApiServer:
    add_node(apiserver, "node-b")
    publish(apiserver, "node-a")
    publish(apiserver, "node-b")
    publish(apiserver, "node-a", OTHER_DRIVER)
    return apiserver


def cleanup(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["cleanup", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cleanup_refuses_while_an_agent_pod_runs_on_the_node_unless_forced(
    cluster: ApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent_pod(cluster, "dra-driver-abcde", "node-a", "Running")
    agent_pod(cluster, "dra-driver-old", "node-a", "Succeeded")  # finished: no agent
    agent_pod(cluster, "dra-driver-fghij", "node-b", "Running")  # another node's
    agent_pod(cluster, "other-klmno", "node-a", "Running", OTHER_DRIVER)  # another installation's
    flags = ("--node-name", "node-a", "--kubeconfig", str(kubeconfig))

    code, _, err = cleanup(capsys, *flags)

    assert code == 1
    assert err == (
        "dra-driver cleanup: an agent still serves node-a (dra-driver/dra-driver-abcde on node-a), "
        "and would publish its slices again; uninstall it first, or give --force\n"
    )
    assert (DRIVER, "node-a") in owners(cluster)

    code, out, _ = cleanup(capsys, *flags, "--force")

    assert code == 0
    assert out.endswith(f"1 ResourceSlice(s) of {DRIVER} on node-a removed\n")
    assert owners(cluster) == [(DRIVER, "node-b"), (OTHER_DRIVER, "node-a")]


def test_a_dry_run_lists_what_an_uninstall_leaves_while_the_agent_still_runs(
    cluster: ApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting nothing, it needs no refusal: an operator lists the slices before uninstalling."""
    agent_pod(cluster, "dra-driver-abcde", "node-a", "Running")

    code, out, err = cleanup(capsys, "--node-name", "node-a", "--kubeconfig", str(kubeconfig), "--dry-run")

    assert code == 0, err
    assert "resourceslice" in out.lower()
    assert err == (
        "dra-driver cleanup: note: an agent still serves node-a (dra-driver/dra-driver-abcde on node-a), "
        "and would publish its slices again; uninstall it first, or give --force "
        "(a real cleanup would be refused)\n"
    )
    assert (DRIVER, "node-a") in owners(cluster)


def test_all_nodes_removes_the_drivers_slices_of_every_node_and_no_other_drivers(
    cluster: ApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent_pod(cluster, "dra-driver-fghij", "node-b", "Pending")
    flags = ("--all-nodes", "--kubeconfig", str(kubeconfig))

    code, _, err = cleanup(capsys, *flags)
    assert code == 1
    assert "an agent still serves every node (dra-driver/dra-driver-fghij on node-b)" in err

    json_request("DELETE", f"{cluster.url}/api/v1/namespaces/{AGENT_NAMESPACE}/pods/dra-driver-fghij")
    code, out, err = cleanup(capsys, *flags)

    assert code == 0, err
    assert out.endswith(f"2 ResourceSlice(s) of {DRIVER} on every node removed\n")
    assert owners(cluster) == [(OTHER_DRIVER, "node-a")]
    assert cluster.request_count("DELETE", SLICES) == 2


def test_the_kubeconfig_is_found_as_kubectl_finds_it(
    cluster: ApiServer,
    kubeconfig: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{kubeconfig}")

    code, _, err = cleanup(capsys, "--node-name", "node-a", "--dry-run")

    assert code == 0
    assert err == (
        f"dra-driver cleanup: using {kubeconfig}, the first existing file of KUBECONFIG "
        "(kubectl would merge all 2; this command reads only that one)\n"
    )

    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".kube").mkdir()
    cluster.write_kubeconfig(tmp_path / ".kube" / "config")

    code, out, err = cleanup(capsys, "--node-name", "node-b")

    assert (code, err) == (0, "")
    assert out.endswith(f"1 ResourceSlice(s) of {DRIVER} on node-b removed\n")
    assert (DRIVER, "node-b") not in owners(cluster)
