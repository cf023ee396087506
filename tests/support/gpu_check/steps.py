"""The GPU check's steps: small functions over one shared Context, each returning its checks.

A step raises to fail (the runner turns the exception into a failed check) and returns a `skip`
check when what it needs is not there. Steps that use one agent and one claim take a Phase
(`whole`, `vgpu` under HAMi-core, `mps` under vgpu.enforcement mps), so another way of sharing a
GPU is a new Phase and a few more entries in `gpu_steps`, not a new program.

Nothing here changes a GPU setting: NVML is only read, and no GPU tool is run.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client, config

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess, start_agent
from tests.support.apiserver import ApiServer
from tests.support.claims import allocate_results
from tests.support.gpu_check import judge
from tests.support.gpu_check.cdi_apply import Edits, edits_for, missing_host_paths
from tests.support.gpu_check.namespace import NamespaceRun, host_fact, start_under_edits
from tests.support.gpu_check.report import Check, Status
from tests.support.publishing import add_node, stored_slices

WORKLOAD = Path(__file__).with_name("workload.py")
SHARE_MEMORY_GIB = 8
SHARE_CORES = 25
SHARE = {"shareID": "3f0c2a9e-8b7d-4c6e-9a5f-1d2e3c4b5a69"}
# The MPS phase: two shares of half the GPU, run at once, each get 40-60 % of the unshared rate.
PAIR_CORES = 50
PAIR_SHARES = ("6c1d3b0f-9e8a-4d7c-b6a5-2e3f4a5b6c7d", "7d2e4c1a-0f9b-4e8d-a7b6-3f4a5b6c7d8e")
PAIR_MATMUL_SECONDS = 12.0
# The docs' words for HAMi-core's compute limit on current CUDA (docs/devices.md, "vGPU isolation").
HAMI_CORE_COMPUTE_GAP = (
    "HAMi-core does not hold a share's compute on current CUDA (docs/devices.md, vGPU isolation)"
)


def vgpu_node_config(enforcement: str) -> str:
    return f"gpus:\n  - {{index: 0, mode: vgpu-capacity, vgpu: {{enforcement: {enforcement}}}}}\n"


@dataclass(frozen=True)
class Options:
    out: Path
    # Short: the agent's sockets live below it (108 bytes at most).
    scratch: Path
    hami_source: Path | None = None
    # How the agent finds its NVML (a driver root, for the mock) and the environment it needs.
    agent_args: tuple[str, ...] = ()
    agent_env: Mapping[str, str] = field(default_factory=dict)
    workload: tuple[str, ...] = (sys.executable, str(WORKLOAD))
    # The workload's environment before the edits: ours without PYTHONPATH, so the workload's
    # Python finds its own packages (PyTorch's) rather than the check's.
    workload_env: Mapping[str, str] = field(
        default_factory=lambda: {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    )
    hold_gib: int = 4
    matmul_seconds: float = 4.0


@dataclass
class Phase:
    """One agent and the one claim prepared through it."""

    name: str
    server: ApiServer | None = None
    agent: AgentProcess | None = None
    dirs: AgentDirs | None = None
    api: client.ResourceV1Api | None = None
    uid: str = ""
    edits: Edits | None = None
    running: NamespaceRun | None = None
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    # More claims prepared through the same agent (the MPS phase's pair), by claim name.
    more: dict[str, tuple[str, Edits]] = field(default_factory=dict)


@dataclass
class Context:
    options: Options
    phases: dict[str, Phase] = field(default_factory=dict)
    hami_build: subprocess.Popen[bytes] | None = None
    hami_library: Path | None = None
    settings_before: dict[str, Any] = field(default_factory=dict)

    def phase(self, name: str) -> Phase:
        return self.phases.setdefault(name, Phase(name))

    def close(self) -> None:
        """Whatever a failed or timed-out step left running."""
        for phase in self.phases.values():
            if phase.running:
                _release(phase)
                phase.running.finish(10)
            _stop(phase)
        if self.hami_build and self.hami_build.poll() is None:
            self.hami_build.kill()
            self.hami_build.wait()


StepRun = Callable[[Context, float], list[Check]]


@dataclass(frozen=True)
class Step:
    name: str
    timeout_s: float
    run: StepRun


def _skip(name: str, why: str) -> list[Check]:
    return [Check(name, "skip", why)]


# --- the GPU's settings, read before and after -----------------------------------------------


def read_settings() -> dict[str, Any]:
    """Compute mode, MIG mode and persistence of every GPU, through NVML's getters only."""
    import pynvml  # noqa: PLC0415 - only the GPU steps need NVML in this process

    pynvml.nvmlInit()
    try:
        settings: dict[str, Any] = {"driver": pynvml.nvmlSystemGetDriverVersion()}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                mig: Any = pynvml.nvmlDeviceGetMigMode(handle)[0]
            except pynvml.NVMLError_NotSupported:
                mig = "unsupported"
            settings[f"gpu{index}"] = {
                "name": pynvml.nvmlDeviceGetName(handle),
                "compute_mode": pynvml.nvmlDeviceGetComputeMode(handle),
                "mig_mode": mig,
                "persistence": pynvml.nvmlDeviceGetPersistenceMode(handle),
            }
        return settings
    finally:
        pynvml.nvmlShutdown()


def settings_before(ctx: Context, timeout: float) -> list[Check]:
    ctx.settings_before = read_settings()
    return [Check("GPU settings read", "pass", numbers=ctx.settings_before)]


def settings_after(ctx: Context, timeout: float) -> list[Check]:
    if not ctx.settings_before:
        return _skip("compute mode, MIG mode and persistence unchanged", "nothing read before")
    return [judge.settings_unchanged(ctx.settings_before, read_settings())]


# --- HAMi-core, built as its build.sh does ----------------------------------------------------

HAMI_CMAKE = (
    "-DDLSYM_HOOK_ENABLE=1",
    "-DMULTIPROCESS_LIMIT_ENABLE=1",
    "-DHOOK_MEMINFO_ENABLE=1",
    "-DHOOK_NVML_ENABLE=1",
    # A release build leaves its hooks out (the first GPU run found): Debug, as build.sh.
    "-DCMAKE_BUILD_TYPE=Debug",
    "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
)


def hami_build_script(source: Path, build: Path) -> str:
    cuda = "/usr/local/cuda"
    return (
        f"export LIBRARY_PATH={cuda}/lib64/stubs:/usr/local/nvidia/lib64:{cuda}/lib64 CUDA_HOME={cuda}\n"
        f"cmake -S '{source}' -B '{build}' {' '.join(HAMI_CMAKE)}\n"
        f"make -C '{build}' -j{os.cpu_count() or 4} vgpu\n"
    )


def build_hami_core(ctx: Context, timeout: float) -> list[Check]:
    """Starts the build; `hami_core_ready` waits for it, so the contract suite runs meanwhile."""
    source = ctx.options.hami_source
    if source is None:
        return _skip("HAMi-core build", "no HAMi-core source given: the vGPU limits are not measured")
    build = ctx.options.scratch / "hami-build"
    log = (ctx.options.out / "hami-build.txt").open("wb")
    ctx.hami_build = subprocess.Popen(
        ["bash", "-ec", hami_build_script(source, build)], stdout=log, stderr=subprocess.STDOUT
    )
    return [Check("HAMi-core build started", "pass", numbers={"source": str(source)})]


def hami_core_ready(ctx: Context, timeout: float) -> list[Check]:
    if ctx.hami_build is None:
        return _skip("HAMi-core library", "not built")
    code = ctx.hami_build.wait(timeout)
    library = ctx.options.scratch / "hami-build" / "libvgpu.so"
    if code != 0 or not library.exists():
        return [Check("HAMi-core library", "fail", f"build exited {code}; see hami-build.txt")]
    ctx.hami_library = library
    return [Check("HAMi-core library", "pass", numbers={"library": str(library)})]


# --- the NVML contract suite ------------------------------------------------------------------


def contract_suite(ctx: Context, timeout: float) -> list[Check]:
    repo = Path(__file__).resolve().parents[3]
    command = [
        *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="),
        *("tests/contract/test_hardware_backends.py", "-k", "nvml and not mock"),
    ]
    done = subprocess.run(
        command,
        cwd=repo,
        env={**os.environ, "DRA_DRIVER_TEST_NVML": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    (ctx.options.out / "contract-suite.txt").write_text(done.stdout + done.stderr)
    return [judge.contract_suite(done.stdout, done.returncode)]


# --- one agent, one claim ---------------------------------------------------------------------


def start_phase_agent(name: str, node_config: str | None, ctx: Context, timeout: float) -> list[Check]:
    phase = ctx.phase(name)
    root = ctx.options.scratch / name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    phase.server = ApiServer().start()
    add_node(phase.server)
    kubeconfig = phase.server.write_kubeconfig(root / "kubeconfig")
    phase.api = client.ResourceV1Api(config.new_client_from_config(str(kubeconfig)))
    phase.dirs = AgentDirs(root=root / "node")
    args = [*ctx.options.agent_args, "--health-recovery", "300"]
    if name == "vgpu":  # HAMi-core where it was built, else the limits as advisory variables
        node_config = vgpu_node_config("hami-core" if ctx.hami_library else "none")
        if ctx.hami_library:
            args += ["--hami-core-library", str(ctx.hami_library), "--hami-core-dir", str(root / "hami")]
    if node_config:
        (root / "node-config.yaml").write_text(node_config)
        args += ["--node-config", str(root / "node-config.yaml")]
    started = time.monotonic()
    phase.agent = start_agent(
        phase.dirs, kubeconfig, "nvml", tuple(args), wait=False, env=ctx.options.agent_env
    )
    phase.agent.wait_for_log("resourceslices published", timeout)
    devices = [d["name"] for s in stored_slices(phase.server) for d in s["spec"].get("devices", [])]
    numbers = {"start_to_published_s": round(time.monotonic() - started, 2), "devices": devices}
    return [Check(f"agent ({name}) publishes its devices", "pass" if devices else "fail", numbers=numbers)]


def _first_device(phase: Phase) -> str:
    assert phase.server
    return str(stored_slices(phase.server)[0]["spec"]["devices"][0]["name"])


def _prepare(phase: Phase, name: str, share: Mapping[str, Any] | None, ctx: Context, timeout: float) -> Check:
    """Allocates claim `name` (a share of the phase's first device) and prepares it through the
    phase's agent; the check carries the CDI device IDs, the edits go to `phase.more`."""
    assert phase.api is not None and phase.dirs is not None
    result = {
        "request": "gpu",
        "driver": DEFAULT_DRIVER_NAME,
        "pool": NODE_NAME,
        "device": _first_device(phase),
    }
    uid = allocate_results(phase.api, name, [{**result, **(share or {})}])
    answer, seconds = asyncio.run(
        asyncio.wait_for(
            kubelet_client.timed_prepare(phase.dirs.dra_socket, "v1", [ClaimArg("default", name, uid)]),
            timeout,
        )
    )
    elapsed_ms = round(seconds * 1000, 1)
    claim = answer["claims"][uid]
    ids = [i for device in claim.get("devices", []) for i in device.get("cdi_device_ids", [])]
    numbers = {"prepare_ms": elapsed_ms, "cdi_device_ids": ids, "share": dict(share or {})}
    if claim.get("error") or not ids:
        return Check(f"prepare ({name})", "fail", claim.get("error") or "no CDI device IDs", numbers)
    specs = [json.loads(path.read_text()) for path in sorted(phase.dirs.cdi_dir.glob("*.json"))]
    for path in phase.dirs.cdi_dir.glob("*.json"):
        shutil.copy(path, ctx.options.out / f"{phase.name}-{path.name}")
    phase.more[name] = (uid, edits_for(specs, ids))
    return Check(f"prepare ({name})", "pass", numbers=numbers)


def prepare_claim(name: str, share: Mapping[str, Any] | None, ctx: Context, timeout: float) -> list[Check]:
    phase = ctx.phase(name)
    if phase.agent is None or phase.api is None or phase.dirs is None:
        return _skip(f"prepare ({name})", "no agent")
    check = _prepare(phase, name, share, ctx, timeout)
    if check.status == "pass":
        phase.uid, phase.edits = phase.more.pop(name)
    return [check]


def check_host_paths(name: str, ctx: Context, timeout: float) -> list[Check]:
    edits = ctx.phase(name).edits
    if edits is None:
        return _skip(f"host paths ({name})", "nothing prepared")
    return [judge.host_paths(missing_host_paths(edits, host_fact), len(edits.host_paths()), name)]


def _hold_prefix(ctx: Context, name: str) -> str:
    return str(ctx.options.scratch / f"{name}-hold")


def _release(phase: Phase) -> None:
    if phase.running and "GPU_CHECK_HOLD" in phase.results.get("hold_env", {}):
        Path(phase.results["hold_env"]["GPU_CHECK_HOLD"] + ".go").write_text("go")


def start_holding_workload(name: str, ctx: Context, timeout: float) -> list[Check]:
    """The workload under the claim's edits, holding memory until released (usage is read
    meanwhile)."""
    phase = ctx.phase(name)
    if phase.edits is None:
        return _skip(f"workload ({name}) started", "nothing prepared")
    prefix = _hold_prefix(ctx, name)
    for suffix in (".ready", ".go"):
        Path(prefix + suffix).unlink(missing_ok=True)
    env = {"GPU_CHECK_HOLD_GIB": str(ctx.options.hold_gib), "GPU_CHECK_HOLD": prefix}
    phase.results["hold_env"] = env
    phase.running = start_under_edits(phase.edits, ctx.options.workload, ctx.options.workload_env, env)
    deadline = time.monotonic() + timeout
    while not Path(prefix + ".ready").exists():
        if phase.running.process.poll() is not None or time.monotonic() > deadline:
            return [Check(f"workload ({name}) holds {ctx.options.hold_gib} GiB", "fail", "never ready")]
        time.sleep(0.05)
    numbers = {"binds": [s for s in phase.running.plan.steps if s.startswith("mount --bind")]}
    return [Check(f"workload ({name}) holds {ctx.options.hold_gib} GiB", "pass", numbers=numbers)]


def usage_while_held(name: str, ctx: Context, timeout: float) -> list[Check]:
    """The agent's own usage reader, as its metrics and claim status use it."""
    from dra_driver.hardware.nvml_usage import NvmlUsageReader  # noqa: PLC0415 - NVML on the GPU only

    phase = ctx.phase(name)
    if phase.running is None:
        return _skip("NVML usage shows the workload's memory", "no workload running")
    pid = int(Path(_hold_prefix(ctx, name) + ".ready").read_text())
    reader = NvmlUsageReader()
    try:
        reader.read_usage()
        time.sleep(1.0)  # per-process samples cover the time since the previous read
        return [judge.usage(reader.read_usage(), pid, ctx.options.hold_gib)]
    finally:
        reader.close()


def _workload_output(code: int, stdout: str, stderr: str) -> dict[str, Any]:
    try:
        parsed: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"exit {code}, no JSON; stderr: {stderr.strip()[-600:]}"}
    return parsed | ({"error": f"exit {code}: {stderr.strip()[-600:]}"} if code else {})


def finish_workload(name: str, ctx: Context, timeout: float) -> list[Check]:
    phase = ctx.phase(name)
    if phase.running is None:
        return _skip(f"CUDA workload under the {name} claim's CDI edits", "not started")
    _release(phase)
    running, phase.running = phase.running, None
    output = _workload_output(*running.finish(timeout))
    output["not_applied"] = list(running.plan.skipped)
    return [judge.workload(output, name)]


def container_loader(ctx: Context, timeout: float) -> list[Check]:
    """The workload under the whole claim's edits as a container image would load it: the host's
    loader cache hidden and no LD_LIBRARY_PATH, so the driver is found only where the spec mounted it."""
    edits = ctx.phase("whole").edits
    if edits is None:
        return _skip("the driver's libraries load from the claim's mounts", "nothing prepared")
    empty = ctx.options.scratch / "empty-ld.so.cache"
    empty.write_bytes(b"")
    env = {k: v for k, v in ctx.options.workload_env.items() if k != "LD_LIBRARY_PATH"}
    running = start_under_edits(edits, ctx.options.workload, env, {}, empty_loader_cache=str(empty))
    output = _workload_output(*running.finish(timeout))
    return [judge.container_loader(output, {mount.container_path for mount in edits.mounts})]


def run_once(name: str, under_edits: bool, ctx: Context, timeout: float) -> dict[str, Any]:
    env = {"GPU_CHECK_ALLOCATE": "1", "GPU_CHECK_MATMUL_SECONDS": str(ctx.options.matmul_seconds)}
    edits = ctx.phase(name).edits if under_edits else Edits()
    assert edits is not None
    if under_edits:
        running = start_under_edits(edits, ctx.options.workload, ctx.options.workload_env, env)
        return _workload_output(*running.finish(timeout))
    done = subprocess.run(
        ctx.options.workload,
        env={**ctx.options.workload_env, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return _workload_output(done.returncode, done.stdout, done.stderr)


def share_workload(ctx: Context, timeout: float) -> list[Check]:
    """Allocation until failure and a matmul under the share's edits."""
    phase = ctx.phase("vgpu")
    if phase.edits is None:
        return _skip("CUDA workload under the vgpu claim's CDI edits", "nothing prepared")
    phase.results["limited"] = run_once("vgpu", True, ctx, timeout)
    return [judge.workload(phase.results["limited"], "vgpu")]


def unlimited_workload(ctx: Context, timeout: float) -> list[Check]:
    name = "the same workload without the share"
    if ctx.hami_library is None:
        return _skip(name, "no HAMi-core library: nothing to compare with")
    ctx.phase("vgpu").results["unlimited"] = result = run_once("vgpu", False, ctx, timeout)
    return [judge.workload(result, "no") if "error" in result else Check(name, "pass", numbers=result)]


def vgpu_limits(ctx: Context, timeout: float) -> list[Check]:
    results = ctx.phase("vgpu").results
    if ctx.hami_library is None or "unlimited" not in results or "limited" not in results:
        why = "no HAMi-core library: the vGPU limits are not measured"
        return [Check("vGPU memory limit", "skip", why), Check("vGPU core limit", "skip", why)]
    limited, unlimited = results["limited"], results["unlimited"]
    return [
        judge.memory_limit(
            limited.get("allocated_gib", 0), unlimited.get("allocated_gib", 0), SHARE_MEMORY_GIB
        ),
        judge.documented_gap(
            judge.core_limit(
                limited.get("matmul_tflops", 0.0), unlimited.get("matmul_tflops", 0.0), SHARE_CORES
            ),
            HAMI_CORE_COMPUTE_GAP,
        ),
    ]


# --- vgpu.enforcement mps ----------------------------------------------------------------------


def mps_workload(ctx: Context, timeout: float) -> list[Check]:
    """Allocation until failure and a matmul under the MPS share's edits, and the same unshared
    (no CUDA_MPS_PIPE_DIRECTORY: the client finds no daemon and runs without MPS)."""
    phase = ctx.phase("mps")
    if phase.edits is None:
        return _skip("CUDA workload under the mps claim's CDI edits", "nothing prepared")
    phase.results["limited"] = run_once("mps", True, ctx, timeout / 2)
    phase.results["unlimited"] = run_once("mps", False, ctx, timeout / 2)
    unlimited = phase.results["unlimited"]
    checks = [judge.workload(phase.results["limited"], "mps")]
    checks.append(
        judge.workload(unlimited, "no")
        if "error" in unlimited
        else Check("unshared workload", "pass", numbers=unlimited)
    )
    return checks


def mps_limits(ctx: Context, timeout: float) -> list[Check]:
    results = ctx.phase("mps").results
    if "unlimited" not in results or "limited" not in results:
        why = "the MPS share's workload did not run"
        return [Check("MPS memory limit", "skip", why), Check("MPS core limit", "skip", why)]
    limited, unlimited = results["limited"], results["unlimited"]
    return [
        judge.memory_limit(
            limited.get("allocated_gib", 0), unlimited.get("allocated_gib", 0), SHARE_MEMORY_GIB, "MPS"
        ),
        judge.core_limit(
            limited.get("matmul_tflops", 0.0), unlimited.get("matmul_tflops", 0.0), SHARE_CORES, "MPS"
        ),
    ]


def prepare_pair(ctx: Context, timeout: float) -> list[Check]:
    """Two more shares of the same GPU, through the same agent (so the same MPS daemon)."""
    phase = ctx.phase("mps")
    if phase.agent is None:
        return _skip("prepare (mps pair)", "no agent")
    return [
        _prepare(
            phase,
            f"mps-{n}",
            {"shareID": share_id, "consumedCapacity": {"cores": str(PAIR_CORES)}},
            ctx,
            timeout / 2,
        )
        for n, share_id in enumerate(PAIR_SHARES)
    ]


def pair_workloads(ctx: Context, timeout: float) -> list[Check]:
    """Both shares' matmuls at once; each is judged against the unshared rate of `mps_workload`."""
    phase = ctx.phase("mps")
    unlimited = phase.results.get("unlimited", {}).get("matmul_tflops", 0.0)
    if len(phase.more) != len(PAIR_SHARES) or not unlimited:
        return _skip(
            f"two MPS shares of {PAIR_CORES} cores at once", "the pair or the unshared rate is missing"
        )
    env = {"GPU_CHECK_MATMUL_SECONDS": str(PAIR_MATMUL_SECONDS)}
    runs = [
        start_under_edits(edits, ctx.options.workload, ctx.options.workload_env, env)
        for _, edits in phase.more.values()
    ]
    outputs = [_workload_output(*run.finish(timeout)) for run in runs]
    phase.results["pair"] = {"outputs": outputs}
    rates = [output.get("matmul_tflops", 0.0) for output in outputs]
    workloads = [judge.workload(output, name) for output, name in zip(outputs, phase.more, strict=True)]
    return [*workloads, judge.concurrent_shares(rates, unlimited, PAIR_CORES)]


def unprepare_pair(ctx: Context, timeout: float) -> list[Check]:
    phase = ctx.phase("mps")
    if phase.dirs is None or not phase.more:
        return _skip("unprepare (mps pair)", "nothing prepared")
    claims = [ClaimArg("default", name, uid) for name, (uid, _) in phase.more.items()]
    answer = asyncio.run(
        asyncio.wait_for(kubelet_client.unprepare(phase.dirs.dra_socket, "v1", claims), timeout)
    )
    errors = {name: answer["claims"][uid].get("error", "") for name, (uid, _) in phase.more.items()}
    phase.more.clear()
    failed = {name: error for name, error in errors.items() if error}
    return [Check("unprepare (mps pair)", "fail" if failed else "pass", "; ".join(failed.values()), errors)]


def unprepare_claim(name: str, ctx: Context, timeout: float) -> list[Check]:
    phase = ctx.phase(name)
    if not phase.uid or phase.dirs is None:
        return _skip(f"unprepare ({name})", "nothing prepared")
    answer = asyncio.run(
        asyncio.wait_for(
            kubelet_client.unprepare(phase.dirs.dra_socket, "v1", [ClaimArg("default", name, phase.uid)]),
            timeout,
        )
    )
    error = answer["claims"][phase.uid].get("error", "")
    left = [p.name for p in phase.dirs.cdi_dir.glob(f"*{phase.uid}*")]
    numbers = {"claim_specs_left": left}
    status: Status = "fail" if error or left else "pass"
    return [Check(f"unprepare ({name})", status, error or ("spec left behind" if left else ""), numbers)]


def _stop(phase: Phase) -> None:
    agent, server, phase.agent, phase.server = phase.agent, phase.server, None, None
    try:
        if agent:
            agent.terminate(timeout=15)
    finally:
        if server:
            server.stop()


def stop_phase_agent(name: str, ctx: Context, timeout: float) -> list[Check]:
    phase = ctx.phase(name)
    if phase.agent is None:
        return _skip(f"agent ({name}) stops", "not running")
    log = phase.agent.log_path
    code = phase.agent.terminate(timeout=timeout)
    shutil.copy(log, ctx.options.out / f"agent-{name}.log")
    _stop(phase)
    return [Check(f"agent ({name}) stops", "pass" if code == 0 else "fail", numbers={"exit_code": code})]


def phase_steps(name: str, node_config: str | None, share: Mapping[str, Any] | None) -> list[Step]:
    return [
        Step(f"{name}.start_agent", 45, partial(start_phase_agent, name, node_config)),
        Step(f"{name}.prepare", 20, partial(prepare_claim, name, share)),
        Step(f"{name}.host_paths", 5, partial(check_host_paths, name)),
    ]


def gpu_steps() -> list[Step]:
    """Every step, in order; `--skip` leaves some out by name."""
    share = {**SHARE, "consumedCapacity": {"memory": f"{SHARE_MEMORY_GIB}Gi", "cores": str(SHARE_CORES)}}
    return [
        Step("settings_before", 15, settings_before),
        Step("build_hami_core", 5, build_hami_core),
        Step("contract_suite", 120, contract_suite),
        *phase_steps("whole", None, None),
        Step("whole.start_workload", 60, partial(start_holding_workload, "whole")),
        Step("whole.usage", 15, partial(usage_while_held, "whole")),
        Step("whole.finish_workload", 30, partial(finish_workload, "whole")),
        Step("whole.container_loader", 60, container_loader),
        Step("whole.unprepare", 20, partial(unprepare_claim, "whole")),
        Step("whole.stop_agent", 20, partial(stop_phase_agent, "whole")),
        Step("hami_core_ready", 90, hami_core_ready),
        *phase_steps("vgpu", None, share),  # its node config depends on HAMi-core (start_phase_agent)
        Step("vgpu.workload", 60, share_workload),
        Step("vgpu.unlimited_workload", 60, unlimited_workload),
        Step("vgpu.limits", 5, vgpu_limits),
        Step("vgpu.unprepare", 20, partial(unprepare_claim, "vgpu")),
        Step("vgpu.stop_agent", 20, partial(stop_phase_agent, "vgpu")),
        *phase_steps("mps", vgpu_node_config("mps"), share),
        Step("mps.workload", 120, mps_workload),
        Step("mps.limits", 5, mps_limits),
        Step("mps.prepare_pair", 40, prepare_pair),
        Step("mps.pair_workloads", 90, pair_workloads),
        Step("mps.unprepare_pair", 20, unprepare_pair),
        Step("mps.unprepare", 20, partial(unprepare_claim, "mps")),
        Step("mps.stop_agent", 20, partial(stop_phase_agent, "mps")),
        Step("settings_after", 15, settings_after),
    ]
