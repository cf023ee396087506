"""`dra-driver kubelet-client` as an operator runs it: YAML out, exit status meaningful."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.support.agent import AgentProcess
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


def test_register_prints_the_handshake(agent: AgentProcess) -> None:
    code, answer, _ = kubelet_client("register", "--registration-socket", str(agent.dirs.registration_socket))

    assert code == 0
    assert answer["registered"] is True
    assert answer["selectedService"] == "v1.DRAPlugin"
    assert answer["pluginInfo"]["endpoint"] == str(agent.dirs.dra_socket)


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


def test_usage_errors_are_one_line(short_dir: Path) -> None:
    code, _, stderr = kubelet_client(
        "prepare", "--socket", str(short_dir / "none.sock"), "--claim", "default/x"
    )
    assert (code, stderr) == (
        1,
        "dra-driver kubelet-client: claim 'default/x': expected <namespace>/<name>/<uid>\n",
    )

    code, _, stderr = kubelet_client("prepare", "--socket", str(short_dir / "none.sock"), "--claim", "a/b/c")
    assert code == 1
    assert stderr.startswith(
        f"dra-driver kubelet-client: v1 NodePrepareResources on {short_dir / 'none.sock'}: "
    )
    assert "UNAVAILABLE" in stderr
    assert stderr.count("\n") == 1
