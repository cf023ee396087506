"""The claim engine on a simulated node, wired as the node agent wires it, for in-process tests.

One place builds `ClaimEngine` for every test, so a change to its wiring is made once. Each test
says only what its node has beyond the default (a node of four T4s, records and CDI specs under
`root`, no dynamic MIG, no sharing controls, no HAMi-core): a different simulated profile or node
configuration, a ready-made inventory, MIG hardware, sharing controls, HAMi-core.
"""

from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.edits.cdi_files import CdiSpecDirectory
from dra_driver.claims.edits.gpu_edits import SimulatedEdits
from dra_driver.claims.edits.vgpu_edits import HamiCore
from dra_driver.claims.engine import ClaimEngine, EffectControls, SharingControls
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.source import ClaimSource
from dra_driver.claims.status.status_writer import ClaimStatusWriter
from dra_driver.config.option_values import parse_hardware
from dra_driver.config.settings import NodeSettings
from dra_driver.devices.inventory import Inventory, node_inventory
from dra_driver.devices.node_config import NodeConfig
from dra_driver.hardware.pci_binding import PciBinding
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.simulated_nodes import resolve_node_spec
from dra_driver.observability.metrics import ClaimMetrics
from tests.support.nodes import simulated_node

POOL = "node-a"
PLAIN = NodeConfig()  # every GPU offered as it is


def simulated_hardware(root: Path, profile: str, pool: str = POOL) -> SimulatedBackend:
    """The simulated GPUs of `profile` (a profile name or a node file), their MIG instances kept
    in `root` as a real GPU keeps them across agent restarts: two engines built on one root see
    the same instances, as two agents on one node do."""
    return SimulatedBackend(pool, resolve_node_spec(profile), root / "hardware.json")


def simulated_engine(
    root: Path,
    claims: ClaimSource,
    profile: str = "t4x4",
    config: NodeConfig = PLAIN,
    *,
    pool: str = POOL,
    inventory: Inventory | None = None,
    hardware: SimulatedBackend | None = None,
    sharing: SharingControls | None = None,
    hami_core: HamiCore | None = None,
    flush: bool = True,
    claim_status: ClaimStatusWriter | None = None,
    metrics: ClaimMetrics | None = None,
    pci: PciBinding | None = None,
) -> ClaimEngine:
    """An engine whose records are in `root`/state and CDI specs in `root`/cdi, so two engines
    on one root stand for two agents sharing a node's state directory. `inventory`: the devices
    offered when they do not come from `profile` and `config` (the e2e node's, say). `flush`:
    records flushed, each write in a thread (the loop turns the agent's unflushed writes do not
    take), or written on the loop as the agent does by default."""
    return ClaimEngine(
        driver_name=DEFAULT_DRIVER_NAME,
        pool_name=pool,
        inventory=inventory or node_inventory(simulated_node(profile), config),
        edits=SimulatedEdits(),
        claim_source=claims,
        records=ClaimRecordStore(root / "state", flush=flush),
        cdi_specs=CdiSpecDirectory(root / "cdi", DEFAULT_DRIVER_NAME),
        controls=EffectControls(hardware=hardware, sharing=sharing, pci=pci),
        hami_core=hami_core,
        claim_status=claim_status,
        metrics=metrics,
    )


def agent_settings(
    root: Path, hardware: str, node_name: str = "node-a", node_config: Path | None = None, **more: Any
) -> NodeSettings:
    """An in-process agent's settings with every directory below `root` (what the contract tests
    that start NodeAgent share); `more`: any other field of NodeSettings."""
    return NodeSettings(
        node_name=node_name,
        driver_name=DEFAULT_DRIVER_NAME,
        hardware=parse_hardware(hardware),
        node_config=node_config,
        registrar_dir=root / "registry",
        plugins_dir=root / "plugins",
        cdi_dir=root / "cdi",
        state_dir=root / "state",
        mps_dir=root / "mps",
        kubeconfig=None,
        log_format="json",
        verbosity=0,
        **more,
    )
