"""Device taints (KEP-5055) for unhealthy GPUs: the inventory as the slices should publish it.

A pure function of the untainted inventory and the health state, so a recovered GPU's devices go
back to exactly what the hardware gave (NVIDIA's driver never removes its taints; we must).

Each device of a faulty GPU gets one taint per XID that counted, `<driver>/xid=<n>` with the
effect of the XID's class, worst first, so that a claim can tolerate one XID without tolerating
every fault, and a lost GPU gets `<driver>/gpu-lost=true` NoExecute ahead of them. The API caps
the taints of a device (`devices.slices.MAX_TAINTS_PER_DEVICE`: 16 since Kubernetes 1.35, 4 in
1.34; the slice plan enforces it too); beyond that the least severe are left out, so the worst
effect always stands (a claim that tolerates every taint shown may then land on a GPU whose
lesser XIDs it does not tolerate: a GPU with that many faults is rare, and its worst
taint decides anyway).
"""

from msgspec.structs import replace

from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import Device, Taint
from dra_driver.devices.slices import MAX_TAINTS_PER_DEVICE, SliceLayout
from dra_driver.health.tracker import GpuCondition, HealthState
from dra_driver.health.xid import taint_effect
from dra_driver.kube.k8s_names import driver_name_problem


def xid_taint_key(driver_name: str) -> str:
    """A label name: the driver name is a DNS subdomain of at most 63 characters, a valid prefix."""
    return f"{driver_name}/xid"


def lost_taint_key(driver_name: str) -> str:
    return f"{driver_name}/gpu-lost"


def _gpu_taints(condition: GpuCondition, driver_name: str, layout: SliceLayout) -> tuple[Taint, ...]:
    taints = []
    if condition.lost_at is not None:
        taints.append(Taint(lost_taint_key(driver_name), "true", "NoExecute"))
    for fault in condition.faults:
        if effect := taint_effect(fault.xid_class, layout):
            taints.append(Taint(xid_taint_key(driver_name), str(fault.xid), effect))
    return tuple(taints)


def _tainted(device: Device, taints: tuple[Taint, ...], layout: SliceLayout) -> Device:
    """The device with `taints` after those it already has, within the API's limit."""
    if not taints:
        return device
    room = max(0, MAX_TAINTS_PER_DEVICE[layout] - len(device.taints))
    return replace(device, taints=device.taints + taints[:room])


def tainted_inventory(
    inventory: Inventory, state: HealthState, driver_name: str, layout: SliceLayout
) -> Inventory:
    """`inventory` with the taints of its GPUs' faults on their devices; the same object when no
    device needs one. Pass the untainted inventory each time, so that recovered GPUs lose theirs."""
    if problem := driver_name_problem(driver_name):
        raise ValueError(f"driver name {problem}")
    of_gpu: dict[str, tuple[Taint, ...]] = {}
    devices = []
    for device in inventory.devices:
        gpu_uuid = inventory.gpu_of_device[device.name].uuid
        if gpu_uuid not in of_gpu:
            of_gpu[gpu_uuid] = _gpu_taints(state.condition(gpu_uuid), driver_name, layout)
        devices.append(_tainted(device, of_gpu[gpu_uuid], layout))
    if not any(of_gpu.values()):
        return inventory
    return replace(
        inventory, devices=tuple(devices), device_by_name={device.name: device for device in devices}
    )
