"""`dra-driver kubelet-client` as an operator runs it: YAML out, exit status meaningful, the
sockets of a running agent found without naming them, and the agent's readiness left alone
unless the operator asks for kubelet's whole handshake."""

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.support.agent import AgentDirs, AgentProcess, start_agent
from tests.support.claims import allocate


def kubelet_client(*args: str) -> tuple[int, Any, str]:
    result = subprocess.run(
        [sys.executable, "-m", "dra_driver", "kubelet-client", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result.returncode, yaml.safe_load(result.stdout) if result.stdout else None, result.stderr


def readyz(agent: AgentProcess) -> int:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{agent.metrics_port()}/readyz", timeout=10
        ) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_register_only_looks_unless_told_to_notify(agent: AgentProcess) -> None:
    """A look at a node must not make the agent report a kubelet registration that never was."""
    socket_flag = ("--registration-socket", str(agent.dirs.registration_socket))
    code, answer, stderr = kubelet_client("register", *socket_flag)

    assert code == 0
    assert answer["kubeletWouldRegister"] is True
    assert answer["notified"] is False
    assert answer["selectedService"] == "v1.DRAPlugin"
    assert answer["pluginInfo"]["endpoint"] == str(agent.dirs.dra_socket)
    assert "NotifyRegistrationStatus not sent" in stderr
    assert readyz(agent) == 503

    code, answer, _ = kubelet_client("register", *socket_flag, "--notify")

    assert code == 0
    assert (answer["registered"], answer["notified"]) == (True, True)
    assert readyz(agent) == 200


def test_a_rejected_registration_exits_non_zero(agent: AgentProcess) -> None:
    code, answer, _ = kubelet_client(
        "register", "--registration-socket", str(agent.dirs.registration_socket), "--reject", "testing"
    )

    assert code == 1
    assert answer["registered"] is False
    assert answer["error"] == "testing"


def test_prepare_and_unprepare_print_the_answer(
    agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    uid = allocate(claims_api, "cli", {"gpu": "gpu-7"}, pool="node-a")
    socket = str(agent.dirs.dra_socket)

    code, answer, _ = kubelet_client(
        "prepare", "--socket", socket, "--api", "v1beta1", "--claim", f"default/cli/{uid}"
    )
    assert code == 0
    assert answer["claims"][uid]["devices"][0]["device_name"] == "gpu-7"

    code, answer, _ = kubelet_client("unprepare", "--socket", socket, "--claim", f"default/cli/{uid}")
    assert (code, answer) == (0, {"claims": {uid: {"error": ""}}})


def test_a_claim_error_exits_non_zero_and_is_printed(agent: AgentProcess) -> None:
    uid = "11111111-2222-4333-8444-555555555555"
    code, answer, _ = kubelet_client(
        "prepare", "--socket", str(agent.dirs.dra_socket), "--claim", f"default/absent/{uid}"
    )

    assert code == 1
    assert "not found" in answer["claims"][uid]["error"]


def dead_socket(path: Path) -> Path:
    """A socket file nobody serves on, as an agent killed without cleaning up leaves it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(path))
    return path


def test_usage_errors_exit_2_and_a_dead_plugin_exits_1(short_dir: Path) -> None:
    code, _, stderr = kubelet_client(
        "prepare", "--socket", str(short_dir / "none.sock"), "--claim", "default/x"
    )
    assert (code, stderr) == (
        2,
        "dra-driver kubelet-client: --claim: claim 'default/x': expected <namespace>/<name>/<uid>\n",
    )

    dead = str(dead_socket(short_dir / "dead.sock"))
    code, _, stderr = kubelet_client("prepare", "--socket", dead, "--claim", "a/b/c")
    assert code == 1
    assert stderr.startswith(f"dra-driver kubelet-client: v1 NodePrepareResources on {dead}: ")
    assert "UNAVAILABLE" in stderr
    assert stderr.count("\n") == 1


POD_UID = "0f3c5a7e-9b1d-4f2a-8c6e-1a3b5c7d9e0f"
STALE_POD_UID = "6d8f0a2c-4e6a-4b8c-9d0e-2f4a6c8e0a1b"


def test_the_sockets_of_a_pod_uid_agent_are_found_and_dead_ones_skipped(
    short_dir: Path, kubeconfig: Path, claims_api: client.ResourceV1Api
) -> None:
    dirs = AgentDirs(root=short_dir / "node")
    agent = start_agent(dirs, kubeconfig, extra=("--pod-uid", POD_UID))
    try:
        agent.wait_for_log("resourceslices published")
        # Sockets an agent killed earlier left behind, newer than the live ones.
        later = time.time() + 60
        for stale in (
            dead_socket(dirs.plugins_dir / dirs.driver_name / f"dra-{STALE_POD_UID}.sock"),
            dead_socket(dirs.registrar_dir / f"{dirs.driver_name}-{STALE_POD_UID}-reg.sock"),
        ):
            os.utime(stale, (later, later))

        code, answer, _ = kubelet_client("register", "--registrar-dir", str(dirs.registrar_dir))
        assert code == 0
        assert answer["pluginInfo"]["endpoint"] == str(
            dirs.plugins_dir / dirs.driver_name / f"dra-{POD_UID}.sock"
        )

        uid = allocate(claims_api, "found", {"gpu": "gpu-3"}, pool="node-a")
        code, answer, _ = kubelet_client(
            "prepare", "--plugins-dir", str(dirs.plugins_dir), "--claim", f"default/found/{uid}"
        )
        assert code == 0
        assert answer["claims"][uid]["devices"][0]["device_name"] == "gpu-3"
    finally:
        agent.terminate()

    code, _, stderr = kubelet_client("prepare", "--plugins-dir", str(dirs.plugins_dir), "--claim", "a/b/c")
    assert code == 1
    assert stderr == (
        f"dra-driver kubelet-client: no live DRA socket of {dirs.driver_name} in "
        f"{dirs.plugins_dir / dirs.driver_name}; found dra-{STALE_POD_UID}.sock (Connection refused)\n"
    )


def test_no_socket_at_all_says_where_it_looked(short_dir: Path) -> None:
    code, _, stderr = kubelet_client("register", "--registrar-dir", str(short_dir))

    assert code == 1
    assert stderr == (
        f"dra-driver kubelet-client: no registration socket of gpu.dra-driver.dev in {short_dir} "
        "(looked for gpu.dra-driver.dev-reg.sock or gpu.dra-driver.dev-<pod uid>-reg.sock); "
        "is the agent running?\n"
    )
