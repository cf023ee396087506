"""`dra-driver demo`: the whole node flow on one machine, no cluster needed.

It starts the real node agent on a simulated node with temporary sockets, registers it and
prepares a sample claim over the sockets exactly as kubelet would, shows the CDI spec that was
written, runs a container with it when podman is usable, and cleans everything up again.
"""

import json
import os
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import yaml

from dra_driver import DEFAULT_DRIVER_NAME, kubelet_client, podman
from dra_driver.claims.source import OfflineClaimSource
from dra_driver.devices.model import device_to_api
from dra_driver.kubelet_client import ClaimArg
from dra_driver.node import NodeAgent
from dra_driver.settings import NodeSettings, parse_hardware

DEMO_NODE = "demo-node"
DEFAULT_HARDWARE = "simulated:dgx-h100"


def sample_claim_path() -> Path:
    return Path(str(resources.files("dra_driver.demo").joinpath("sample-claim.yaml")))


def _section(out: TextIO, title: str, body: Any) -> None:
    text = body if isinstance(body, str) else yaml.safe_dump(body, sort_keys=False)
    out.write(f"\n=== {title} ===\n{text.rstrip()}\n")
    out.flush()


def _cdi_dir_for_demo(work_dir: Path, use_podman: bool) -> Path:
    """podman only reads /etc/cdi and /var/run/cdi; elsewhere a private directory keeps things tidy."""
    if use_podman and os.access(podman.CDI_DIRS[1].parent, os.W_OK):
        return podman.CDI_DIRS[1]
    return work_dir / "cdi"


async def run_demo(claim_file: Path, hardware: str, run_container: bool, out: TextIO = sys.stdout) -> None:
    podman_problem = podman.podman_problem() if run_container else "disabled with --no-container"
    with tempfile.TemporaryDirectory(prefix="dra-demo-") as work:
        work_dir = Path(work)
        settings = NodeSettings(
            node_name=DEMO_NODE,
            driver_name=DEFAULT_DRIVER_NAME,
            hardware=parse_hardware(hardware),
            node_config=None,
            registrar_dir=work_dir / "plugins_registry",
            plugins_dir=work_dir / "plugins",
            cdi_dir=_cdi_dir_for_demo(work_dir, podman_problem is None),
            state_dir=work_dir / "state",
            mps_dir=work_dir / "mps",
            kubeconfig=None,
            log_format="console",
            verbosity=0,
        )
        source = OfflineClaimSource.from_file(claim_file)
        claims = [ClaimArg(*identity) for identity in source.identities()]
        agent = await NodeAgent.start(settings, source)
        try:
            _section(
                out,
                f"devices node {DEMO_NODE} publishes ({agent.hardware.description})",
                [device_to_api(device) for device in agent.inventory.devices],
            )
            _section(
                out,
                "kubelet registration handshake",
                await kubelet_client.register(settings.registration_socket),
            )
            answer = await kubelet_client.prepare(settings.dra_socket, "v1", claims)
            _section(out, "NodePrepareResources (v1) answer", answer)
            for claim in claims:
                spec_path = agent.engine.cdi_spec_path(claim.uid)
                if spec_path.exists():
                    _section(
                        out, f"CDI spec {spec_path}", json.dumps(json.loads(spec_path.read_text()), indent=2)
                    )
            cdi_ids = [
                cdi_id
                for entry in answer["claims"].values()
                for device in entry.get("devices", [])
                for cdi_id in device.get("cdi_device_ids", [])
            ]
            if podman_problem is None and cdi_ids:
                seen = podman.run_with_cdi_devices(cdi_ids, "env | grep ^DRA_ | sort")
                _section(out, "what a container started with these CDI devices sees (podman)", seen)
            else:
                _section(out, "container run skipped", podman_problem or "no CDI devices were prepared")
            _section(
                out,
                "NodeUnprepareResources (v1) answer",
                await kubelet_client.unprepare(settings.dra_socket, "v1", claims),
            )
        finally:
            await agent.stop()
