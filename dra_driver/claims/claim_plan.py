"""What preparing one claim takes, decided before anything is touched (pure).

Each allocation result of ours becomes a PlannedDevice: the device and GPU behind it, the opaque
config in force for its request, the MIG instance to create (dynamic MIG), the existing one to
use (static MIG), and the key that makes it exclusive. Every reason to refuse the claim is found
here, so side effects only start for claims that can be prepared.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from dra_driver.claims.allocation import AllocatedDevice, ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.opaque_config import ConfigEntry, DeviceConfig, effective_config
from dra_driver.claims.records import MigInstanceRecord
from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import Device
from dra_driver.hardware.model import Gpu, MigInstance


@dataclass(frozen=True, slots=True)
class PlannedDevice:
    result: AllocatedDevice
    device: Device
    gpu: Gpu
    config: DeviceConfig
    # Dynamic MIG without admin access: the instance prepare creates.
    create_mig: MigInstanceRecord | None = None
    # Static MIG: the instance that already exists.
    existing_mig: MigInstance | None = None

    @property
    def name(self) -> str:
        return self.result.device

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


def _mig_to_create(device: Device, gpu: Gpu, inventory: Inventory) -> MigInstanceRecord | None:
    if "uuid" in device.attributes:
        return None  # static MIG: the instance exists
    plan = next((plan for plan in inventory.plans if plan.gpu.uuid == gpu.uuid), None)
    if plan is None or plan.mode != "mig-dynamic":
        return None
    profile_id, start, size = (
        device.attributes.get(key) for key in ("profileId", "placementStart", "placementSize")
    )
    if not (isinstance(profile_id, int) and isinstance(start, int) and isinstance(size, int)):
        raise ClaimRejected(
            f"device {device.name} lacks its MIG profile or placement; the inventory is wrong"
        )
    return MigInstanceRecord(gpu.uuid, profile_id, start, size)


def _existing_mig(device: Device, gpu: Gpu) -> MigInstance | None:
    uuid = device.attributes.get("uuid")
    if device.type != "mig" or not isinstance(uuid, str):
        return None
    return next((instance for instance in gpu.mig_instances if instance.uuid == uuid), None)


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
        gpu = inventory.gpu_of_device[result.device]
        config = effective_config(entries, driver_name, result.request, device.type)
        create = None if result.admin_access else _mig_to_create(device, gpu, inventory)
        existing = _existing_mig(device, gpu)
        if device.type == "mig" and create is None and existing is None and not result.admin_access:
            raise ClaimRejected(f"{where}: MIG device {device.name} has no instance on {gpu.label}")
        planned.append(PlannedDevice(result, device, gpu, config, create, existing))
    names = [device.cdi_name for device in planned]
    if len(set(names)) != len(names):
        raise ClaimRejected(f"claim {ref}: a device is allocated twice to the same claim")
    return tuple(planned)
