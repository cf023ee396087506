"""Real or simulated GPUs, decided once: everything that differs between the two, opened at start.

The rest of the agent takes a `Platform` and never asks which kind it has. A real node loads
NVML from the driver root (waiting for the driver to appear), finds the driver's files for the
node-wide CDI spec, sets time slices with nvidia-smi and runs MPS with the driver's control
program, and hears of XIDs through NVML events. A simulated node has none of that: its stand-ins
keep state in files, and its faults come from `dra-driver simulate-fault` through an inbox.
Features added later take what differs from here too: the usage reader (NVML, or a file of the
state dir) and whether MPS daemon pods must be privileged (only to open real device nodes).
"""

import asyncio
import platform
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import structlog

from dra_driver.agent.errors import SetupError, StartupError
from dra_driver.claims.edits import cdi
from dra_driver.claims.edits.cdi_files import CdiSpecDirectory
from dra_driver.claims.edits.driver_edits import common_edits, control_device_nodes
from dra_driver.claims.edits.gpu_edits import DeviceEdits, NvmlEdits, SimulatedEdits
from dra_driver.claims.engine import EffectControls, SharingControls
from dra_driver.claims.sharing.mps import NvidiaMps, SimulatedMps
from dra_driver.config.settings import InventorySettings, NodeSettings
from dra_driver.hardware.backend import HardwareBackend
from dra_driver.hardware.driver_root import DriverDiscovery, device_root, discover_driver
from dra_driver.hardware.health_events import HealthEventSource, SimulatedEvents
from dra_driver.hardware.model import Gpu, HardwareError
from dra_driver.hardware.pci_binding import PciBinding
from dra_driver.hardware.simulated import SimulatedBackend
from dra_driver.hardware.simulated_pci import SimulatedPciBinding, make_pci_tree
from dra_driver.hardware.simulated_usage import SimulatedUsageReader
from dra_driver.hardware.time_slicing import NvidiaSmiTimeSlicer, SimulatedTimeSlicer
from dra_driver.hardware.usage import UsageReader
from dra_driver.health.simulated_faults import apply_pending_faults, open_inbox

if TYPE_CHECKING:
    from dra_driver.hardware.nvml import NvmlBackend

# Under a simulated node's state directory: its sysfs PCI tree (hardware/simulated_pci).
SIMULATED_SYSFS = "simulated-sysfs"

log = structlog.get_logger("dra_driver.node")

# How often injected faults and simulated XIDs are picked up.
HEALTH_POLL_SECONDS = 0.5
# Where the simulated backend keeps its MIG instances, so they outlive a restart of the agent
# as they would on a real GPU.
SIMULATED_HARDWARE_STATE = "simulated-hardware.json"
# On a simulated node, tests and demos say what runs on which GPU in this file of the state dir.
SIMULATED_USAGE_FILE = "simulated-usage.json"

Background = Callable[[], Coroutine[Any, Any, None]]
# Called with True when the agent starts waiting for the NVIDIA driver, with False once it appeared.
DriverWait = Callable[[bool], object]
_Backend = TypeVar("_Backend", bound=HardwareBackend)


class Platform(msgspec.Struct, frozen=True):
    hardware: HardwareBackend
    # Every GPU found at start, offered or not: what node configs are planned against. The agent
    # keeps only the MIG instances no claim record names (node_configs.unclaimed_mig).
    gpus: tuple[Gpu, ...]
    edits: DeviceEdits
    sharing: SharingControls
    health_source: HealthEventSource
    # Opens the reader of GPU usage, called only when usage metrics are on.
    usage_reader: Callable[[], UsageReader]
    # Whether MPS daemons in pods (--mps-daemons pod) run privileged: a real daemon's MPS server
    # opens the claim's GPU device nodes; a simulated one opens none and must not be.
    mps_pods_privileged: bool
    # CDI devices every prepared device also gets (the node-wide spec, already written).
    common_cdi_ids: tuple[str, ...] = ()
    # Work that runs as long as the agent (a simulated node's fault inbox).
    background: tuple[tuple[str, Background], ...] = ()
    # Where GPUs are bound to vfio-pci for VMs (mode vfio).
    pci: PciBinding | None = None

    def effect_controls(self) -> EffectControls:
        """What the claims' side effects act through (claims/effects/registry.py)."""
        return EffectControls(hardware=self.hardware, sharing=self.sharing, pci=self.pci)

    async def close(self) -> None:
        await self.hardware.close()


def _nvml_hardware(settings: InventorySettings) -> "NvmlBackend":
    from dra_driver.hardware.nvml import NvmlBackend  # noqa: PLC0415 - pynvml only where asked for

    return NvmlBackend(settings.sysfs_root / "bus" / "pci" / "devices", settings.driver_root)


def _simulated_hardware(settings: InventorySettings, state_dir: Path | None) -> SimulatedBackend:
    from dra_driver.hardware.simulated_nodes import resolve_node_spec  # noqa: PLC0415

    state_file = state_dir / SIMULATED_HARDWARE_STATE if state_dir is not None else None
    return SimulatedBackend(settings.node_name, resolve_node_spec(settings.hardware.source), state_file)


async def _discover(
    settings: InventorySettings, opened: Callable[[], _Backend]
) -> tuple[_Backend, tuple[Gpu, ...]]:
    try:
        hardware = opened()
        try:
            return hardware, tuple(await hardware.discover())
        except BaseException:  # a failure, or a signal during start-up: NVML is shut down again
            await hardware.close()
            raise
    except HardwareError as error:
        # A simulated node is the operator's description; real GPUs failing are a run-time matter.
        failure = SetupError if settings.hardware.kind == "simulated" else StartupError
        raise failure(f"--hardware {settings.hardware}: {error}") from error


async def discover_gpus(
    settings: InventorySettings, state_dir: Path | None = None
) -> tuple[HardwareBackend, tuple[Gpu, ...]]:
    """The hardware, opened, and its GPUs as they are at start (for `inspect`: nothing else)."""
    if settings.hardware.kind == "nvml":
        return await _discover(settings, lambda: _nvml_hardware(settings))
    return await _discover(settings, lambda: _simulated_hardware(settings, state_dir))


async def open_platform(
    settings: NodeSettings, cdi_specs: CdiSpecDirectory, on_driver_wait: DriverWait | None = None
) -> Platform:
    """`on_driver_wait`: told if the NVIDIA library is not there yet, before waiting for it (to
    serve the probes meanwhile: waiting is not a failure), and again once it appeared."""
    hardware: HardwareBackend
    if settings.hardware.kind == "nvml":
        await _wait_for_driver(settings.driver_root, on_driver_wait)
        nvml, gpus = await _discover(settings.inventory, lambda: _nvml_hardware(settings.inventory))
        hardware, opening = nvml, _real(settings, nvml, gpus, cdi_specs)
    else:
        simulated, gpus = await _discover(
            settings.inventory, lambda: _simulated_hardware(settings.inventory, settings.state_dir)
        )
        hardware, opening = simulated, _simulated(settings, simulated, gpus)
    try:
        return await opening
    except BaseException:
        await hardware.close()
        raise


async def _wait_for_driver(driver_root: Path, on_driver_wait: DriverWait | None) -> None:
    from dra_driver.hardware.nvml_library import NvmlLibraryNotFound, load_nvml_library  # noqa: PLC0415
    from dra_driver.hardware.nvml_wait import wait_for_nvml_library  # noqa: PLC0415

    try:
        await asyncio.to_thread(load_nvml_library, driver_root)
    except NvmlLibraryNotFound:
        if on_driver_wait is not None:
            on_driver_wait(True)
        await wait_for_nvml_library(driver_root)
        if on_driver_wait is not None:
            on_driver_wait(False)


async def _real(
    settings: NodeSettings, hardware: "NvmlBackend", gpus: tuple[Gpu, ...], cdi_specs: CdiSpecDirectory
) -> Platform:
    from dra_driver.hardware.nvml_events import NvmlEvents  # noqa: PLC0415 - pynvml only on GPUs

    try:
        discovery = await asyncio.to_thread(_driver_files, settings.driver_root, gpus)
        await asyncio.to_thread(_write_node_spec, settings, discovery, cdi_specs)
        sharing = SharingControls(
            NvidiaSmiTimeSlicer(discovery),
            NvidiaMps(discovery, settings.mps_dir),
            # MPS sets whole GPUs' compute mode through NVML.
            compute_modes=hardware,
        )
    except HardwareError as error:  # a driver program missing from the driver root
        raise StartupError(f"--driver-root {settings.driver_root}: {error}") from error
    except (OSError, ValueError) as error:
        raise StartupError(f"cannot write the node's CDI spec in {settings.cdi_dir}: {error}") from error
    return Platform(
        hardware=hardware,
        gpus=gpus,
        edits=NvmlEdits(
            proc_root=settings.proc_root,
            dev_root=device_root(settings.driver_root, settings.host_root).host,
        ),
        sharing=sharing,
        health_source=NvmlEvents(known_gpus={gpu.index: gpu.uuid for gpu in gpus}),
        usage_reader=lambda: _nvml_usage_reader(settings.driver_root),
        mps_pods_privileged=True,
        common_cdi_ids=(cdi.common_device_id(settings.driver_name),),
        pci=PciBinding(settings.sysfs_root),
    )


def _nvml_usage_reader(driver_root: Path) -> UsageReader:
    from dra_driver.hardware.nvml_usage import NvmlUsageReader  # noqa: PLC0415 - only with usage metrics on

    return NvmlUsageReader(driver_root)


def _driver_files(driver_root: Path, gpus: Sequence[Gpu]) -> DriverDiscovery:
    version = gpus[0].driver_version if gpus and gpus[0].driver_version else "unknown"
    discovery = discover_driver(driver_root, version)
    log.info(
        "driver files found",
        root=str(driver_root),
        version=discovery.version,
        libraries=len(discovery.libraries),
        programs=len(discovery.binaries),
        library_dirs=list(discovery.library_dirs),
        binary_dirs=list(discovery.binary_dirs),
    )
    for missing in discovery.missing:
        log.warning("driver file not found under the driver root", file=missing, root=str(driver_root))
    for unusable in discovery.unusable:
        log.warning("driver root path not followed", path=unusable.path, reason=unusable.reason)
    return discovery


def _write_node_spec(settings: NodeSettings, discovery: DriverDiscovery, cdi_specs: CdiSpecDirectory) -> None:
    """The node-wide CDI spec: control device nodes, driver libraries and tools found under the
    driver root, named as the host has them (the runtime resolves them there), libraries mounted
    where this node's architecture's container loaders look. Its device ID goes with every
    prepared device."""
    nodes = control_device_nodes(device_root(settings.driver_root, settings.host_root))
    edits = common_edits(discovery, nodes, settings.host_root, platform.machine())
    cdi_specs.write_node_spec(edits)


async def _simulated(settings: NodeSettings, hardware: SimulatedBackend, gpus: tuple[Gpu, ...]) -> Platform:
    by_index = {str(gpu.index): gpu.uuid for gpu in gpus}
    # Before the agent says it runs, so that a fault sent once it does is always taken.
    open_inbox(settings.state_dir, by_index)
    # The GPUs' PCI entries, made up as the kernel would show them, for mode vfio.
    sysfs = settings.state_dir / SIMULATED_SYSFS
    await asyncio.to_thread(make_pci_tree, sysfs, gpus)

    async def take_faults() -> None:
        while True:
            await asyncio.to_thread(apply_pending_faults, settings.state_dir, hardware, by_index)
            await asyncio.sleep(HEALTH_POLL_SECONDS)

    return Platform(
        hardware=hardware,
        gpus=gpus,
        edits=SimulatedEdits(),
        sharing=SharingControls(
            SimulatedTimeSlicer(gpu.uuid for gpu in gpus),
            SimulatedMps(settings.mps_dir),
            compute_modes=hardware,
        ),
        health_source=SimulatedEvents(hardware, HEALTH_POLL_SECONDS),
        usage_reader=lambda: SimulatedUsageReader(
            hardware.current_gpus, settings.state_dir / SIMULATED_USAGE_FILE
        ),
        mps_pods_privileged=False,
        background=(("fault-inbox", take_faults),),
        pci=SimulatedPciBinding(sysfs),
    )
