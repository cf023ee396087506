"""The registration handshake and socket lifecycle, over real unix sockets, as kubelet sees them."""

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

from dra_driver.hardware.simulated_nodes import DEFAULT_DRIVER_VERSION
from dra_driver.tools import kubelet_client
from tests.support.agent import AgentDirs, AgentProcess, start_agent
from tests.support.apiserver import ApiServer
from tests.support.claims import allocate
from tests.support.mock_nvml import make_driver_root
from tests.support.waiting import until


async def test_handshake_reports_dra_plugin_with_v1_first(agent: AgentProcess) -> None:
    result = await kubelet_client.register(agent.dirs.registration_socket)

    assert result["pluginInfo"] == {
        "type": "DRAPlugin",
        "name": "gpu.dra-driver.dev",
        "endpoint": str(agent.dirs.dra_socket),
        # The health services follow the DRAPlugin versions (kubelet 1.37 picks one of them).
        "supported_versions": [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ],
    }
    assert result["selectedService"] == "v1.DRAPlugin"
    assert result["registered"] is True
    assert result["notifyResponseError"] == ""
    assert agent.wait_for_log("registered with kubelet")["endpoint"] == str(agent.dirs.dra_socket)


async def test_rejected_registration_is_logged_and_answered_with_an_error(agent: AgentProcess) -> None:
    result = await kubelet_client.register(agent.dirs.registration_socket, reject_reason="driver name clash")

    assert result["registered"] is False
    assert result["notifyResponseError"].startswith("FAILED_PRECONDITION")
    line = agent.wait_for_log("kubelet rejected the registration")
    assert line["level"] == "error"
    assert line["kubelet_error"] == "driver name clash"


def test_sockets_are_unix_sockets_at_the_documented_paths(agent: AgentProcess) -> None:
    for path in (agent.dirs.registration_socket, agent.dirs.dra_socket):
        assert stat.S_ISSOCK(path.lstat().st_mode), path
    assert agent.dirs.registration_socket.name == "gpu.dra-driver.dev-reg.sock"
    assert agent.dirs.dra_socket == agent.dirs.plugins_dir / "gpu.dra-driver.dev" / "dra.sock"


def _leave_stale_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a killed agent leaves behind


async def test_stale_sockets_are_replaced(agent_dirs: AgentDirs, kubeconfig: Path) -> None:
    _leave_stale_socket(agent_dirs.registration_socket)
    _leave_stale_socket(agent_dirs.dra_socket)

    agent = start_agent(agent_dirs, kubeconfig)
    try:
        assert (await kubelet_client.register(agent_dirs.registration_socket))["registered"]
    finally:
        agent.terminate()


def test_a_non_socket_file_in_the_way_stops_the_start_with_one_line(
    agent_dirs: AgentDirs, kubeconfig: Path
) -> None:
    agent_dirs.registration_socket.parent.mkdir(parents=True)
    agent_dirs.registration_socket.write_text("operator notes")

    agent = start_agent(agent_dirs, kubeconfig, wait=False)

    assert agent.process.wait(30) == 1
    assert agent_dirs.registration_socket.read_text() == "operator notes"
    last = agent.log_path.read_text().strip().splitlines()[-1]
    expected = f"{agent_dirs.registration_socket} exists and is not a socket; refusing to replace it"
    assert last == f"dra-driver node: {expected}"


async def test_a_second_agent_does_not_take_over_live_sockets(agent: AgentProcess, kubeconfig: Path) -> None:
    second = start_agent(agent.dirs, kubeconfig, wait=False)

    assert second.process.wait(30) == 1
    assert f"dra-driver node: {agent.dirs.dra_socket} is in use: another process serves on it" in (
        second.log_path.read_text()
    )
    assert (await kubelet_client.register(agent.dirs.registration_socket))["registered"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_removes_both_sockets_and_exits_cleanly(agent: AgentProcess, sig: signal.Signals) -> None:
    assert agent.terminate(sig) == 0
    assert not agent.dirs.registration_socket.exists()
    assert not agent.dirs.dra_socket.exists()
    assert "stopped serving kubelet; sockets removed" in agent.log_events()


async def test_in_flight_prepare_finishes_before_sockets_go(
    agent: AgentProcess, apiserver: ApiServer, claims_api: client.ResourceV1Api
) -> None:
    uid = allocate(claims_api, "slow", {"gpu": "gpu-0"}, pool="node-a")
    apiserver.faults.latency_seconds = 1.5
    received_before = apiserver.requests_received
    call = asyncio.create_task(
        kubelet_client.prepare(agent.dirs.dra_socket, "v1", [kubelet_client.ClaimArg("default", "slow", uid)])
    )
    await until(lambda: apiserver.requests_received > received_before)  # prepare waits on the GET now

    assert await asyncio.to_thread(agent.terminate) == 0
    answer = await asyncio.wait_for(call, 10)

    assert answer["claims"][uid] == {
        "devices": answer["claims"][uid]["devices"],
        "error": "",
    }
    assert answer["claims"][uid]["devices"][0]["device_name"] == "gpu-0"
    assert not agent.dirs.dra_socket.exists()
    assert not agent.dirs.registration_socket.exists()


def _run_node(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_") and k != "NODE_NAME"}
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", "node", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base_env, **(env or {})},
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ((), {}, "--node-name (NODE_NAME) is required"),
        (("--node-name", "Node_A"), {}, "--node-name (NODE_NAME): 'Node_A' is not a DNS subdomain"),
        (
            ("--node-name", "a", "--driver-name", "nvidia.com/gpu"),
            {},
            "--driver-name (DRA_DRIVER_NAME): 'nvidia.com/gpu' is not a DNS subdomain",
        ),
        (
            (),
            {"NODE_NAME": "a", "DRA_DRIVER_HARDWARE": "simulated"},
            "--hardware (DRA_DRIVER_HARDWARE): 'simulated' is not 'nvml' or 'simulated:<profile name or YAML",
        ),
        (
            ("--node-name", "a", "--cdi-dir", "relative/cdi"),
            {},
            "--cdi-dir (DRA_DRIVER_CDI_DIR): 'relative/cdi' must be an absolute path",
        ),
        (
            ("--node-name", "a"),
            {"DRA_DRIVER_HOST_ROOT": "run/nvidia/driver"},
            "--host-driver-root (DRA_DRIVER_HOST_ROOT): 'run/nvidia/driver' must be an absolute path",
        ),
        (
            ("--node-name", "a", "--log-format", "xml"),
            {},
            "--log-format (DRA_DRIVER_LOG_FORMAT): 'xml' must be 'json' or 'console'",
        ),
        (("--node-name", "a", "--plugins-dir", "/" + "p" * 100), {}, "unix sockets allow at most 105"),
        (
            ("--node-name", "a"),
            {"DRA_DRIVER_VERBOSITY": "lots"},
            "DRA_DRIVER_VERBOSITY: 'lots' must be a non-negative integer",
        ),
        (
            ("--node-name", "a"),
            {"POD_UID": "../../etc"},
            "--pod-uid (POD_UID): '../../etc' is not a Kubernetes UID",
        ),
    ],
)
def test_invalid_options_fail_at_start_with_one_clear_line(
    args: tuple[str, ...], env: dict[str, str], expected: str
) -> None:
    result = _run_node(*args, env=env)

    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("dra-driver node: ")
    assert expected in result.stderr


def _run_node_until_start_fails(
    kubeconfig: Path, short_dir: Path, *options: str
) -> subprocess.CompletedProcess[str]:
    """Valid options except `options`, which are expected to stop the agent during start."""
    return _run_node(
        "--node-name",
        "a",
        *options,
        "--kubeconfig",
        str(kubeconfig),
        "--registrar-dir",
        str(short_dir / "r"),
        "--plugins-dir",
        str(short_dir / "p"),
        "--log-format",
        "json",
    )


@pytest.mark.parametrize(
    ("hardware", "expected", "status"),
    [
        # A simulated node that cannot be is the operator's input: 2.
        ("simulated:dgx-h999", "unknown simulated node profile 'dgx-h999'; known profiles: ", 2),
        # GPUs that cannot be reached are a failure of the node: 1. The library is there (the
        # mock, with no node to present), the driver is not loaded. A missing library is waited
        # for instead: test_agent_on_mock_nvml.
        ("nvml", "NVML nvmlInit failed: Driver Not Loaded", 1),
    ],
)
def test_unusable_hardware_fails_at_start_with_one_clear_line(
    hardware: str, expected: str, status: int, kubeconfig: Path, short_dir: Path
) -> None:
    driver_root = make_driver_root(short_dir / "driver", DEFAULT_DRIVER_VERSION)
    result = _run_node_until_start_fails(
        kubeconfig, short_dir, "--hardware", hardware, "--driver-root", str(driver_root)
    )

    assert result.returncode == status
    assert result.stderr.count("\n") == 1, result.stderr
    # The operator's input is refused as an option, naming its variable; a node that fails names
    # the value it was started with.
    named = "--hardware (DRA_DRIVER_HARDWARE): " if status == 2 else f"--hardware {hardware}: "
    assert f"dra-driver node: {named}" in result.stderr
    assert expected in result.stderr


def test_a_malformed_node_config_file_stops_the_start_with_exit_2(kubeconfig: Path, short_dir: Path) -> None:
    """A GPU the file does not fit is left out while the agent serves (test_node_config_changes);
    a file given on the command line that is not a node config at all is refused at start."""
    node_config = short_dir / "node.yaml"
    node_config.write_text("gpus: [{model: A100, mode: gpu}]\n")
    result = _run_node_until_start_fails(
        kubeconfig, short_dir, "--hardware", "simulated:l4x8", "--node-config", str(node_config)
    )

    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        f"dra-driver node: --node-config (DRA_DRIVER_NODE_CONFIG): node config {node_config}: "
        "gpus[0].model: 'A100' is not a GPU model of the catalog"
    )


def test_named_configs_and_a_single_config_file_exclude_each_other(short_dir: Path) -> None:
    node_config = short_dir / "node.yaml"
    node_config.write_text("default: {mode: gpu}\n")
    both = _run_node("--node-name", "a", "--node-config", str(node_config), "--node-configs", str(short_dir))
    assert both.returncode == 2
    assert both.stderr == (
        "dra-driver node: --node-configs (DRA_DRIVER_NODE_CONFIGS) and --node-config "
        "(DRA_DRIVER_NODE_CONFIG): give one or the other\n"
    )
    not_a_directory = _run_node("--node-name", "a", "--node-configs", str(node_config))
    assert not_a_directory.returncode == 2
    assert (
        f"--node-configs (DRA_DRIVER_NODE_CONFIGS): {node_config} is not a directory"
        in not_a_directory.stderr
    )
    bad_label = _run_node("--node-name", "a", "--node-config-label", "dra-driver.dev/no way")
    assert bad_label.returncode == 2
    assert bad_label.stderr.startswith(
        "dra-driver node: --node-config-label (DRA_DRIVER_NODE_CONFIG_LABEL): "
    )


def test_missing_kubeconfig_fails_at_start_with_one_clear_line(short_dir: Path) -> None:
    result = _run_node(
        "--node-name",
        "a",
        "--hardware",
        "simulated:t4x4",
        "--kubeconfig",
        str(short_dir / "absent"),
        "--log-format",
        "json",
    )

    assert result.returncode == 2
    assert (
        result.stderr == f"dra-driver node: --kubeconfig (KUBECONFIG): {short_dir / 'absent'} is not a file\n"
    )


async def test_options_come_from_environment_variables(agent_dirs: AgentDirs, kubeconfig: Path) -> None:
    env = {
        "NODE_NAME": "node-env",
        "DRA_DRIVER_HARDWARE": "simulated:t4x4",
        "DRA_DRIVER_REGISTRAR_DIR": str(agent_dirs.registrar_dir),
        "DRA_DRIVER_PLUGINS_DIR": str(agent_dirs.plugins_dir),
        "DRA_DRIVER_CDI_DIR": str(agent_dirs.cdi_dir),
        "KUBECONFIG": str(kubeconfig),
        "DRA_DRIVER_LOG_FORMAT": "json",
    }
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dra_driver",
        "node",
        env={**base_env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode()
            if "node agent running" in line:
                assert '"node": "node-env"' in line
                assert '"event_loop": "uvloop"' in line  # commands/event_loop.py
                break
        assert (await kubelet_client.register(agent_dirs.registration_socket))["registered"]
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0
