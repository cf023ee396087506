"""Simulated nodes: the strict decoder of node descriptions (packaged profiles and node files)
and the GPUs a description yields on a named node.

UUIDs and PCI addresses are derived from the node name and GPU index, so the same node gets the
same GPUs on every run and on every machine.
"""

import uuid
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from dra_driver.base.strict_decode import DecodeError, quoted
from dra_driver.base.typed_decode import typed
from dra_driver.base.yaml_files import YamlFileError, read_yaml_file
from dra_driver.hardware.catalog import GpuModel, MigGeometry, gpu_models, read_packaged_yaml
from dra_driver.hardware.mig_rules import format_placement, mig_rejection
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
_UUID_NAMESPACE = uuid.UUID("6b1f0c3e-5d4a-4c2b-9e8f-7a6d5c4b3a29")


# ---------------------------------------------------------------------------------------------
# Node descriptions
# ---------------------------------------------------------------------------------------------


class MigInstanceSpec(msgspec.Struct, frozen=True):
    profile: MigProfile
    placement: Placement


class GpuGroupSpec(msgspec.Struct, frozen=True):
    model: GpuModel
    count: int
    mig_mode: MigMode
    # Instances that exist on each GPU of the group when the node starts (static MIG).
    mig_instances: tuple[MigInstanceSpec, ...] = ()


class SimulatedNodeSpec(msgspec.Struct, frozen=True):
    origin: str
    groups: tuple[GpuGroupSpec, ...]
    driver_version: str = DEFAULT_DRIVER_VERSION
    cuda_driver_version: str = DEFAULT_CUDA_DRIVER_VERSION
    fabric_clique: str | None = None

    def group_of_each_gpu(self) -> tuple[GpuGroupSpec, ...]:
        """The group of GPU 0, 1, ...: groups are numbered in the order the description lists them."""
        return tuple(group for group in self.groups for _ in range(group.count))


_MIG_MODES = {"enabled": MigMode.ENABLED, "disabled": MigMode.DISABLED}
_CLIQUE_FORM = f"'<cluster UUID>.<clique id>' like '{uuid.UUID(int=1)}.0'"


_VERSION = r"\A[0-9]+(?:\.[0-9]+)*\Z"
_DriverVersion = Annotated[
    str,
    msgspec.Meta(pattern=_VERSION, description=f"a dotted version string like {DEFAULT_DRIVER_VERSION!r}"),
]
_CudaVersion = Annotated[
    str,
    msgspec.Meta(
        pattern=_VERSION, description=f"a dotted version string like {DEFAULT_CUDA_DRIVER_VERSION!r}"
    ),
]


class _InstanceFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    profile: str
    start: int


class _GroupFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    model: str
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_SIMULATED_GPUS)]
    mig_mode: Literal["enabled", "disabled"] = "disabled"
    mig_instances: Annotated[
        tuple[_InstanceFile, ...], msgspec.Meta(description="a list of {profile, start} mappings")
    ] = ()


class _NodeFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """A node file as written; what a type cannot say (models, MIG geometry) is checked after."""

    driver_version: _DriverVersion = DEFAULT_DRIVER_VERSION
    cuda_driver_version: _CudaVersion = DEFAULT_CUDA_DRIVER_VERSION
    fabric_clique: Annotated[str | None, msgspec.Meta(description=_CLIQUE_FORM)] = None
    gpus: Annotated[
        tuple[_GroupFile, ...], msgspec.Meta(min_length=1, description="a non-empty list of GPU groups")
    ]


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _fabric_clique(clique: str) -> str:
    """NVML reports a clique as '<cluster UUID>.<clique id>'; consumers split it on the last dot."""
    cluster, _, number = clique.rpartition(".")
    if not (_is_uuid(cluster) and number.isdigit()):
        raise DecodeError("fabricClique", f"expected {_CLIQUE_FORM}, got {quoted(clique)}")
    return clique


def _model(name: str, path: str) -> GpuModel:
    models = gpu_models()
    if name not in models:
        raise DecodeError(
            path, f"unknown GPU model {quoted(name)}; known models: {', '.join(sorted(models))}"
        )
    return models[name]


def _mig_mode(written: str, path: str, model: GpuModel) -> MigMode:
    mode = _MIG_MODES[written]
    if model.mig is None:
        if mode is MigMode.ENABLED:
            raise DecodeError(path, f"model {model.key} does not support MIG; only 'disabled' is allowed")
        return MigMode.UNSUPPORTED
    return mode


def _mig_instance(
    written: _InstanceFile, path: str, geometry: MigGeometry, accepted: Sequence[MigInstanceSpec]
) -> MigInstanceSpec:
    profile = geometry.profile_named(written.profile)
    if profile is None:
        known = ", ".join(p.name for p in geometry.profiles)
        raise DecodeError(
            f"{path}.profile",
            f"unknown MIG profile {quoted(written.profile)}; this model's profiles: {known}",
        )
    placement = next((p for p in profile.placements if p.start == written.start), None)
    if placement is None:
        starts = ", ".join(str(p.start) for p in profile.placements)
        raise DecodeError(
            f"{path}.start",
            f"{quoted(written.start)} is not a placement start of {profile.name}; allowed: {starts}",
        )
    if rejection := mig_rejection(geometry, [(s.profile, s.placement) for s in accepted], profile, placement):
        raise DecodeError(
            path, f"{profile.name} at placement {format_placement(placement)}: {rejection.detail}"
        )
    return MigInstanceSpec(profile, placement)


def _mig_instances(
    written: Sequence[_InstanceFile], path: str, model: GpuModel, mode: MigMode
) -> tuple[MigInstanceSpec, ...]:
    if not written:
        return ()
    if model.mig is None or mode is not MigMode.ENABLED:
        raise DecodeError(path, "pre-existing MIG instances need migMode: enabled")
    accepted: list[MigInstanceSpec] = []
    for position, instance in enumerate(written):
        accepted.append(_mig_instance(instance, f"{path}[{position}]", model.mig, accepted))
    return tuple(accepted)


def _group(written: _GroupFile, path: str) -> GpuGroupSpec:
    model = _model(written.model, f"{path}.model")
    mode = _mig_mode(written.mig_mode, f"{path}.migMode", model)
    return GpuGroupSpec(
        model=model,
        count=written.count,
        mig_mode=mode,
        mig_instances=_mig_instances(written.mig_instances, f"{path}.migInstances", model, mode),
    )


def _node(raw: object, origin: str) -> SimulatedNodeSpec:
    node = typed(raw, _NodeFile)
    groups = tuple(_group(group, f"gpus[{position}]") for position, group in enumerate(node.gpus))
    if (total := sum(group.count for group in groups)) > MAX_SIMULATED_GPUS:
        raise DecodeError("gpus", f"{total} GPUs in all; a simulated node has at most {MAX_SIMULATED_GPUS}")
    return SimulatedNodeSpec(
        origin=origin,
        groups=groups,
        driver_version=node.driver_version,
        cuda_driver_version=node.cuda_driver_version,
        fabric_clique=None if node.fabric_clique is None else _fabric_clique(node.fabric_clique),
    )


def parse_node_spec(raw: object, origin: str) -> SimulatedNodeSpec:
    """Strictly decodes a node description; every error names the origin, the field path and what
    was allowed, because a typo in a node file should not quietly become a different node."""
    try:
        return _node(raw, origin)
    except DecodeError as error:
        where = f"field {error.path}" if error.path else "top level"
        raise HardwareError(
            f"simulated node {origin}: {where}: {error.problem}", HardwareErrorReason.INVALID_ARGUMENT
        ) from None


@cache
def node_profiles() -> Mapping[str, SimulatedNodeSpec]:
    """The named nodes of node-profiles.yaml, decoded all at once so that a broken profile fails
    every use (and the tests) rather than only the run that picks it."""
    raw = read_packaged_yaml("node-profiles.yaml")
    return {name: parse_node_spec(description, f"profile {name}") for name, description in raw.items()}


def names_a_file(source: str) -> bool:
    """Whether a simulated node `source` is a path (anything with '/' or a .yaml/.yml suffix)
    rather than a profile name."""
    return "/" in source or source.endswith((".yaml", ".yml"))


def resolve_node_spec(source: str) -> SimulatedNodeSpec:
    """`source` is a profile name, or a path (see names_a_file)."""
    if names_a_file(source):
        try:
            raw = read_yaml_file(Path(source))
        except YamlFileError as error:
            raise HardwareError(f"simulated node file {source}: {error}") from error
        return parse_node_spec(raw, f"file {source}")
    profiles = node_profiles()
    if source not in profiles:
        raise HardwareError(
            f"unknown simulated node profile {quoted(source)}; known profiles: {', '.join(sorted(profiles))}",
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
        iommu_group=bus,
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
