"""What preparing one claim takes, decided before anything is touched (pure).

Each allocation result of ours becomes a PlannedDevice: the device and what it stands for (its
origin in the inventory), the opaque config in force for its request, the MIG instance to create
(dynamic MIG), the existing one to use (static MIG), what a vGPU share grants, and the key that
makes it exclusive. Every reason to refuse the claim is found here, so side effects only start
for claims that can be prepared. Nothing here reads the published attributes: they belong to users.
"""

from collections.abc import Sequence

import msgspec

from dra_driver.claims.claim_object import AllocatedDevice
from dra_driver.claims.effect_entries import MigInstanceEntry
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.opaque_config import ConfigEntry, DeviceConfig, VgpuConfig, effective_config
from dra_driver.claims.vgpu_grant import VgpuGrant, check_claim_grants, vgpu_grant
from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import Device
from dra_driver.devices.node_config import Enforcement
from dra_driver.devices.origins import DeviceOrigin, DynamicMig, StaticMig
from dra_driver.hardware.model import Gpu, MigInstance


class PlannedDevice(msgspec.Struct, frozen=True):
    result: AllocatedDevice
    device: Device
    origin: DeviceOrigin
    config: DeviceConfig
    # Dynamic MIG without admin access: the instance prepare creates.
    create_mig: MigInstanceEntry | None = None
    # Static MIG: the instance that already exists.
    existing_mig: MigInstance | None = None
    # A vGPU share without admin access: what it grants (its HAMi-core limits; what the record,
    # the status and the metadata files report).
    grant: VgpuGrant | None = None

    @property
    def name(self) -> str:
        return self.result.device

    @property
    def gpu(self) -> Gpu:
        return self.origin.gpu

    @property
    def exclusive_key(self) -> str | None:
        """What two claims may not hold at once: the device, or for a device that allows multiple
        allocations, one share of it. Admin access is never exclusive (KEP-5018)."""
        if self.result.admin_access:
            return None
        if self.device.allow_multiple_allocations:
            return f"{self.name}/{self.result.share_id}" if self.result.share_id else None
        return self.name

    @property
    def cdi_name(self) -> str:
        """Unique within the claim: two shares of one shareable device are two CDI devices."""
        return f"{self.name}-{self.result.share_id}" if self.result.share_id else self.name


def _mig_to_create(origin: DeviceOrigin, admin_access: bool) -> MigInstanceEntry | None:
    """Admin access only watches the GPU (KEP-5018), so it never creates an instance."""
    if admin_access or not isinstance(origin, DynamicMig):
        return None
    return MigInstanceEntry(
        origin.gpu.uuid, origin.profile.profile_id, origin.placement.start, origin.placement.size
    )


def plan_claim(
    ref: ClaimRef,
    allocated: Sequence[AllocatedDevice],
    entries: Sequence[ConfigEntry],
    inventory: Inventory,
    driver_name: str,
    pool_name: str,
) -> tuple[PlannedDevice, ...]:
    planned = []
    for result in allocated:
        where = f"claim {ref}: {result.path}"
        if result.pool != pool_name:
            raise ClaimRejected(
                f"{where}: device {result.device} was allocated from pool {result.pool!r}, "
                f"but this node serves pool {pool_name!r}"
            )
        device = inventory.device_by_name.get(result.device)
        if device is None:
            raise ClaimRejected(f"{where}: device {result.device!r} does not exist on this node")
        if device.allow_multiple_allocations and not result.share_id and not result.admin_access:
            raise ClaimRejected(
                f"{where}.shareID is missing: device {device.name} allows multiple allocations, so "
                "each allocation must name its share"
            )
        origin = inventory.origin_of_device[result.device]
        config = effective_config(entries, driver_name, result.request, origin.device_type)
        create = _mig_to_create(origin, result.admin_access)
        existing = origin.instance if isinstance(origin, StaticMig) else None
        grant = _grant(result, device, origin, config, inventory)
        planned.append(PlannedDevice(result, device, origin, config, create, existing, grant))
    names = [device.cdi_name for device in planned]
    if len(set(names)) != len(names):
        raise ClaimRejected(f"claim {ref}: a device is allocated twice to the same claim")
    if grants := [device.grant for device in planned if device.grant]:
        others = [device.name for device in planned if not device.grant and not device.result.admin_access]
        check_claim_grants(grants, others)
    return tuple(planned)


def _grant(
    result: AllocatedDevice, device: Device, origin: DeviceOrigin, config: DeviceConfig, inventory: Inventory
) -> VgpuGrant | None:
    """Admin access only watches the GPU (KEP-5018): it is granted no share."""
    if device.type != "vgpu" or result.admin_access:
        return None
    enforcement: Enforcement = next(
        (plan.settings.enforcement for plan in inventory.plans if plan.gpu.uuid == origin.gpu.uuid), "mps"
    )
    vgpu_config = config if isinstance(config, VgpuConfig) else VgpuConfig()
    return vgpu_grant(result, device, origin.gpu, vgpu_config, enforcement)
