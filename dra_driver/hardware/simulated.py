"""A simulated node: GPUs from the catalog, identical across runs for the same node name.

This is what the demo, the tests and kind clusters run on. UUIDs and PCI addresses are derived
from the node name and GPU index, so restarting the agent (or running it on another machine)
yields the same devices, exactly as real hardware would. MIG instances are created and destroyed
under the rules NVML enforces (placements, overlap, per-profile and per-GPU limits, engine
budgets), so the device planning that runs here fails here where it would fail on a real GPU.
"""

import fcntl
import os
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import replace

from dra_driver.base.typed_decode import typed, typed_values
from dra_driver.hardware.catalog import MigGeometry
from dra_driver.hardware.mig_rules import format_placement, mig_rejection
from dra_driver.hardware.model import (
    ComputeMode,
    Gpu,
    HardwareError,
    HardwareErrorReason,
    MigInstance,
    MigMode,
    MigProfile,
    Placement,
)
from dra_driver.hardware.simulated_nodes import (
    SimulatedNodeSpec,
    describe_node,
    new_mig_instance,
    simulated_gpus,
)
from dra_driver.state import durable_files
from dra_driver.state.boot_id import current_boot_id
from dra_driver.state.shared_locks import open_lock_file

# The XID NVIDIA drivers log when a GPU has fallen off the bus.
XID_GPU_LOST = 79
FAULT_OPERATIONS = ("discover", "create_mig_instance", "destroy_mig_instance")


class SimulatedEvent(msgspec.Struct, frozen=True):
    """An XID the simulated driver reported for a GPU, as NVML's event set would deliver it."""

    gpu_uuid: str
    xid: int


class _SavedInstance(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    gi: int
    profile_id: int
    start: int
    size: int


class _SavedState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """The MIG instances the simulated GPUs hold, kept as a real GPU keeps them until a reboot."""

    boot_id: str
    # By GPU UUID; decoded by `typed_values`, so that an error names the GPU.
    instances: dict[str, Any]


class SimulatedBackend:
    """The HardwareBackend of a simulated node, with fault-injection hooks for health tests.

    Every method runs to completion without awaiting, so concurrent calls on one event loop
    cannot interleave between a check and the change it allows.
    """

    def __init__(self, node_name: str, spec: SimulatedNodeSpec, state_file: Path | None = None) -> None:
        """`state_file`: where MIG instances are kept across restarts of the agent, as a real GPU
        keeps them; they are forgotten when the boot ID changes, as a reboot clears them."""
        gpus = simulated_gpus(node_name, spec)
        self._description = describe_node(spec)
        self._gpus = {gpu.uuid: replace(gpu, mig_instances=()) for gpu in gpus}
        self._geometry = {
            gpu.uuid: group.model.mig for gpu, group in zip(gpus, spec.group_of_each_gpu(), strict=True)
        }
        self._instances: dict[str, dict[int, tuple[MigProfile, MigInstance]]] = {
            gpu.uuid: {
                instance.gpu_instance_id: (existing.profile, instance)
                for existing, instance in zip(spec_group.mig_instances, gpu.mig_instances, strict=True)
            }
            for gpu, spec_group in zip(gpus, spec.group_of_each_gpu(), strict=True)
        }
        self._lost: set[str] = set()
        self._faults: dict[str, deque[HardwareErrorReason]] = {
            operation: deque() for operation in FAULT_OPERATIONS
        }
        self._events: list[SimulatedEvent] = []
        # Compute modes set (every GPU starts at Default); kept in memory only: the claim
        # records hold what to restore, which is what a restart of the agent needs.
        self._compute_modes: dict[str, ComputeMode] = {}
        self._state_file = state_file
        if state_file is not None:
            self._restore(state_file)

    def _restore(self, state_file: Path) -> None:
        try:
            saved = typed(msgspec.json.decode(state_file.read_bytes()), _SavedState)
            instances = typed_values(saved.instances, tuple[_SavedInstance, ...], "instances")
        except FileNotFoundError:
            return
        except ValueError as error:
            raise HardwareError(
                f"simulated hardware state {state_file} is unreadable: {error}", HardwareErrorReason.OTHER
            ) from error
        if saved.boot_id != current_boot_id():
            return
        for gpu_uuid, entries in instances.items():
            geometry = self._geometry.get(gpu_uuid)
            if geometry is None:
                continue
            restored = {}
            for entry in entries:
                profile = geometry.profile(entry.profile_id)
                if profile is None:
                    continue
                placement = Placement(entry.start, entry.size)
                restored[entry.gi] = (profile, new_mig_instance(gpu_uuid, entry.gi, profile, placement))
            self._instances[gpu_uuid] = restored

    def _save(self) -> None:
        if self._state_file is None:
            return
        state = _SavedState(
            boot_id=current_boot_id(),
            instances={
                gpu_uuid: tuple(
                    _SavedInstance(
                        gi_id, profile.profile_id, instance.placement.start, instance.placement.size
                    )
                    for gi_id, (profile, instance) in sorted(instances.items())
                )
                for gpu_uuid, instances in self._instances.items()
            },
        )
        self._state_file.parent.mkdir(parents=True, exist_ok=True)
        durable_files.atomic_write(self._state_file, msgspec.json.encode(state), durable=True)

    @property
    def description(self) -> str:
        return self._description

    @contextmanager
    def _shared_with_peers(self) -> Iterator[None]:
        """A real GPU is one truth for every process on the node; two agent processes (a rolling
        update) sharing the state file see each other's MIG instances the same way."""
        if self._state_file is None:
            yield
            return
        lock_file = self._state_file.with_name(self._state_file.name + ".lock")
        fd = open_lock_file(lock_file)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for one small read and write
            self._restore(self._state_file)
            yield
        finally:
            os.close(fd)

    async def discover(self) -> tuple[Gpu, ...]:
        self._raise_injected_fault("discover")
        with self._shared_with_peers():
            return self._discovered()

    def current_gpus(self) -> tuple[Gpu, ...]:
        """The GPUs as `discover` would report them, without its fault injection: what the usage
        sampler reads from its own thread."""
        return self._discovered()

    def _discovered(self) -> tuple[Gpu, ...]:
        return tuple(
            replace(gpu, mig_instances=self._current_instances(gpu_uuid))
            for gpu_uuid, gpu in self._gpus.items()
            if gpu_uuid not in self._lost
        )

    async def create_mig_instance(self, gpu_uuid: str, profile_id: int, placement: Placement) -> MigInstance:
        self._raise_injected_fault("create_mig_instance")
        with self._shared_with_peers():
            return self._create_mig_instance(gpu_uuid, profile_id, placement)

    def _create_mig_instance(self, gpu_uuid: str, profile_id: int, placement: Placement) -> MigInstance:
        gpu, geometry = self._mig_enabled_gpu(gpu_uuid, "create a GPU instance")
        profile = geometry.profile(profile_id)
        if profile is None:
            known = ", ".join(f"{p.name} (id {p.profile_id})" for p in geometry.profiles)
            raise HardwareError(
                f"{gpu.label}: cannot create a GPU instance: profile id {profile_id} is not a MIG "
                f"profile of {gpu.product_name}; its profiles: {known}",
                HardwareErrorReason.INVALID_ARGUMENT,
            )
        instances = self._instances[gpu_uuid]
        existing = [(other_profile, other.placement) for other_profile, other in instances.values()]
        if rejection := mig_rejection(geometry, existing, profile, placement):
            raise HardwareError(
                f"{gpu.label}: cannot create a GPU instance of profile {profile.name} "
                f"(id {profile_id}) at placement {format_placement(placement)}: {rejection.detail}",
                rejection.reason,
            )
        gi_id = min(set(range(1, len(instances) + 2)) - set(instances))
        instance = new_mig_instance(gpu_uuid, gi_id, profile, placement)
        instances[gi_id] = (profile, instance)
        self._save()
        return instance

    async def destroy_mig_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        """NOT_SUPPORTED where MIG mode is not enabled, as nvmlDeviceGetGpuInstanceById answers."""
        self._raise_injected_fault("destroy_mig_instance")
        with self._shared_with_peers():
            self._destroy_mig_instance(gpu_uuid, gpu_instance_id)

    def _destroy_mig_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        gpu, _ = self._mig_enabled_gpu(gpu_uuid, "destroy a GPU instance")
        instances = self._instances[gpu_uuid]
        if gpu_instance_id not in instances:
            existing = ", ".join(map(str, sorted(instances))) or "none"
            raise HardwareError(
                f"{gpu.label}: cannot destroy GPU instance {gpu_instance_id}: no such instance "
                f"(existing GPU instance ids: {existing})",
                HardwareErrorReason.NOT_FOUND,
            )
        del instances[gpu_instance_id]
        self._save()

    async def compute_mode(self, gpu_uuid: str) -> ComputeMode:
        self._known_gpu(gpu_uuid)
        return self._compute_modes.get(gpu_uuid, "Default")

    async def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        self._known_gpu(gpu_uuid)
        self._compute_modes[gpu_uuid] = mode

    async def close(self) -> None:
        return None

    def fail_next(self, operation: str, reason: HardwareErrorReason) -> None:
        """Makes the next call of `operation` ("discover", "create_mig_instance" or
        "destroy_mig_instance") raise HardwareError(reason) once, before it changes anything.
        Calls add up: arming an operation twice fails its next two calls."""
        if operation not in self._faults:
            raise ValueError(
                f"cannot inject a fault into {operation!r}; operations: {', '.join(FAULT_OPERATIONS)}"
            )
        self._faults[operation].append(reason)

    def raise_xid(self, gpu_uuid: str, xid: int) -> None:
        """Records an XID for the GPU, as if the driver reported it; take_events() returns it."""
        self._known_gpu(gpu_uuid)
        self._events.append(SimulatedEvent(gpu_uuid, xid))

    def lose_gpu(self, gpu_uuid: str) -> None:
        """The GPU falls off the bus: XID 79 is recorded, discover() stops listing it and MIG calls
        on it raise GPU_LOST, as NVML does until the node is rebooted."""
        self._known_gpu(gpu_uuid)
        if gpu_uuid not in self._lost:
            self._lost.add(gpu_uuid)
            self._events.append(SimulatedEvent(gpu_uuid, XID_GPU_LOST))

    def take_events(self) -> tuple[SimulatedEvent, ...]:
        """The events recorded since the last call, oldest first."""
        events, self._events = tuple(self._events), []
        return events

    def _current_instances(self, gpu_uuid: str) -> tuple[MigInstance, ...]:
        instances = self._instances[gpu_uuid]
        return tuple(instances[gi_id][1] for gi_id in sorted(instances))

    def _raise_injected_fault(self, operation: str) -> None:
        if self._faults[operation]:
            reason = self._faults[operation].popleft()
            raise HardwareError(
                f"simulated {operation} failure injected by fail_next ({reason.value})", reason
            )

    def _known_gpu(self, gpu_uuid: str) -> Gpu:
        gpu = self._gpus.get(gpu_uuid)
        if gpu is None:
            raise HardwareError(
                f"no GPU with UUID {gpu_uuid} on this simulated node ({len(self._gpus)} GPUs)",
                HardwareErrorReason.NOT_FOUND,
            )
        return gpu

    def _mig_enabled_gpu(self, gpu_uuid: str, action: str) -> tuple[Gpu, MigGeometry]:
        gpu = self._known_gpu(gpu_uuid)
        if gpu_uuid in self._lost:
            raise HardwareError(
                f"{gpu.label}: cannot {action}: the GPU is lost (fell off the bus, XID {XID_GPU_LOST})",
                HardwareErrorReason.GPU_LOST,
            )
        geometry = self._geometry[gpu_uuid]
        if geometry is None or gpu.mig_mode is not MigMode.ENABLED:
            raise HardwareError(
                f"{gpu.label}: cannot {action}: MIG mode is {gpu.mig_mode.value} on this GPU",
                HardwareErrorReason.NOT_SUPPORTED,
            )
        return gpu, geometry
