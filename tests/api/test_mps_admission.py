"""The admission policy for the MPS daemon pods, run by the real CEL engine (cel-expr-python) on
pods the agent makes (`daemon_pod`, as the agent of the default installation would) and on pods
it must never be able to make. The policy's expressions are taken from the rendered manifest."""

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from dra_driver.claims.mps import SimulatedMps
from dra_driver.claims.mps_pod_spec import MpsPodSettings, daemon_pod
from dra_driver.claims.sharing import MpsDaemonSpec, MpsDirectories
from dra_driver.hardware import simulated_mps_control
from dra_driver.tools.manifests import ManifestOptions, render
from dra_driver.tools.manifests.access import service_account_username
from dra_driver.tools.manifests.options import CONTAINER_DRIVER_ROOT
from tests.support.admission_policy import denials, user_info

OPTIONS = ManifestOptions()
CLAIM = "0b7c4d6e-1f2a-4b3c-8d9e-0a1b2c3d4e5f"
GPU = "GPU-0000000a-aaaa-bbbb-cccc-dddddddddddd"
NODE = "node-a"
MPS_DIR = Path(f"/run/{OPTIONS.name}/mps")
REAL_CONTROL = f"{CONTAINER_DRIVER_ROOT}/usr/bin/nvidia-cuda-mps-control"

Pod = dict[str, Any]


def policy() -> dict[str, Any]:
    (found,) = [
        item
        for item in render(OPTIONS)
        if item["kind"] == "ValidatingAdmissionPolicy"
        and "pods" in item["spec"]["matchConstraints"]["resourceRules"][0]["resources"]
    ]
    return found


POLICY = policy()


def admit(operation: str, pod: Pod, node: str | None = NODE) -> list[str]:
    """The denial messages the API server would answer the agent's token with (none: admitted)."""
    user = user_info(service_account_username(OPTIONS.namespace, OPTIONS.name), node)
    deleted = operation == "DELETE"
    found = denials(
        POLICY,
        "pods",
        {"operation": operation, "userInfo": user},
        None if deleted else pod,
        pod if deleted else None,
    )
    assert found is not None, "the policy must apply to every pod write of the agent"
    return found


def agent_pod(*, real: bool = True) -> Pod:
    """The pod the default installation's agent makes for CLAIM: the driver root's control
    program, privileged, on real GPUs; the simulated one, unprivileged, on simulated nodes."""
    environment: Mapping[str, str]
    if real:
        command: tuple[str, ...] = (REAL_CONTROL, "-f")
        environment = {"PATH": "/usr/bin", "LD_PRELOAD": f"{CONTAINER_DRIVER_ROOT}/usr/lib/libcuda.so.580"}
    else:
        command, environment = SimulatedMps(MPS_DIR).foreground_command()
        command = ("/usr/local/bin/python3.11", *command[1:])
    settings = MpsPodSettings(
        namespace=OPTIONS.namespace,
        node_name=NODE,
        image=OPTIONS.image,
        driver_root=Path(CONTAINER_DRIVER_ROOT),
        host_driver_root=Path(OPTIONS.driver_root),
        command=command,
        environment=environment,
        privileged=real,
    )
    return daemon_pod(MpsDaemonSpec(MpsDirectories(MPS_DIR, CLAIM), (GPU,)), settings)


@pytest.mark.parametrize("real", [True, False], ids=["nvidia", "simulated"])
def test_the_agent_may_create_and_delete_the_daemon_pods_it_makes(real: bool) -> None:
    assert admit("CREATE", agent_pod(real=real)) == []
    assert admit("DELETE", agent_pod(real=real)) == []


def _changed(change: Callable[[Pod], None]) -> Pod:
    pod = copy.deepcopy(agent_pod())
    change(pod)
    return pod


def _container(pod: Pod) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


FORBIDDEN: dict[str, tuple[Callable[[Pod], None], str]] = {
    "other node": (lambda pod: pod["spec"].update(nodeName="node-b"), "bound to its own node"),
    "no node": (lambda pod: pod["spec"].pop("nodeName"), "bound to its own node"),
    "not a daemon": (
        lambda pod: pod["metadata"]["labels"].pop("app.kubernetes.io/component"),
        "may only create",
    ),
    "name of another claim": (lambda pod: pod["metadata"].update(name="mps-other"), "may only create"),
    "bad claim uid": (
        lambda pod: pod["metadata"]["labels"].update({"resource.kubernetes.io/claim-uid": "../x"}),
        "may only create",
    ),
    "other image": (
        lambda pod: _container(pod).update(image="evil.example/shell:1"),
        "the agent's own image",
    ),
    "other command": (
        lambda pod: _container(pod).update(command=["/bin/sh", "-c", "id"]),
        "the daemon's command",
    ),
    "program outside the driver root": (
        lambda pod: _container(pod).update(command=["/tmp/nvidia-cuda-mps-control", "-f"]),
        "the daemon's command",
    ),
    "escaping the driver root": (
        lambda pod: _container(pod).update(
            command=[f"{CONTAINER_DRIVER_ROOT}/../tmp/nvidia-cuda-mps-control", "-f"]
        ),
        "the daemon's command",
    ),
    "extra args": (lambda pod: _container(pod).update(args=["-d"]), "the daemon's command"),
    "privileged simulated daemon": (
        lambda pod: _container(pod).update(
            command=["/usr/bin/python3", "-m", simulated_mps_control.MODULE, "-f"]
        ),
        "the daemon's command",
    ),
    "another Python program": (
        lambda pod: _container(pod).update(
            command=["/usr/bin/python3", "-c", "import os", "-f"], securityContext={"privileged": False}
        ),
        "the daemon's command",
    ),
    "another Python module": (
        lambda pod: _container(pod).update(
            command=["/usr/bin/python3", "-m", "http.server", "-f"], securityContext={"privileged": False}
        ),
        "the daemon's command",
    ),
    "extra hostPath": (
        lambda pod: pod["spec"]["volumes"].append({"name": "etc", "hostPath": {"path": "/etc"}}),
        "only the driver root",
    ),
    "another claim's directory": (
        lambda pod: pod["spec"]["volumes"][1]["hostPath"].update(
            path=f"{MPS_DIR}/6a0e1c2b-3d4f-4a5b-8c6d-7e8f9a0b1c2d"
        ),
        "only the driver root",
    ),
    "driver root writable": (
        lambda pod: _container(pod)["volumeMounts"][0].update(readOnly=False),
        "mounted read-only",
    ),
    "host PID": (lambda pod: pod["spec"].update(hostPID=True), "none of the host's"),
    "host IPC": (lambda pod: pod["spec"].update(hostIPC=True), "none of the host's"),
    "host network": (lambda pod: pod["spec"].update(hostNetwork=True), "none of the host's"),
    "capabilities": (
        lambda pod: _container(pod)["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}),
        "no added capabilities",
    ),
    "second container": (
        lambda pod: pod["spec"]["containers"].append({**_container(pod), "name": "two"}),
        "one container",
    ),
    "init container": (lambda pod: pod["spec"].update(initContainers=[_container(pod)]), "one container"),
    "service account token": (
        lambda pod: pod["spec"].update(automountServiceAccountToken=True),
        "no service account token",
    ),
}


@pytest.mark.parametrize("case", sorted(FORBIDDEN))
def test_the_agent_may_not_create_any_other_pod(case: str) -> None:
    change, expected = FORBIDDEN[case]

    denials = admit("CREATE", _changed(change))

    assert denials and all(message.startswith(("the node agent", "an MPS daemon pod")) for message in denials)
    assert any(expected in message for message in denials), denials


def test_the_agent_may_delete_only_daemon_pods_on_its_own_node() -> None:
    assert admit("DELETE", _changed(lambda pod: pod["spec"].update(nodeName="node-b")))
    assert admit("DELETE", _changed(lambda pod: pod["metadata"].update(labels={})))


def test_a_token_without_a_node_creates_nothing() -> None:
    assert "the node agent's service-account token must be bound to a pod on a node" in admit(
        "CREATE", agent_pod(), node=None
    )
