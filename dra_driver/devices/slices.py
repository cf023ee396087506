"""The slice plan: how the node's inventory is cut into ResourceSlices, within the API's limits.

The API server rejects a slice that breaks a limit, and the ResourceSlice controller never
re-splits what it is given, so the plan has to be right for the cluster's version here:
- Kubernetes >= 1.35: a slice carries devices or counter sets, never both; counter sets may be
  referenced from any slice of the pool; <= 8 sets per slice; <= 64 devices per slice once any
  of them consumes counters or has taints, else <= 128; <= 2 counter consumptions per device.
- Kubernetes 1.34: devices consume counter sets of their own slice, <= 32 counters per slice in
  all, <= 1024 consumed counters per slice; so each GPU with counters gets a slice of its own.
- Taints per device: <= 16 since 1.35, <= 4 in 1.34. Whoever added the taints, the plan keeps
  the first ones (the worst, as `health.taints` orders them), so no path can send a server more
  than it stores.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec
from msgspec.structs import replace

from dra_driver.base.errors import TransientFault
from dra_driver.devices.attributes import PARTITION_TYPE
from dra_driver.devices.inventory import Inventory
from dra_driver.devices.model import CounterSet, Device, counter_set_to_api, device_to_api

SliceLayout = Literal["1.34", "1.35"]

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2
V134_MAX_COUNTERS_PER_SLICE = 32
V134_MAX_CONSUMED_COUNTERS_PER_DEVICE = 32
V134_MAX_CONSUMED_COUNTERS_PER_SLICE = 1024
MAX_TAINTS_PER_DEVICE: Mapping[SliceLayout, int] = {"1.34": 4, "1.35": 16}


class SlicePlanError(TransientFault, ValueError):
    """The inventory cannot be published within the API's limits for this layout."""


class PlannedSlice(msgspec.Struct, frozen=True):
    devices: tuple[Device, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()


def layout_for(kubernetes_version: tuple[int, int]) -> SliceLayout:
    return "1.34" if kubernetes_version < (1, 35) else "1.35"


def _needs_small_slice(device: Device) -> bool:
    return bool(device.consumes_counters or device.taints)


def _consumed_counters(device: Device) -> int:
    return sum(len(consumption.counters) for consumption in device.consumes_counters)


def _check_device(device: Device, layout: SliceLayout) -> None:
    entries = len(device.attributes) + len(device.capacity)
    if entries > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise SlicePlanError(
            f"device {device.name}: {entries} attributes and capacities; "
            f"at most {MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    if layout == "1.35" and len(device.consumes_counters) > MAX_CONSUMPTIONS_PER_DEVICE:
        raise SlicePlanError(
            f"device {device.name}: consumes from {len(device.consumes_counters)} counter sets; "
            f"at most {MAX_CONSUMPTIONS_PER_DEVICE}"
        )
    if layout == "1.34" and _consumed_counters(device) > V134_MAX_CONSUMED_COUNTERS_PER_DEVICE:
        raise SlicePlanError(
            f"device {device.name}: consumes {_consumed_counters(device)} counters; "
            f"Kubernetes 1.34 allows at most {V134_MAX_CONSUMED_COUNTERS_PER_DEVICE}"
        )


def _check_counter_set(counter_set: CounterSet) -> None:
    if len(counter_set.counters) > MAX_COUNTERS_PER_SET:
        raise SlicePlanError(
            f"counter set {counter_set.name}: {len(counter_set.counters)} counters; "
            f"at most {MAX_COUNTERS_PER_SET}"
        )


def _device_chunks(devices: Iterable[Device]) -> list[tuple[Device, ...]]:
    """Consecutive runs of devices, each as long as the slice limit for its content allows."""
    chunks: list[tuple[Device, ...]] = []
    current: list[Device] = []
    small = False
    for device in devices:
        would_be_small = small or _needs_small_slice(device)
        limit = MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS if would_be_small else MAX_DEVICES_PER_SLICE
        if len(current) + 1 > limit:
            chunks.append(tuple(current))
            current, would_be_small = [], _needs_small_slice(device)
        current.append(device)
        small = would_be_small
    if current:
        chunks.append(tuple(current))
    return chunks


def _plan_separate_counters(inventory: Inventory) -> list[PlannedSlice]:
    slices = [PlannedSlice(devices=chunk) for chunk in _device_chunks(inventory.devices)]
    sets = inventory.counter_sets
    slices += [
        PlannedSlice(counter_sets=sets[start : start + MAX_COUNTER_SETS_PER_SLICE])
        for start in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    return slices


def _plan_v134(inventory: Inventory) -> list[PlannedSlice]:
    consumers: dict[str, list[Device]] = {counter_set.name: [] for counter_set in inventory.counter_sets}
    plain: list[Device] = []
    for device in inventory.devices:
        names = {consumption.counter_set for consumption in device.consumes_counters}
        if len(names) > 1:
            raise SlicePlanError(
                f"device {device.name}: consumes from several counter sets; Kubernetes 1.34 needs them in "
                "one slice"
            )
        (consumers[names.pop()] if names else plain).append(device)
    slices = []
    for counter_set in inventory.counter_sets:
        devices = tuple(consumers[counter_set.name])
        consumed = sum(map(_consumed_counters, devices))
        if (
            len(counter_set.counters) > V134_MAX_COUNTERS_PER_SLICE
            or consumed > V134_MAX_CONSUMED_COUNTERS_PER_SLICE
            or len(devices) > MAX_DEVICES_PER_SLICE_WITH_COUNTERS_OR_TAINTS
        ):
            raise SlicePlanError(
                f"counter set {counter_set.name}: {len(devices)} devices consuming {consumed} counters "
                "do not fit one Kubernetes 1.34 slice; offer fewer partitions or use the >= 1.35 layout"
            )
        slices.append(PlannedSlice(devices=devices, counter_sets=(counter_set,)))
    return [PlannedSlice(devices=chunk) for chunk in _device_chunks(plain)] + slices


def _within_taint_limit(device: Device, layout: SliceLayout) -> Device:
    limit = MAX_TAINTS_PER_DEVICE[layout]
    return device if len(device.taints) <= limit else replace(device, taints=device.taints[:limit])


def plan_slices(inventory: Inventory, layout: SliceLayout) -> tuple[PlannedSlice, ...]:
    """Devices in name order, cut into slices; always at least one (possibly empty) slice, so the
    pool exists even on a node that offers nothing."""
    for device in inventory.devices:
        _check_device(device, layout)
    for counter_set in inventory.counter_sets:
        _check_counter_set(counter_set)
    if any(len(device.taints) > MAX_TAINTS_PER_DEVICE[layout] for device in inventory.devices):
        devices = tuple(_within_taint_limit(device, layout) for device in inventory.devices)
        inventory = replace(inventory, devices=devices, device_by_name={d.name: d for d in devices})
    slices = _plan_separate_counters(inventory) if layout == "1.35" else _plan_v134(inventory)
    return tuple(slices) or (PlannedSlice(),)


def slice_name_prefix(index: int, count: int, driver_name: str, node_name: str) -> str:
    """generateName as the upstream controller uses it: the hex index first, so names sort in plan
    order (the scheduler tries slices in name order)."""
    width = max(5, len(f"{count - 1:x}"))
    return f"{index:0{width}x}-{driver_name}-{node_name}-"


def declares_partition_type(planned: PlannedSlice) -> bool:
    """Whether the slice may name the partition-type attribute: the API server refuses the field
    on a slice without counter-consuming devices, or with one that lacks the attribute as a
    string. A slice that names none (dynamic MIG) leaves its devices out of the per-type summary;
    the rest of the pool is still summarised."""
    consumers = [device for device in planned.devices if device.consumes_counters]
    return bool(consumers) and all(isinstance(d.attributes.get(PARTITION_TYPE), str) for d in consumers)


def slice_to_api(
    planned: PlannedSlice,
    index: int,
    count: int,
    driver_name: str,
    node_name: str,
    generation: int,
    partition_types: bool = False,
) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceSlice as a plain dict (owner reference added by the publisher).

    `partition_types`: name the partition-type attribute where the slice allows it; only for a
    server that keeps the field (Kubernetes >= 1.37 with DRAPartitionableDevicesType on), as
    older schemas refuse it."""
    spec: dict[str, Any] = {
        "driver": driver_name,
        "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count},
        "nodeName": node_name,
    }
    if planned.devices or not planned.counter_sets:
        spec["devices"] = [device_to_api(device) for device in planned.devices]
    if planned.counter_sets:
        spec["sharedCounters"] = [counter_set_to_api(counter_set) for counter_set in planned.counter_sets]
    if partition_types and declares_partition_type(planned):
        spec["partitionTypeAttribute"] = f"{driver_name}/{PARTITION_TYPE}"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": slice_name_prefix(index, count, driver_name, node_name)},
        "spec": spec,
    }


def slices_to_api(
    plan: Sequence[PlannedSlice],
    driver_name: str,
    node_name: str,
    generation: int = 1,
    partition_types: bool = False,
) -> list[dict[str, Any]]:
    return [
        slice_to_api(planned, index, len(plan), driver_name, node_name, generation, partition_types)
        for index, planned in enumerate(plan)
    ]
