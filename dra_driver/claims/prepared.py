"""What a prepared claim's containers get, and what its record says.

All follow from the plan and the side effects already applied, and change nothing themselves:
the container edits of a device come from the backend's `DeviceEdits` (which, for a real MIG
device, reads the capability files of its instance), the devices' metadata files (KEP-5304) from
their published attributes and what prepare made of them, the record from the CDI spec.
"""

from collections.abc import Mapping, Sequence

from dra_driver.claims.claim_plan import PlannedDevice
from dra_driver.claims.edits.cdi import CdiSpec, ContainerEdits
from dra_driver.claims.edits.gpu_edits import DeviceEdits
from dra_driver.claims.effect_entries import EffectEntry
from dra_driver.claims.records import ClaimRecord, DeviceFacts, PreparedDevice
from dra_driver.claims.sharing.sharing import SharingPlan
from dra_driver.claims.status.device_metadata import MetadataDevice
from dra_driver.devices.model import AttributeValue
from dra_driver.devices.origins import DynamicMig, StaticMig
from dra_driver.hardware.model import MigInstance

# The MIG instances the prepare created, by what its record says of each (effects.contract.Made).
CreatedMig = Mapping[EffectEntry, MigInstance]

# The claim-wide CDI device that connects every container of a claim to its MPS daemon.
MPS_CDI_DEVICE = "mps"


def claim_cdi_devices(
    edits: DeviceEdits,
    planned: tuple[PlannedDevice, ...],
    created: CreatedMig,
    vgpu: ContainerEdits,
    sharing: SharingPlan,
    metadata: Sequence[tuple[str, ContainerEdits]] = (),
    handed_over: Mapping[str, ContainerEdits] | None = None,
) -> list[tuple[str, ContainerEdits]]:
    """The claim's CDI devices: one per planned device, in the plan's order, then the metadata
    mount of each request (`metadata`, in request order), then the claim-wide ones (MPS) that
    every device of the claim needs; `prepared_record` relies on that order. `handed_over`: by
    CDI name, the edits of the devices a side effect hands over itself (side_effects.device_edits:
    a GPU given to a VM), in place of the backend's."""
    handed = handed_over or {}
    devices = []
    for device in planned:
        own = handed.get(device.cdi_name)
        devices.append(
            (device.cdi_name, own if own is not None else _device_edits(edits, device, created, vgpu))
        )
    devices.extend(metadata)
    if sharing.mps:
        devices.append((MPS_CDI_DEVICE, sharing.container_edits))
    return devices


def _device_edits(
    edits: DeviceEdits, device: PlannedDevice, created: CreatedMig, vgpu: ContainerEdits
) -> ContainerEdits:
    instance = created[device.create_mig] if device.create_mig else device.existing_mig
    if device.device.type == "mig" and device.result.admin_access:
        return edits.mig_monitor(device.name, device.gpu)
    if device.device.type == "mig" and instance is not None:
        return edits.mig(device.name, device.gpu, instance)
    gpu_edits = edits.gpu(device.name, device.gpu)
    return gpu_edits.plus(vgpu) if device.grant else gpu_edits


def prepared_record(
    preparing: ClaimRecord,
    planned: tuple[PlannedDevice, ...],
    created: CreatedMig,
    spec: CdiSpec,
    common_cdi_ids: Sequence[str],
    metadata_requests: Sequence[str] = (),
    generation: int | None = None,
) -> ClaimRecord:
    """The "prepared" record that replaces `preparing` (which names the claim's side effects),
    with what the claim's status reports of each device (`DeviceFacts`) and the claim's
    `generation` as prepare read it, so that the status can be written again from the record.

    `metadata_requests`: the requests whose metadata mounts follow the planned devices in `spec`.
    Each mount's ID goes to the first device of its request only, as upstream's helper does: a
    container of the request gets it once, however many devices the request has."""
    own = spec.devices[: len(planned)]
    mounts = spec.devices[len(planned) : len(planned) + len(metadata_requests)]
    claim_wide = tuple(spec.qualified_name(extra) for extra in spec.devices[len(own) + len(mounts) :])
    # Request -> its mount's ID, until the request's first device has taken it.
    unmounted = dict(zip(metadata_requests, (spec.qualified_name(mount) for mount in mounts), strict=True))
    devices = []
    for device, cdi_device in zip(planned, own, strict=True):
        mount = unmounted.pop(device.result.main_request, None)
        devices.append(
            PreparedDevice(
                request_names=(device.result.main_request,),
                pool=device.result.pool,
                device=device.result.device,
                cdi_device_ids=(
                    spec.qualified_name(cdi_device),
                    *((mount,) if mount else ()),
                    *claim_wide,
                    *common_cdi_ids,
                ),
                exclusive_key=device.exclusive_key,
                share_id=device.result.share_id,
                **_record_limits(device),
                facts=_device_facts(device, created),
            )
        )
    return ClaimRecord(
        claim=preparing.claim,
        devices=tuple(devices),
        effects=preparing.effects,
        generation=generation,
    )


def _device_facts(device: PlannedDevice, created: CreatedMig) -> DeviceFacts:
    origin = device.origin
    instance = created.get(device.create_mig) if device.create_mig else device.existing_mig
    return DeviceFacts(
        type=device.device.type,
        gpu_uuid=device.gpu.uuid,
        gpu_index=device.gpu.index,
        mig_profile=origin.profile.name if isinstance(origin, DynamicMig | StaticMig) else None,
        mig_device_uuid=None if instance is None else instance.uuid,
        admin_access=device.result.admin_access,
    )


def _record_limits(device: PlannedDevice) -> dict[str, int]:
    grant = device.grant
    return {} if grant is None else {"memory_limit_bytes": grant.memory_bytes, "cores_limit": grant.cores}


def metadata_devices(planned: tuple[PlannedDevice, ...], created: CreatedMig) -> list[MetadataDevice]:
    """What each device's metadata file says of it: its published attributes, and what only
    prepare knows (the UUID of a MIG device it created; a vGPU share's limits and share ID)."""
    return [
        MetadataDevice(
            request=device.result.request,
            pool=device.result.pool,
            name=device.result.device,
            attributes=device.device.attributes,
            facts=_prepared_attributes(device, created),
        )
        for device in planned
    ]


def _prepared_attributes(device: PlannedDevice, created: CreatedMig) -> dict[str, AttributeValue]:
    facts: dict[str, AttributeValue] = {}
    if device.create_mig:
        facts["uuid"] = created[device.create_mig].uuid
    if device.result.share_id:
        facts["shareID"] = device.result.share_id
    if (grant := device.grant) is not None:
        facts["memoryLimit"] = grant.memory_bytes
        facts["coresLimit"] = grant.cores
    return facts
