"""Every `dra-driver` subcommand exits 2 on invalid input, with one line naming the flag.

Scripts and operators tell "you asked for something wrong" (2) from "it failed" (1) by the exit
status alone, so each case here is input that cannot work whatever the node's state.
"""

import ctypes
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dra_driver.cli import main
from dra_driver.health.simulated_faults import GPUS_FILE, INBOX
from tests.support.elf_libraries import HOOKS_SOURCE, gcc


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    # Text the error line must hold (the flag, mostly).
    names: str
    # Files a case needs, made in its temporary directory: relative path -> content.
    files: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)


AGENT_GPUS = json.dumps({"gpus": {"0": "GPU-aaaa", "1": "GPU-bbbb"}})
BAD_NODE_CONFIG = "gpus: [{index: 0, mode: vgpu-partitions, vgpu: {partitions: [{memory: 99Gi}]}}]\n"

CASES = {
    "kubelet-client: a claim without a uid": Case(
        ("kubelet-client", "prepare", "--claim", "default/x"), "--claim: claim 'default/x'"
    ),
    "kubelet-client: --socket that is no socket": Case(
        ("kubelet-client", "prepare", "--socket", "{tmp}/none.sock", "--claim", "a/b/c"), "--socket"
    ),
    "kubelet-client: --registration-socket that is no socket": Case(
        ("kubelet-client", "register", "--registration-socket", "{tmp}/none.sock"), "--registration-socket"
    ),
    "kubelet-client: a driver name that is no DNS subdomain": Case(
        ("kubelet-client", "register", "--driver-name", "Not_A_Driver"), "--driver-name"
    ),
    "demo: a claim file that does not exist": Case(
        ("demo", "--no-container", "--claim", "{tmp}/claims.yaml"), "--claim: claim file"
    ),
    "demo: a claim file that is no claim": Case(
        ("demo", "--no-container", "--claim-file", "{tmp}/claims.yaml"),
        "--claim: claim file",
        files={"claims.yaml": "kind: Pod\n"},
    ),
    "demo: MIG on a node without MIG": Case(
        ("demo", "--no-container", "--claim", "mig", "--hardware", "simulated:l4x8"), "--claim mig"
    ),
    "demo: vGPU on a node all in MIG mode": Case(
        ("demo", "--no-container", "--claim", "vgpu", "--hardware", "simulated:dgx-h100-mig"),
        "--claim vgpu",
    ),
    "demo: an unknown profile": Case(
        ("demo", "--no-container", "--hardware", "simulated:nope"), "--hardware"
    ),
    "demo: hardware that is neither": Case(("demo", "--no-container", "--hardware", "gpus"), "--hardware"),
    "simulate-fault: a state dir that does not exist": Case(
        ("simulate-fault", "--state-dir", "{tmp}/absent", "--gpu", "0", "--lost"), "--state-dir"
    ),
    "simulate-fault: a directory no agent uses": Case(
        ("simulate-fault", "--state-dir", "{tmp}", "--gpu", "0", "--lost"), "not an agent's state directory"
    ),
    "simulate-fault: the state dir of an agent on real GPUs": Case(
        ("simulate-fault", "--state-dir", "{tmp}", "--gpu", "0", "--lost"),
        "does not run simulated GPUs",
        files={"publisher.lock": ""},
    ),
    "simulate-fault: a GPU the node does not have": Case(
        ("simulate-fault", "--state-dir", "{tmp}", "--gpu", "99", "--xid", "48"),
        "--gpu no GPU '99' on this node; GPUs: 0 (GPU-aaaa), 1 (GPU-bbbb)",
        files={f"{INBOX}/{GPUS_FILE}": AGENT_GPUS},
    ),
    "simulate-fault: an XID out of range": Case(
        ("simulate-fault", "--state-dir", "{tmp}", "--gpu", "0", "--xid", "1000"),
        "--xid",
        files={f"{INBOX}/{GPUS_FILE}": AGENT_GPUS},
    ),
    "cleanup: a node name that is no DNS subdomain": Case(
        ("cleanup", "--node-name", "Node_A", "--kubeconfig", "{tmp}/kubeconfig"),
        "--node-name",
        files={"kubeconfig": ""},
    ),
    "cleanup: no node and not --all-nodes": Case(
        ("cleanup", "--kubeconfig", "{tmp}/kubeconfig"),
        "--node-name (NODE_NAME) or --all-nodes is required",
        files={"kubeconfig": ""},
        environment={"NODE_NAME": ""},
    ),
    "cleanup: a kubeconfig that does not exist": Case(
        ("cleanup", "--node-name", "node-a", "--kubeconfig", "{tmp}/absent"), "--kubeconfig"
    ),
    "cleanup: a kubeconfig that is no kubeconfig": Case(
        ("cleanup", "--node-name", "node-a", "--kubeconfig", "{tmp}/kubeconfig"),
        "--kubeconfig {tmp}/kubeconfig: current-context: not set",
        files={"kubeconfig": "apiVersion: v1\nkind: Config\n"},
    ),
    "cleanup: a KUBECONFIG list of missing files": Case(
        ("cleanup", "--node-name", "node-a"),
        "KUBECONFIG: none of {tmp}/a, {tmp}/b is a file",
        environment={"KUBECONFIG": "{tmp}/a:{tmp}/b"},
    ),
    "cleanup: no kubeconfig anywhere and no cluster": Case(
        ("cleanup", "--node-name", "node-a"),
        "--kubeconfig: not given",
        environment={"KUBECONFIG": "", "HOME": "{tmp}", "KUBERNETES_SERVICE_HOST": ""},
    ),
    "inspect: an unknown profile": Case(("inspect", "--hardware", "simulated:nope"), "--hardware"),
    "inspect: a node config that does not fit the GPUs": Case(
        ("inspect", "--hardware", "simulated:t4x4", "--node-config", "{tmp}/node.yaml"),
        "node config {tmp}/node.yaml",
        files={"node.yaml": BAD_NODE_CONFIG},
    ),
    "inspect: a node config that does not exist": Case(
        ("inspect", "--node-config", "{tmp}/absent.yaml"), "--node-config"
    ),
    "validate-config: a relative driver root": Case(
        ("validate-config", "{tmp}/node.yaml", "--hardware", "nvml", "--driver-root", "run/nvidia/driver"),
        "--driver-root",
        files={"node.yaml": "default: {mode: gpu}\n"},
    ),
    "validate-config: an unknown mode": Case(
        ("validate-config", "{tmp}/node.yaml"),
        'default.mode: "mig-dinamic" is not one of',
        files={"node.yaml": "default: {mode: mig-dinamic}\n"},
    ),
    "validate-config: an unknown profile": Case(
        ("validate-config", "{tmp}/node.yaml", "--hardware", "simulated:dgx-h10"),
        "--hardware",
        files={"node.yaml": "default: {mode: gpu}\n"},
    ),
    "manifests: a node config with an unknown mode": Case(
        ("manifests", "--node-config", "{tmp}/node.yaml"),
        "mig-dinamic",
        files={"node.yaml": "default: {mode: mig-dinamic}\n"},
    ),
    "manifests: an unknown simulated profile": Case(
        ("manifests", "--hardware", "simulated:dgx-h10"), "dgx-h10"
    ),
    "plan: a pod shape with a bad memory quantity": Case(
        ("plan", "--node", "simulated:dgx-h100", "--pods", "1x1g.10gb,4xvgpu:10Qi/30%"),
        '--pods[1] "4xvgpu:10Qi/30%": memory "10Qi": expected a quantity like 10Gi',
    ),
    "plan: a MIG profile the GPUs do not offer": Case(
        ("plan", "--node", "simulated:dgx-h100", "--pods", "2x1g.11gb"),
        '--pods[0] "2x1g.11gb": MIG profile "1g.11gb" is not offered',
    ),
    "plan: an unknown simulated profile": Case(
        ("plan", "--node", "simulated:dgx-h10", "--pods", "gpu"), "--node simulated:dgx-h10"
    ),
    "plan: no node": Case(("plan", "--pods", "gpu"), "--node"),
    "plan: a drawing without a file to write it to": Case(
        ("plan", "--node", "simulated:l4x8", "--pods", "gpu", "-o", "svg"), "--output-file"
    ),
    "plan: a live node without its name": Case(
        ("plan", "--kubeconfig", "{tmp}/kubeconfig", "--pods", "gpu"), "--node-name", files={"kubeconfig": ""}
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_invalid_input_exits_2_with_one_line_naming_it(
    case: Case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path))

    for relative, content in case.files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(content)
    for name, value in case.environment.items():
        monkeypatch.setenv(name, fill(value))

    code = main([fill(arg) for arg in case.args])

    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert err.startswith(f"dra-driver {case.args[0]}: "), err
    assert fill(case.names) in err


LIBRARIES = {
    # The same source as the good library, built as CMake's Release mode builds HAMi-core.
    "hidden symbols": (
        ("-shared", "-fPIC", "-fvisibility=hidden"),
        "exports none of cuMemAlloc_v2, cuMemGetInfo_v2, cuLaunchKernel: HAMi-core was built with hidden",
    ),
    "an executable": (("-no-pie",), "is an ELF file of type ET_EXEC (an executable), not a shared object"),
    "a truncated library": (("-shared", "-fPIC"), "is truncated"),
    "a text file": ((), "is not an ELF file"),
}


@pytest.mark.parametrize(("flags", "names"), LIBRARIES.values(), ids=LIBRARIES.keys())
def test_node_refuses_a_hami_core_library_that_cannot_enforce_before_it_runs(
    flags: tuple[str, ...],
    names: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not flags:
        library = tmp_path / "libvgpu.so"
        library.write_text(HOOKS_SOURCE)
    else:
        source = HOOKS_SOURCE + ("int main(void) { return 0; }\n" if "-no-pie" in flags else "")
        library = gcc(tmp_path, "libvgpu.so", source, *flags)
    if names == "is truncated":
        library.write_bytes(library.read_bytes()[:4096])
    # Were the library taken, the agent would stop at once for want of a cluster, exiting 1.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    directories = ("--state-dir", "--plugins-dir", "--registrar-dir", "--cdi-dir")

    code = main(
        [
            "node",
            "--node-name",
            "gpu-node-1",
            "--hardware",
            "simulated:t4x4",
            "--hami-core-library",
            str(library),
        ]
        + [argument for flag in directories for argument in (flag, str(tmp_path / flag.strip("-")))]
    )

    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert err.startswith(
        f"dra-driver node: --hami-core-library (DRA_DRIVER_HAMI_CORE_LIBRARY): {library}: {names}"
    )
    assert not (tmp_path / "state-dir").exists(), "refused before anything ran"


NO_CONTEXT = "apiVersion: v1\nkind: Config\n"
UNREACHABLE = """apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: c, user: u}}]
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: abc}}]
"""
BROKEN_YAML = "default:\n  mode: [gpu\n"
AGENT_DIRS = tuple(
    argument
    for flag in ("--state-dir", "--plugins-dir", "--registrar-dir", "--cdi-dir")
    for argument in (flag, "{tmp}/" + flag.strip("-"))
)
NODE = ("node", "--node-name", "node-a", *AGENT_DIRS)


def _nvml_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Outcome:
    args: tuple[str, ...]
    code: int
    names: str
    files: dict[str, str] = field(default_factory=dict)
    skip: str = ""


OUTCOMES = {
    # A kubeconfig named on the command line: absent or unusable is invalid input, in every command.
    "inspect -o layout: an absent kubeconfig": Outcome(
        ("inspect", "-o", "layout", "--hardware", "simulated:t4x4", "--kubeconfig", "{tmp}/absent"),
        2,
        "--kubeconfig: {tmp}/absent is not a file",
    ),
    "inspect -o layout: a kubeconfig without a context": Outcome(
        ("inspect", "-o", "layout", "--hardware", "simulated:t4x4", "--kubeconfig", "{tmp}/kc"),
        2,
        "--kubeconfig {tmp}/kc: current-context: not set",
        {"kc": NO_CONTEXT},
    ),
    "plan: an absent kubeconfig": Outcome(
        ("plan", "--kubeconfig", "{tmp}/absent", "--node-name", "node-a", "--pods", "gpu"),
        2,
        "--kubeconfig: {tmp}/absent is not a file",
    ),
    "plan: a kubeconfig without a context": Outcome(
        ("plan", "--kubeconfig", "{tmp}/kc", "--node-name", "node-a", "--pods", "gpu"),
        2,
        "--kubeconfig {tmp}/kc: current-context: not set",
        {"kc": NO_CONTEXT},
    ),
    "cleanup: an absent kubeconfig": Outcome(
        ("cleanup", "--kubeconfig", "{tmp}/absent", "--node-name", "node-a"),
        2,
        "--kubeconfig: {tmp}/absent is not a file",
    ),
    "node: an absent kubeconfig": Outcome(
        (*NODE, "--hardware", "simulated:t4x4", "--kubeconfig", "{tmp}/absent"),
        2,
        "--kubeconfig (KUBECONFIG): {tmp}/absent is not a file",
    ),
    "node: a kubeconfig without a context": Outcome(
        (*NODE, "--hardware", "simulated:t4x4", "--kubeconfig", "{tmp}/kc"),
        2,
        "--kubeconfig (KUBECONFIG): {tmp}/kc: current-context: not set",
        {"kc": NO_CONTEXT},
    ),
    # ... while a cluster that does not answer is a run-time failure.
    "plan: a cluster that does not answer": Outcome(
        ("plan", "--kubeconfig", "{tmp}/kc", "--node-name", "node-a", "--pods", "gpu"),
        1,
        "no answer",
        {"kc": UNREACHABLE},
    ),
    "cleanup: a cluster that does not answer": Outcome(
        ("cleanup", "--kubeconfig", "{tmp}/kc", "--node-name", "node-a"),
        1,
        "no answer",
        {"kc": UNREACHABLE},
    ),
    "node: no cluster to run in": Outcome(
        (*NODE, "--hardware", "simulated:t4x4"), 1, "in-cluster config (no --kubeconfig given)"
    ),
    "node: an unknown simulated node, before any cluster": Outcome(
        (*NODE, "--hardware", "simulated:nope"),
        2,
        "--hardware (DRA_DRIVER_HARDWARE): unknown simulated node profile 'nope'; known profiles: a30x4",
    ),
    "inspect: a Kubernetes version 2.0": Outcome(
        ("inspect", "--hardware", "simulated:t4x4", "--kubernetes-version", "2.0"),
        2,
        "--kubernetes-version: '2.0' is not a Kubernetes version MAJOR.MINOR, such as 1.34",
    ),
    "demo: an empty claim file": Outcome(
        ("demo", "--no-container", "--claim", "{tmp}/claims.yaml"),
        2,
        "--claim: claim file {tmp}/claims.yaml: holds no ResourceClaim",
        {"claims.yaml": ""},
    ),
    "demo: a claim kind misspelt": Outcome(
        ("demo", "--no-container", "--claim", "vgpus"), 2, "--claim takes gpu|mig|vgpu|FILE"
    ),
    "demo: a claim file that is no YAML": Outcome(
        ("demo", "--no-container", "--claim", "{tmp}/claims.yaml"),
        2,
        "--claim: claim file {tmp}/claims.yaml: not valid YAML: expected ',' or ']', but got '<stream end>' "
        "at line 3, column 1",
        {"claims.yaml": BROKEN_YAML},
    ),
    "validate-config: a node config that is no YAML": Outcome(
        ("validate-config", "{tmp}/node.yaml"),
        2,
        "node config {tmp}/node.yaml: not valid YAML: ",
        {"node.yaml": BROKEN_YAML},
    ),
    "node: a simulated node file that is no YAML": Outcome(
        (*NODE, "--hardware", "simulated:{tmp}/node.yaml"),
        2,
        "simulated node file {tmp}/node.yaml: not valid YAML: ",
        {"node.yaml": BROKEN_YAML},
    ),
    "inspect: no GPU and no --hardware": Outcome(
        ("inspect", "--driver-root", "{tmp}"),
        1,
        "without a GPU here, pass --hardware simulated:<profile> to inspect a simulated node "
        "(profiles: a30x4, b200x8,",
        skip="NVML loads on this machine: a bare inspect finds its GPUs" if _nvml_loads() else "",
    ),
}


@pytest.mark.parametrize("case", OUTCOMES.values(), ids=OUTCOMES.keys())
def test_every_command_exits_2_for_invalid_input_and_1_for_a_run_time_failure(
    case: Outcome,
    short_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The rule for kubeconfigs: a file the operator names (--kubeconfig, KUBECONFIG) that is
    absent or that no client could use is invalid input, 2, in inspect, plan, cleanup and node
    alike: the command line is what must change. A cluster that does not answer, or no cluster
    at all for an agent given no kubeconfig, is a run-time failure, 1. Every message is one line
    naming the flag or the file (never PyYAML's "<unicode string>"). In a short directory: the
    agent's socket paths must fit a unix socket address, which a worker's tmp_path may not."""
    if case.skip:
        pytest.skip(case.skip)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    for relative, content in case.files.items():
        (short_dir / relative).write_text(content)

    code = main([arg.replace("{tmp}", str(short_dir)) for arg in case.args])

    err = capsys.readouterr().err
    assert code == case.code, err
    assert err.count("\n") == 1, err
    assert err.startswith(f"dra-driver {case.args[0]}: "), err
    assert case.names.replace("{tmp}", str(short_dir)) in err
    assert "<unicode string>" not in err
    assert not (short_dir / "state-dir").exists(), "refused before the agent ran"
