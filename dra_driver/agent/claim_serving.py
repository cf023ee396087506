"""The claim side of the agent's start: the claim engine, its records and HAMi-core, restored
from disk and put behind kubelet's plugin sockets.

It stands apart from `node.py` because it is one decision made once, before the agent runs:
which records store (flushed or not), whether vGPU shares can be enforced by HAMi-core on this
node, and the engine with its recovery behind the sockets, closed again if the start fails
there. The running agent (`node.NodeAgent`) only receives the engine and the server it built.
"""

from collections.abc import Sequence
from pathlib import PurePosixPath

import structlog

from dra_driver.agent.daemon_reports import DaemonReports
from dra_driver.agent.errors import SetupError, StartupError
from dra_driver.agent.gpu_platform import Platform
from dra_driver.claims.edits.cdi_files import CdiSpecDirectory
from dra_driver.claims.edits.vgpu_edits import HamiCore, enforcement_off_message
from dra_driver.claims.engine import ClaimEngine
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.source import ClaimSource
from dra_driver.claims.status.status_writer import ClaimStatusWriter
from dra_driver.config.settings import NodeSettings
from dra_driver.devices.inventory import Inventory
from dra_driver.devices.modes.registry import taking
from dra_driver.devices.node_config import ConfigProblem, hami_core_missing
from dra_driver.observability.metrics import AgentMetrics
from dra_driver.plugin.server import KubeletPluginServer
from dra_driver.plugin.sockets import SocketPathError
from dra_driver.state.boot_id import current_boot_id

log = structlog.get_logger("dra_driver.node")


def hami_core(
    settings: NodeSettings, inventory: Inventory, problems: Sequence[ConfigProblem]
) -> HamiCore | None:
    """HAMi-core where the operator installed it. A GPU of the config the agent starts with whose
    vGPU shares it is to enforce (vgpu.enforcement: hami-core) on a node without it is a setup
    error: planning (`plan_node`) left it out with a problem, which later configs only report;
    shares left advisory (none) are logged."""
    vgpu_modes = {mode.name for mode in taking("vgpu")}
    vgpu_plans = [plan for plan in inventory.plans if plan.mode in vgpu_modes]
    if settings.hami_core_library is not None:
        return HamiCore(PurePosixPath(settings.hami_core_library), PurePosixPath(settings.hami_core_dir))
    if needing := hami_core_missing(problems):
        raise SetupError(
            f"vgpu.enforcement: hami-core for {', '.join(gpu.label for gpu in needing)} needs "
            "--hami-core-library; set it, or choose vgpu.enforcement mps or none in the node config"
        )
    if advisory := [plan.gpu for plan in vgpu_plans if plan.settings.enforcement == "none"]:
        log.warning(enforcement_off_message(advisory))
    return None


def claim_record_store(settings: NodeSettings) -> ClaimRecordStore:
    """Unflushed records unless `--flush-records` (record_store says why that is enough)."""
    return ClaimRecordStore(settings.state_dir, flush=settings.flush_records)


async def serve_claims(
    settings: NodeSettings,
    platform: Platform,
    cdi_specs: CdiSpecDirectory,
    claim_source: ClaimSource,
    metrics: AgentMetrics,
    inventory: Inventory,
    hami: HamiCore | None,
    claim_status: ClaimStatusWriter | None = None,
    daemon_reports: DaemonReports | None = None,
) -> tuple[ClaimEngine, KubeletPluginServer]:
    """The claim engine, its state restored from disk, behind kubelet's plugin sockets."""
    engine = ClaimEngine(
        driver_name=settings.driver_name,
        pool_name=settings.node_name,
        inventory=inventory,
        edits=platform.edits,
        claim_source=claim_source,
        records=claim_record_store(settings),
        cdi_specs=cdi_specs,
        controls=platform.effect_controls(),
        common_cdi_ids=platform.common_cdi_ids,
        hami_core=hami,
        metrics=metrics.claims,
        claim_status=claim_status,
        on_gpu_daemon=None if daemon_reports is None else daemon_reports.report,
    )
    try:
        for quarantined in await engine.load_state(current_boot_id()):
            log.error(
                "unreadable claim record set aside", path=str(quarantined.path), problem=quarantined.problem
            )
        server = KubeletPluginServer(
            driver_name=settings.driver_name,
            registration_socket=settings.registration_socket,
            dra_socket=settings.dra_socket,
            engine=engine,
        )
        await server.start()
    except BaseException as error:  # a failure, or a signal during start-up
        engine.close()
        await platform.close()
        if isinstance(error, OSError | SocketPathError):
            raise StartupError(str(error)) from error
        raise
    log.info(
        "claims restored from state",
        prepared_claims=len(engine.prepared_claims),
        state_dir=str(settings.state_dir),
    )
    return engine, server
