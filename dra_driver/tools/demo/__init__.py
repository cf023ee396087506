"""`dra-driver demo`: the whole node flow on one machine, no cluster needed.

It starts the real node agent on a simulated node with temporary sockets, registers it and
prepares a claim over the sockets exactly as kubelet would (a sample claim for a whole GPU, a MIG
device or a vGPU share, built from what the node offers, or the claims of a file), shows the CDI
spec that was written, runs a container with it when podman is usable, and cleans everything up.
The spec goes to a private directory unless `--cdi-dir` names one: podman reads only the host's
/etc/cdi and /var/run/cdi, and a demo does not write there unasked.
"""

import json
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

import msgspec
import yaml

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.agent.node import NodeAgent, discover_inventory
from dra_driver.claims.source import OfflineClaimSource
from dra_driver.config.settings import InventorySettings, NodeSettings, SettingsError, parse_hardware
from dra_driver.devices.model import device_to_api
from dra_driver.tools import kubelet_client, podman
from dra_driver.tools.demo.example_claims import example_claims, unallocated_specs
from dra_driver.tools.demo.sample_claims import CLAIM_KINDS, ClaimKind, SampleClaimError, sample_claim
from dra_driver.tools.kubelet_client import ClaimArg

DEMO_NODE = "demo-node"
DEFAULT_HARDWARE = "simulated:dgx-h100"
DEFAULT_CLAIM = "gpu"


class DemoClaims(msgspec.Struct, frozen=True):
    """What the demo prepares: claims from a file, or the sample claim of one kind."""

    source: OfflineClaimSource
    # The node configuration the sample claim needs; None: the default one.
    node_config: dict[str, Any] | None = None
    # The claims the demo allocated itself (a sample, or a file's templates), shown as allocated.
    allocated: tuple[dict[str, Any], ...] = ()
    # What the demo did in the scheduler's place that the user should know.
    notes: tuple[str, ...] = ()


def claim_choice(value: str) -> ClaimKind | Path:
    """`--claim`: a kind of device, or the path of a claim file (a typo of a kind is neither)."""
    if kind := CLAIM_KINDS.get(value):
        return kind
    if not Path(value).is_file():
        raise SettingsError(
            f"--claim: claim file {value}: no such file; --claim takes gpu|mig|vgpu|FILE "
            "(a kind of device, or a file of claims: templates and pods, or allocated ResourceClaims)"
        )
    return Path(value)


async def demo_claims(choice: ClaimKind | Path, hardware: str) -> DemoClaims:
    """Raises SettingsError (exit 2) for a claim file that cannot be read, SampleClaimError (exit 2)
    for a kind the node cannot offer, SetupError for a hardware description that is no node."""
    if isinstance(choice, Path) and (specs := _unallocated(choice)) is not None:
        gpus = await _node_gpus(hardware)
        try:
            made = example_claims(specs, gpus, DEMO_NODE, DEFAULT_DRIVER_NAME, hardware)
        except SampleClaimError as error:
            raise SettingsError(f"--claim: {error}") from error
        by_key = {(claim["metadata"]["namespace"], claim["metadata"]["name"]): claim for claim in made.claims}
        return DemoClaims(OfflineClaimSource(by_key), made.node_config, made.claims, made.notes)
    if isinstance(choice, Path):
        try:
            source = OfflineClaimSource.from_file(choice)
        except ValueError as error:
            raise SettingsError(f"--claim: {error}") from error
        if not source.identities():
            # Exit 0 having prepared nothing would read as success.
            raise SettingsError(f"--claim: claim file {choice}: holds no ResourceClaim")
        return DemoClaims(source)
    gpus = await _node_gpus(hardware)
    # Its SampleClaimError names --claim already.
    chosen = sample_claim(choice, gpus, DEMO_NODE, DEFAULT_DRIVER_NAME, str(parse_hardware(hardware)))
    key = (chosen.claim["metadata"]["namespace"], chosen.claim["metadata"]["name"])
    return DemoClaims(OfflineClaimSource({key: chosen.claim}), chosen.node_config, (chosen.claim,))


async def _node_gpus(hardware: str) -> list[Any]:
    backend, inventory = await discover_inventory(
        InventorySettings(DEMO_NODE, DEFAULT_DRIVER_NAME, parse_hardware(hardware), node_config=None)
    )
    await backend.close()
    return [plan.gpu for plan in inventory.plans]


def _unallocated(path: Path) -> list[tuple[str, dict[str, Any]]] | None:
    """The file's templates and unallocated claims (the examples' files), or None: a file of
    allocated claims, or one that does not read, which the claim-file path reports."""
    try:
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    try:
        return unallocated_specs(documents)
    except SampleClaimError as error:
        raise SettingsError(f"--claim: {path}: {error}") from error


def _section(out: TextIO, title: str, body: Any) -> None:
    text = body if isinstance(body, str) else yaml.safe_dump(body, sort_keys=False)
    out.write(f"\n=== {title} ===\n{text.rstrip()}\n")
    out.flush()


def _container_problem(cdi_dir: Path, private: bool) -> str | None:
    """Why podman cannot see the spec the demo writes: podman 4 reads only its two CDI
    directories, and the demo writes there only when asked, since they are the host's."""
    if cdi_dir in podman.CDI_DIRS:
        return None
    if private:
        return (
            f"the CDI spec went to a private directory, which podman does not read; "
            f"--cdi-dir {podman.CDI_DIRS[1]} writes it where podman reads it (unprepare removes it)"
        )
    return f"podman reads CDI specs only from {' and '.join(map(str, podman.CDI_DIRS))}, not {cdi_dir}"


def _failed_claims(answer: dict[str, Any]) -> dict[str, str]:
    return {uid: str(entry["error"]) for uid, entry in answer["claims"].items() if entry.get("error")}


async def run_demo(
    claims: DemoClaims,
    hardware: str,
    run_container: bool,
    cdi_dir: Path | None = None,
    out: TextIO = sys.stdout,
) -> dict[str, str]:
    """The claims whose prepare failed, with kubelet's error for each; empty when all worked.
    `cdi_dir`: where the CDI specs go; None: a private directory, removed at the end."""
    podman_problem = podman.podman_problem() if run_container else "disabled with --no-container"
    with tempfile.TemporaryDirectory(prefix="dra-demo-") as work:
        work_dir = Path(work)
        spec_dir = cdi_dir or work_dir / "cdi"
        podman_problem = podman_problem or _container_problem(spec_dir, private=cdi_dir is None)
        node_config = None
        if claims.node_config is not None:
            node_config = work_dir / "node-config.yaml"
            node_config.write_text(yaml.safe_dump(claims.node_config, sort_keys=False))
        settings = NodeSettings(
            node_name=DEMO_NODE,
            driver_name=DEFAULT_DRIVER_NAME,
            hardware=parse_hardware(hardware),
            node_config=node_config,
            registrar_dir=work_dir / "plugins_registry",
            plugins_dir=work_dir / "plugins",
            cdi_dir=spec_dir,
            state_dir=work_dir / "state",
            mps_dir=work_dir / "mps",
            kubeconfig=None,
            log_format="console",
            verbosity=0,
        )
        source = claims.source
        claim_args = [ClaimArg(*identity) for identity in source.identities()]
        agent = await NodeAgent.start(settings, source)
        try:
            _section(
                out,
                f"devices node {DEMO_NODE} publishes ({agent.hardware.description})",
                [device_to_api(device) for device in agent.inventory.devices],
            )
            if claims.node_config is not None:
                _section(out, "node config the sample claim needs", claims.node_config)
            for allocated in claims.allocated:
                _section(out, "the allocated claim (as the scheduler leaves it)", allocated)
            for note in claims.notes:
                print(f"note: {note}", file=out)
            _section(
                out,
                "kubelet registration handshake",
                await kubelet_client.register(settings.registration_socket),
            )
            answer = await kubelet_client.prepare(settings.dra_socket, "v1", claim_args)
            _section(out, "NodePrepareResources (v1) answer", answer)
            for claim in claim_args:
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
                await kubelet_client.unprepare(settings.dra_socket, "v1", claim_args),
            )
        finally:
            await agent.stop()
        return _failed_claims(answer)
