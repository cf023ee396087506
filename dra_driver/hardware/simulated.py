"""A simulated node: GPUs from the catalog, identical across runs for the same node name.

This is what the demo, the tests and kind clusters run on. UUIDs and PCI addresses are derived
from the node name and GPU index, so restarting the agent (or running it on another machine)
yields the same devices, exactly as real hardware would. MIG instances are created and destroyed
under the rules NVML enforces (placements, overlap, per-profile and per-GPU limits, engine
budgets), so the device planning that runs here fails here where it would fail on a real GPU.
"""

import uuid
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from dra_driver.hardware.model import (
    Gpu,
    HardwareError,
    HardwareErrorReason,
    MigInstance,
    MigMode,
    MigProfile,
    Placement,
)

MAX_SIMULATED_GPUS = 16
DEFAULT_DRIVER_VERSION = "580.95.05"
DEFAULT_CUDA_DRIVER_VERSION = "13.0"
# The XID NVIDIA drivers log when a GPU has fallen off the bus.
XID_GPU_LOST = 79
FAULT_OPERATIONS = ("discover", "create_mig_instance", "destroy_mig_instance")
_MIB = 2**20
_UUID_NAMESPACE = uuid.UUID("6b1f0c3e-5d4a-4c2b-9e8f-7a6d5c4b3a29")


# ---------------------------------------------------------------------------------------------
# The GPU catalog
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigResources:
    """What GPU instances draw from their GPU besides memory slices.

    NVML refuses an instance when the engines or SMs it needs are already taken, which is how a
    second "+me" instance (the one with the GPU's only OFA) is refused even with slices free.
    """

    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_bytes: int

    @classmethod
    def of(cls, profile: MigProfile) -> "MigResources":
        return cls(
            multiprocessors=profile.multiprocessors,
            copy_engines=profile.copy_engines,
            decoders=profile.decoders,
            encoders=profile.encoders,
            jpeg_engines=profile.jpeg_engines,
            ofa_engines=profile.ofa_engines,
            memory_bytes=profile.memory_bytes,
        )

    @classmethod
    def total(cls, profiles: Iterable[MigProfile]) -> "MigResources":
        nothing = cls(*(0 for _ in fields(cls)))
        return sum((cls.of(profile) for profile in profiles), nothing)

    def __add__(self, other: "MigResources") -> "MigResources":
        return MigResources(
            *(mine + theirs for mine, theirs in zip(self.amounts(), other.amounts(), strict=True))
        )

    def amounts(self) -> tuple[int, ...]:
        return tuple(getattr(self, field.name) for field in fields(self))

    def exceeding(self, capacity: "MigResources") -> list[str]:
        """'<resource> <needed> > <capacity>' for every resource this needs more of than there is."""
        return [
            f"{field.name.replace('_', ' ')} {needed} > {available}"
            for field, needed, available in zip(fields(self), self.amounts(), capacity.amounts(), strict=True)
            if needed > available
        ]


@dataclass(frozen=True, slots=True)
class MigGeometry:
    memory_slices: int
    max_gpu_instances: int
    profiles: tuple[MigProfile, ...]
    # What all instances together may use: the engines and SMs of the full-GPU profile (the one
    # with the most compute slices) and the GPU's memory.
    capacity: MigResources

    def profile(self, profile_id: int) -> MigProfile | None:
        return next((profile for profile in self.profiles if profile.profile_id == profile_id), None)

    def profile_named(self, name: str) -> MigProfile | None:
        return next((profile for profile in self.profiles if profile.name == name), None)


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    memory_mib: int
    multiprocessors: int
    # None for GPUs without MIG (NVML answers NOT_SUPPORTED for their MIG mode).
    mig: MigGeometry | None

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * _MIB


def _read_packaged_yaml(name: str) -> dict[str, Any]:
    text = resources.files("dra_driver.hardware.catalog").joinpath(name).read_text(encoding="utf-8")
    loaded = yaml.safe_load(text)
    if not isinstance(loaded, dict):
        raise HardwareError(f"packaged catalog {name} is not a mapping; the package is damaged")
    return loaded


def _catalog_profile(raw: dict[str, Any]) -> MigProfile:
    return MigProfile(
        profile_id=raw["id"],
        nvml_enum=raw["nvmlEnum"],
        name=raw["name"],
        compute_slices=raw["computeSlices"],
        memory_bytes=raw["memoryMiB"] * _MIB,
        multiprocessors=raw["multiprocessors"],
        copy_engines=raw["copyEngines"],
        decoders=raw["decoders"],
        encoders=raw["encoders"],
        jpeg_engines=raw["jpegEngines"],
        ofa_engines=raw["ofaEngines"],
        max_instances=raw["maxInstances"],
        placements=tuple(Placement(start, size) for start, size in raw["placements"]),
    )


def mig_capacity(profiles: Sequence[MigProfile], gpu_memory_bytes: int) -> MigResources:
    """The full-GPU profile is the only published statement of what the whole GPU has; memory is
    the GPU's own total because the full-GPU profile leaves some of it unusable."""
    full_gpu = max(profiles, key=lambda profile: profile.compute_slices)
    return replace(MigResources.of(full_gpu), memory_bytes=gpu_memory_bytes)


def _catalog_model(key: str, raw: dict[str, Any]) -> GpuModel:
    mig = None
    if "mig" in raw:
        profiles = tuple(_catalog_profile(profile) for profile in raw["mig"]["profiles"])
        mig = MigGeometry(
            memory_slices=raw["mig"]["memorySlices"],
            max_gpu_instances=raw["mig"]["maxGpuInstances"],
            profiles=profiles,
            capacity=mig_capacity(profiles, raw["memoryMiB"] * _MIB),
        )
    return GpuModel(
        key=key,
        product_name=raw["productName"],
        brand=raw["brand"],
        architecture=raw["architecture"],
        cuda_compute_capability=raw["cudaComputeCapability"],
        memory_mib=raw["memoryMiB"],
        multiprocessors=raw["multiprocessors"],
        mig=mig,
    )


@cache
def gpu_models() -> Mapping[str, GpuModel]:
    """The packaged catalog (generated by hack/build-catalog.py), keyed by model key."""
    return {key: _catalog_model(key, raw) for key, raw in _read_packaged_yaml("gpus.yaml").items()}


# ---------------------------------------------------------------------------------------------
# The MIG rules
# ---------------------------------------------------------------------------------------------


class MigRejection(NamedTuple):
    reason: HardwareErrorReason
    detail: str


def format_placement(placement: Placement) -> str:
    return f"(start {placement.start}, size {placement.size})"


def mig_rejection(
    geometry: MigGeometry,
    existing: Sequence[tuple[MigProfile, Placement]],
    profile: MigProfile,
    placement: Placement,
) -> MigRejection | None:
    """Why NVML would refuse a GPU instance of `profile` at `placement` next to `existing`, or None.

    One pure function for both the backend and the node-file decoder, so a pre-existing instance
    that a node file declares is held to exactly the rules a created one is.
    """
    if placement not in profile.placements:
        allowed = ", ".join(format_placement(p) for p in profile.placements)
        return MigRejection(
            HardwareErrorReason.INVALID_ARGUMENT,
            f"placement {format_placement(placement)} is not one the profile has; its placements: {allowed}",
        )
    for other_profile, other_placement in existing:
        if set(placement.memory_slices) & set(other_placement.memory_slices):
            return MigRejection(
                HardwareErrorReason.INSUFFICIENT_RESOURCES,
                f"its memory slices overlap the existing {other_profile.name} instance at placement "
                f"{format_placement(other_placement)}",
            )
    if sum(other.profile_id == profile.profile_id for other, _ in existing) >= profile.max_instances:
        return MigRejection(
            HardwareErrorReason.INSUFFICIENT_RESOURCES,
            f"the GPU already has the most instances of this profile it allows ({profile.max_instances})",
        )
    if len(existing) >= geometry.max_gpu_instances:
        return MigRejection(
            HardwareErrorReason.INSUFFICIENT_RESOURCES,
            f"the GPU already has the most GPU instances it allows ({geometry.max_gpu_instances})",
        )
    needed = MigResources.total([*(other for other, _ in existing), profile])
    if shortfalls := needed.exceeding(geometry.capacity):
        return MigRejection(
            HardwareErrorReason.INSUFFICIENT_RESOURCES,
            f"together with the existing instances it needs more than the GPU has: {', '.join(shortfalls)}",
        )
    return None


# ---------------------------------------------------------------------------------------------
# Node descriptions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigInstanceSpec:
    profile: MigProfile
    placement: Placement


@dataclass(frozen=True, slots=True)
class GpuGroupSpec:
    model: GpuModel
    count: int
    mig_mode: MigMode
    # Instances that exist on each GPU of the group when the node starts (static MIG).
    mig_instances: tuple[MigInstanceSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class SimulatedNodeSpec:
    origin: str
    groups: tuple[GpuGroupSpec, ...]
    driver_version: str = DEFAULT_DRIVER_VERSION
    cuda_driver_version: str = DEFAULT_CUDA_DRIVER_VERSION
    fabric_clique: str | None = None

    def group_of_each_gpu(self) -> tuple[GpuGroupSpec, ...]:
        """The group of GPU 0, 1, ...: groups are numbered in the order the description lists them."""
        return tuple(group for group in self.groups for _ in range(group.count))


_NODE_FIELDS = ("driverVersion", "cudaDriverVersion", "fabricClique", "gpus")
_GROUP_FIELDS = ("model", "count", "migMode", "migInstances")
_INSTANCE_FIELDS = ("profile", "start")
_MIG_MODES = {"enabled": MigMode.ENABLED, "disabled": MigMode.DISABLED}


class _FieldError(Exception):
    """A decoding error deep in the document; parse_node_spec adds the origin."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _mapping(raw: object, path: str, allowed: tuple[str, ...], required: tuple[str, ...]) -> dict[Any, Any]:
    if not isinstance(raw, dict):
        raise _FieldError(path, f"expected a mapping with fields {', '.join(allowed)}, got {_type_name(raw)}")
    if unknown := [key for key in raw if key not in allowed]:
        raise _FieldError(
            path, f"unknown field(s) {sorted(map(str, unknown))}; allowed: {', '.join(allowed)}"
        )
    if missing := [field for field in required if field not in raw]:
        raise _FieldError(_child(path, missing[0]), "required field is missing")
    return raw


def _child(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def _integer(raw: object, path: str, minimum: int, maximum: int) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or not minimum <= raw <= maximum:
        raise _FieldError(path, f"expected an integer from {minimum} to {maximum}, got {raw!r}")
    return raw


def _version(raw: object, path: str, example: str) -> str:
    if not isinstance(raw, str) or not all(part.isdigit() for part in raw.split(".")):
        raise _FieldError(path, f"expected a dotted version string like {example!r}, got {raw!r}")
    return raw


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _fabric_clique(raw: object, path: str) -> str:
    """NVML reports a clique as '<cluster UUID>.<clique id>'; consumers split it on the last dot."""
    if isinstance(raw, str):
        cluster, _, clique = raw.rpartition(".")
        if _is_uuid(cluster) and clique.isdigit():
            return raw
    raise _FieldError(path, f"expected '<cluster UUID>.<clique id>' like '{uuid.UUID(int=1)}.0', got {raw!r}")


def _model(raw: object, path: str) -> GpuModel:
    models = gpu_models()
    if not isinstance(raw, str) or raw not in models:
        raise _FieldError(path, f"unknown GPU model {raw!r}; known models: {', '.join(sorted(models))}")
    return models[raw]


def _mig_mode(raw: object, path: str, model: GpuModel) -> MigMode:
    if not isinstance(raw, str) or raw not in _MIG_MODES:
        raise _FieldError(path, f"expected 'enabled' or 'disabled', got {raw!r}")
    if model.mig is None:
        if _MIG_MODES[raw] is MigMode.ENABLED:
            raise _FieldError(path, f"model {model.key} does not support MIG; only 'disabled' is allowed")
        return MigMode.UNSUPPORTED
    return _MIG_MODES[raw]


def _mig_instance(
    raw: object, path: str, geometry: MigGeometry, accepted: Sequence[MigInstanceSpec]
) -> MigInstanceSpec:
    item = _mapping(raw, path, _INSTANCE_FIELDS, required=_INSTANCE_FIELDS)
    name = item["profile"]
    profile = geometry.profile_named(name) if isinstance(name, str) else None
    if profile is None:
        known = ", ".join(p.name for p in geometry.profiles)
        raise _FieldError(f"{path}.profile", f"unknown MIG profile {name!r}; this model's profiles: {known}")
    start = item["start"]
    placement = next((p for p in profile.placements if p.start == start and type(start) is int), None)
    if placement is None:
        starts = ", ".join(str(p.start) for p in profile.placements)
        raise _FieldError(
            f"{path}.start", f"{start!r} is not a placement start of {profile.name}; allowed: {starts}"
        )
    if rejection := mig_rejection(geometry, [(s.profile, s.placement) for s in accepted], profile, placement):
        raise _FieldError(
            path, f"{profile.name} at placement {format_placement(placement)}: {rejection.detail}"
        )
    return MigInstanceSpec(profile, placement)


def _mig_instances(raw: object, path: str, model: GpuModel, mode: MigMode) -> tuple[MigInstanceSpec, ...]:
    if not isinstance(raw, list):
        raise _FieldError(path, f"expected a list of {{profile, start}} mappings, got {_type_name(raw)}")
    if not raw:
        return ()
    if model.mig is None or mode is not MigMode.ENABLED:
        raise _FieldError(path, "pre-existing MIG instances need migMode: enabled")
    accepted: list[MigInstanceSpec] = []
    for position, item in enumerate(raw):
        accepted.append(_mig_instance(item, f"{path}[{position}]", model.mig, accepted))
    return tuple(accepted)


def _group(raw: object, path: str) -> GpuGroupSpec:
    group = _mapping(raw, path, _GROUP_FIELDS, required=("model", "count"))
    model = _model(group["model"], f"{path}.model")
    mode = _mig_mode(group.get("migMode", "disabled"), f"{path}.migMode", model)
    return GpuGroupSpec(
        model=model,
        count=_integer(group["count"], f"{path}.count", 1, MAX_SIMULATED_GPUS),
        mig_mode=mode,
        mig_instances=_mig_instances(group.get("migInstances", []), f"{path}.migInstances", model, mode),
    )


def _node(raw: object, origin: str) -> SimulatedNodeSpec:
    node = _mapping(raw, "", _NODE_FIELDS, required=("gpus",))
    if not isinstance(node["gpus"], list) or not node["gpus"]:
        raise _FieldError("gpus", f"expected a non-empty list of GPU groups, got {node['gpus']!r}")
    groups = tuple(_group(group, f"gpus[{position}]") for position, group in enumerate(node["gpus"]))
    if (total := sum(group.count for group in groups)) > MAX_SIMULATED_GPUS:
        raise _FieldError("gpus", f"{total} GPUs in all; a simulated node has at most {MAX_SIMULATED_GPUS}")
    clique = node.get("fabricClique")
    return SimulatedNodeSpec(
        origin=origin,
        groups=groups,
        driver_version=_version(
            node.get("driverVersion", DEFAULT_DRIVER_VERSION), "driverVersion", DEFAULT_DRIVER_VERSION
        ),
        cuda_driver_version=_version(
            node.get("cudaDriverVersion", DEFAULT_CUDA_DRIVER_VERSION),
            "cudaDriverVersion",
            DEFAULT_CUDA_DRIVER_VERSION,
        ),
        fabric_clique=None if clique is None else _fabric_clique(clique, "fabricClique"),
    )


def parse_node_spec(raw: object, origin: str) -> SimulatedNodeSpec:
    """Strictly decodes a node description; every error names the origin, the field path and what
    was allowed, because a typo in a node file should not quietly become a different node."""
    try:
        return _node(raw, origin)
    except _FieldError as error:
        where = f"field {error.path}" if error.path else "top level"
        raise HardwareError(
            f"simulated node {origin}: {where}: {error.message}", HardwareErrorReason.INVALID_ARGUMENT
        ) from None


@cache
def node_profiles() -> Mapping[str, SimulatedNodeSpec]:
    """The named nodes of node-profiles.yaml, decoded all at once so that a broken profile fails
    every use (and the tests) rather than only the run that picks it."""
    raw = _read_packaged_yaml("node-profiles.yaml")
    return {name: parse_node_spec(description, f"profile {name}") for name, description in raw.items()}


def resolve_node_spec(source: str) -> SimulatedNodeSpec:
    """`source` is a profile name, or a path (anything with '/' or a .yaml/.yml suffix)."""
    if "/" in source or source.endswith((".yaml", ".yml")):
        path = Path(source)
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise HardwareError(f"simulated node file {source}: cannot read it: {error.strerror}") from error
        except yaml.YAMLError as error:
            raise HardwareError(f"simulated node file {source}: not valid YAML: {error}") from error
        return parse_node_spec(raw, f"file {source}")
    profiles = node_profiles()
    if source not in profiles:
        raise HardwareError(
            f"unknown simulated node profile {source!r}; known profiles: {', '.join(sorted(profiles))}",
            HardwareErrorReason.NOT_FOUND,
        )
    return profiles[source]


# ---------------------------------------------------------------------------------------------
# The GPUs of a node
# ---------------------------------------------------------------------------------------------


def mig_instance_uuid(gpu_uuid: str, gpu_instance_id: int, profile_id: int, start: int) -> str:
    return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{gpu_uuid}/{gpu_instance_id}/{profile_id}/{start}')}"


def new_mig_instance(
    gpu_uuid: str, gpu_instance_id: int, profile: MigProfile, placement: Placement
) -> MigInstance:
    """An instance as NVML reports it right after creation: one compute instance (id 0) spanning
    the whole GPU instance."""
    return MigInstance(
        uuid=mig_instance_uuid(gpu_uuid, gpu_instance_id, profile.profile_id, placement.start),
        profile_id=profile.profile_id,
        placement=placement,
        gpu_instance_id=gpu_instance_id,
        compute_instance_id=0,
        compute_slices=profile.compute_slices,
        multiprocessors=profile.multiprocessors,
    )


def _simulated_gpu(node_name: str, spec: SimulatedNodeSpec, index: int, group: GpuGroupSpec) -> Gpu:
    model = group.model
    gpu_uuid = f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"
    bus = 0x18 + 0x0C * index
    instances = tuple(
        new_mig_instance(gpu_uuid, gi_id, existing.profile, existing.placement)
        for gi_id, existing in enumerate(group.mig_instances, start=1)
    )
    return Gpu(
        uuid=gpu_uuid,
        index=index,
        minor=index,
        product_name=model.product_name,
        brand=model.brand,
        architecture=model.architecture,
        cuda_compute_capability=model.cuda_compute_capability,
        memory_bytes=model.memory_bytes,
        multiprocessors=model.multiprocessors,
        pci_bus_id=f"0000:{bus:02x}:00.0",
        pcie_root=f"pci0000:{0x10 * (index // 2):02x}",
        # Two sockets: the first half of the GPUs hangs off the first.
        numa_node=index * 2 // sum(g.count for g in spec.groups),
        driver_version=spec.driver_version,
        cuda_driver_version=spec.cuda_driver_version,
        mig_mode=group.mig_mode,
        memory_slices=model.mig.memory_slices if model.mig else 0,
        mig_profiles=model.mig.profiles if model.mig else (),
        mig_instances=instances,
        fabric_clique=spec.fabric_clique,
    )


def simulated_gpus(node_name: str, spec: SimulatedNodeSpec) -> tuple[Gpu, ...]:
    """The GPUs of `spec` as they would appear on node `node_name` when it boots."""
    return tuple(
        _simulated_gpu(node_name, spec, index, group) for index, group in enumerate(spec.group_of_each_gpu())
    )


def describe_node(spec: SimulatedNodeSpec) -> str:
    def group_text(group: GpuGroupSpec) -> str:
        text = f"{group.count}x {group.model.product_name}"
        if group.mig_mode is not MigMode.ENABLED:
            return text
        names = ", ".join(instance.profile.name for instance in group.mig_instances)
        return f"{text} (MIG enabled: {names})" if names else f"{text} (MIG enabled)"

    return f"simulated {spec.origin}: {', '.join(group_text(group) for group in spec.groups)}"


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimulatedEvent:
    """An XID the simulated driver reported for a GPU, as NVML's event set would deliver it."""

    gpu_uuid: str
    xid: int


class SimulatedBackend:
    """The HardwareBackend of a simulated node, with fault-injection hooks for health tests.

    Every method runs to completion without awaiting, so concurrent calls on one event loop
    cannot interleave between a check and the change it allows.
    """

    def __init__(self, node_name: str, spec: SimulatedNodeSpec) -> None:
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

    @property
    def description(self) -> str:
        return self._description

    async def discover(self) -> tuple[Gpu, ...]:
        self._raise_injected_fault("discover")
        return tuple(
            replace(gpu, mig_instances=self._current_instances(gpu_uuid))
            for gpu_uuid, gpu in self._gpus.items()
            if gpu_uuid not in self._lost
        )

    async def create_mig_instance(self, gpu_uuid: str, profile_id: int, placement: Placement) -> MigInstance:
        self._raise_injected_fault("create_mig_instance")
        gpu, geometry = self._mig_enabled_gpu(gpu_uuid, "create a GPU instance")
        profile = geometry.profile(profile_id)
        if profile is None:
            known = ", ".join(f"{p.name} (id {p.profile_id})" for p in geometry.profiles)
            raise HardwareError(
                f"{_gpu_label(gpu)}: cannot create a GPU instance: profile id {profile_id} is not a MIG "
                f"profile of {gpu.product_name}; its profiles: {known}",
                HardwareErrorReason.INVALID_ARGUMENT,
            )
        instances = self._instances[gpu_uuid]
        existing = [(other_profile, other.placement) for other_profile, other in instances.values()]
        if rejection := mig_rejection(geometry, existing, profile, placement):
            raise HardwareError(
                f"{_gpu_label(gpu)}: cannot create a GPU instance of profile {profile.name} "
                f"(id {profile_id}) at placement {format_placement(placement)}: {rejection.detail}",
                rejection.reason,
            )
        gi_id = min(set(range(1, len(instances) + 2)) - set(instances))
        instance = new_mig_instance(gpu_uuid, gi_id, profile, placement)
        instances[gi_id] = (profile, instance)
        return instance

    async def destroy_mig_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        """NOT_SUPPORTED where MIG mode is not enabled, as nvmlDeviceGetGpuInstanceById answers."""
        self._raise_injected_fault("destroy_mig_instance")
        gpu, _ = self._mig_enabled_gpu(gpu_uuid, "destroy a GPU instance")
        instances = self._instances[gpu_uuid]
        if gpu_instance_id not in instances:
            existing = ", ".join(map(str, sorted(instances))) or "none"
            raise HardwareError(
                f"{_gpu_label(gpu)}: cannot destroy GPU instance {gpu_instance_id}: no such instance "
                f"(existing GPU instance ids: {existing})",
                HardwareErrorReason.NOT_FOUND,
            )
        del instances[gpu_instance_id]

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
                f"{_gpu_label(gpu)}: cannot {action}: the GPU is lost (fell off the bus, XID {XID_GPU_LOST})",
                HardwareErrorReason.GPU_LOST,
            )
        geometry = self._geometry[gpu_uuid]
        if geometry is None or gpu.mig_mode is not MigMode.ENABLED:
            raise HardwareError(
                f"{_gpu_label(gpu)}: cannot {action}: MIG mode is {gpu.mig_mode.value} on this GPU",
                HardwareErrorReason.NOT_SUPPORTED,
            )
        return gpu, geometry


def _gpu_label(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.uuid})"
