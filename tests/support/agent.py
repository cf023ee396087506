"""Runs `dra-driver node` as a real process, the way a DaemonSet would, for tests and benchmarks."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from dra_driver import DEFAULT_DRIVER_NAME

NODE_NAME = "node-a"
START_TIMEOUT_SECONDS = 30.0


@dataclass
class AgentDirs:
    """Directories of one simulated node; the root is short so socket paths stay under 108 bytes."""

    root: Path
    driver_name: str = DEFAULT_DRIVER_NAME

    @property
    def registrar_dir(self) -> Path:
        return self.root / "registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root / "plugins"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def registration_socket(self) -> Path:
        return self.registrar_dir / f"{self.driver_name}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.plugins_dir / self.driver_name / "dra.sock"

    @property
    def state_dir(self) -> Path:
        return self.plugins_dir / self.driver_name


@dataclass
class AgentProcess:
    dirs: AgentDirs
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)
    _metrics_port: int | None = field(default=None, init=False, repr=False)

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.log_path.read_text().splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                lines.append({"event": raw, "unparsed": True})
        return lines

    def log_events(self) -> list[str]:
        return [str(line.get("event")) for line in self.log_lines()]

    def wait_for_log(self, event: str, timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log_lines():
                if line.get("event") == event:
                    return line
            time.sleep(0.02)
        raise AssertionError(f"no log line {event!r}; log:\n{self.log_path.read_text()}")

    def metrics_port(self) -> int:
        """The port of the agent's observability endpoint (it asks for any free one), from its log."""
        if self._metrics_port is None:
            self._metrics_port = int(self.wait_for_log("observability endpoint listening")["port"])
        return self._metrics_port

    def metrics_text(self) -> str:
        """The agent's /metrics as Prometheus reads it (straight, whatever proxy the environment
        names)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{self.metrics_port()}/metrics", timeout=10) as response:
            return str(response.read().decode())

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of the agent's /metrics, by name and labels (sorted)."""
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(self.metrics_text())
            for sample in family.samples
        }

    def terminate(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


def node_command(
    dirs: AgentDirs, kubeconfig: Path, hardware: str = "simulated:dgx-h100", extra: tuple[str, ...] = ()
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dra_driver",
        "node",
        "--node-name",
        NODE_NAME,
        "--driver-name",
        dirs.driver_name,
        "--hardware",
        hardware,
        "--registrar-dir",
        str(dirs.registrar_dir),
        "--plugins-dir",
        str(dirs.plugins_dir),
        "--cdi-dir",
        str(dirs.cdi_dir),
        "--mps-dir",
        str(dirs.root / "mps"),
        "--metrics-address",
        "127.0.0.1:0",
        "--kubeconfig",
        str(kubeconfig),
        "--log-format",
        "json",
        *extra,
    ]


def start_agent(
    dirs: AgentDirs,
    kubeconfig: Path,
    hardware: str = "simulated:dgx-h100",
    extra: tuple[str, ...] = (),
    wait: bool = True,
    env: Mapping[str, str] | None = None,
    wrapper: Sequence[str] = (),
) -> AgentProcess:
    """`env`: variables set for the agent on top of ours; `wrapper`: a command that runs the agent
    (a profiler, say), put in front of the agent's own."""
    dirs.root.mkdir(parents=True, exist_ok=True)
    log_path = dirs.root / f"agent-{time.monotonic_ns()}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [*wrapper, *node_command(dirs, kubeconfig, hardware, extra)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    agent = AgentProcess(dirs=dirs, process=process, log_path=log_path)
    if wait:
        agent.wait_for_log("node agent running", START_TIMEOUT_SECONDS)
    return agent
