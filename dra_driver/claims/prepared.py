"""What a prepared claim's containers get, and what its record says.

Both follow from the plan and the side effects already applied, and change nothing themselves:
the container edits of a device come from the backend's `DeviceEdits` (which, for a real MIG
device, reads the capability files of its instance), the record is built from the CDI spec.
"""

from collections.abc import Mapping, Sequence

from dra_driver.claims.cdi import CdiSpec, ContainerEdits
from dra_driver.claims.claim_plan import PlannedDevice
from dra_driver.claims.gpu_edits import DeviceEdits
from dra_driver.claims.opaque_config import VgpuConfig
from dra_driver.claims.records import ClaimRecord, MigInstanceRecord, PreparedDevice
from dra_driver.claims.sharing import SharingPlan
from dra_driver.claims.vgpu_edits import vgpu_share
from dra_driver.hardware.model import MigInstance

# The MIG instances the prepare created, by what its record says of each.
CreatedMig = Mapping[MigInstanceRecord, MigInstance]

# The claim-wide CDI device that connects every container of a claim to its MPS daemon.
MPS_CDI_DEVICE = "mps"


def claim_cdi_devices(
    edits: DeviceEdits,
    planned: tuple[PlannedDevice, ...],
    created: CreatedMig,
    vgpu: ContainerEdits,
    sharing: SharingPlan,
) -> list[tuple[str, ContainerEdits]]:
    """The claim's CDI devices: one per planned device, in the plan's order, then the claim-wide
    ones (MPS) that every device of the claim needs; `prepared_record` relies on that order."""
    devices = [(device.cdi_name, _device_edits(edits, device, created, vgpu)) for device in planned]
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
    shared = device.device.type == "vgpu" and not device.result.admin_access
    return gpu_edits.plus(vgpu) if shared else gpu_edits


def prepared_record(
    preparing: ClaimRecord,
    planned: tuple[PlannedDevice, ...],
    spec: CdiSpec,
    common_cdi_ids: Sequence[str],
) -> ClaimRecord:
    """The "prepared" record that replaces `preparing` (which names the claim's side effects)."""
    claim_wide = tuple(spec.qualified_name(extra) for extra in spec.devices[len(planned) :])
    return ClaimRecord(
        claim=preparing.claim,
        devices=tuple(
            PreparedDevice(
                request_names=(device.result.main_request,),
                pool=device.result.pool,
                device=device.result.device,
                cdi_device_ids=(spec.qualified_name(cdi_device), *claim_wide, *common_cdi_ids),
                exclusive_key=device.exclusive_key,
                share_id=device.result.share_id,
                **_vgpu_limits(device),
            )
            for device, cdi_device in zip(planned, spec.devices[: len(planned)], strict=True)
        ),
        mig_instances=preparing.mig_instances,
        time_sliced_gpus=preparing.time_sliced_gpus,
        mps=preparing.mps,
        compute_modes=preparing.compute_modes,
    )


def _vgpu_limits(device: PlannedDevice) -> dict[str, int]:
    """A vGPU share's grant, recomputed as `vgpu_edits` computed it (the result was checked there),
    for the usage metrics to compare use against; nothing for other devices."""
    if device.device.type != "vgpu" or device.result.admin_access:
        return {}
    share = vgpu_share(
        {"consumedCapacity": dict(device.result.consumed_capacity), "shareID": device.result.share_id},
        device.result.position,
        device.device,
        device.gpu,
        device.config if isinstance(device.config, VgpuConfig) else VgpuConfig(),
    )
    return {"memory_limit_bytes": share.memory_bytes, "cores_limit": share.cores}
