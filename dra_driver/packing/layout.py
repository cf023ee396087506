"""Where things sit on each GPU of a pool: the picture `plan` draws and `inspect -o layout` prints.

Built from the published devices alone (their attributes, capacities and counter sets), not from
the hardware snapshot, so the same code describes a node rendered from a profile and a live
node's ResourceSlices read from the API server. The facts a slice does not carry (a MIG GPU's
memory slices when no counter set lists them) come from the GPU catalog by product name.
"""

import re
from collections.abc import Iterable, Mapping

import msgspec

from dra_driver.devices import attributes as names
from dra_driver.devices.model import Device
from dra_driver.devices.modes.registry import layout_kind_of
from dra_driver.hardware.catalog import GpuModel, gpu_models
from dra_driver.packing.allocator import Pool

# How a GPU is drawn: one of registry.layout_kinds(), each mode naming its own (devices.modes).
LayoutKind = str
MEMORY_SLICE = re.compile(r"memory-slice-([0-9]+)")
_COMPUTE = re.compile(r"([0-9]+)g\.")


class Occupant(msgspec.Struct, frozen=True):
    """One allocation on one device: `label` says whose (a pod shape, or a claim)."""

    device: str
    label: str
    # What it holds of the GPU: bytes of memory and percent of the cores.
    memory_bytes: int
    cores: int


class MigBlock(msgspec.Struct, frozen=True):
    """A MIG placement: memory slices [start, start + size) and `compute` compute slices."""

    device: str
    profile: str
    start: int
    size: int
    compute: int
    # None: offered (a static instance) and free.
    occupant: Occupant | None


class GpuLayout(msgspec.Struct, frozen=True):
    index: int
    uuid: str
    product: str
    kind: LayoutKind
    memory_bytes: int
    # MIG geometry (0 when the GPU is not in MIG mode).
    memory_slices: int
    compute_slices: int
    # MIG: allocated placements (dynamic MIG) or every instance (static MIG), by start.
    blocks: tuple[MigBlock, ...]
    # Everything else that is allocated: the whole GPU, vGPU shares and partitions.
    occupants: tuple[Occupant, ...]

    @property
    def used_bytes(self) -> int:
        if self.kind == "mig":
            slices = sum(block.size for block in self.blocks if block.occupant is not None)
            return self.slice_bytes * slices
        return min(self.memory_bytes, sum(occupant.memory_bytes for occupant in self.occupants))

    @property
    def slice_bytes(self) -> int:
        return self.memory_bytes // self.memory_slices if self.memory_slices else 0

    @property
    def free_bytes(self) -> int:
        return self.memory_bytes - self.used_bytes


def device_gpu_uuid(device: Device) -> str:
    """The GPU a device lives on: its own UUID, or its parent's for a MIG slice or a partition."""
    value = device.attributes.get(names.PARENT_UUID, device.attributes.get(names.UUID, ""))
    return value if isinstance(value, str) else ""


def _int(device: Device, name: str, default: int = 0) -> int:
    value = device.attributes.get(name, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _catalog_model(product: str) -> GpuModel | None:
    return next((model for model in gpu_models().values() if model.product_name == product), None)


def compute_slices_of(profile: str) -> int:
    """The compute slices a profile name states (`3g.40gb` -> 3)."""
    match = _COMPUTE.match(profile)
    return int(match[1]) if match else 1


def device_memory(device: Device) -> int:
    capacity = device.capacity.get("memory")
    return capacity.value if capacity is not None else 0


def _gpu_memory(devices: Iterable[Device], pool: Pool, model: GpuModel | None) -> int:
    for device in devices:
        if device.attributes.get(names.TYPE) in ("gpu", "vgpu") and names.UUID in device.attributes:
            return device_memory(device)
        for consumption in device.consumes_counters:
            counters = pool.counter_sets.get(consumption.counter_set, {})
            if "memory" in counters:
                return counters["memory"]
    return model.memory_bytes if model is not None else 0


def _memory_slices(devices: Iterable[Device], pool: Pool, model: GpuModel | None) -> int:
    for device in devices:
        for consumption in device.consumes_counters:
            counters = pool.counter_sets.get(consumption.counter_set, {})
            found = sum(1 for counter in counters if MEMORY_SLICE.fullmatch(counter))
            if found:
                return found
    if model is not None and model.mig is not None:
        return model.mig.memory_slices
    ends = [_int(d, names.PLACEMENT_START) + _int(d, names.PLACEMENT_SIZE) for d in devices]
    return max(ends, default=0)


def gpu_layouts(pool: Pool, occupants: Iterable[Occupant]) -> tuple[GpuLayout, ...]:
    """One layout per GPU of the pool, in GPU index order, with `occupants` placed on them."""
    by_device: dict[str, list[Occupant]] = {}
    for occupant in occupants:
        by_device.setdefault(occupant.device, []).append(occupant)
    by_gpu: dict[str, list[Device]] = {}
    for device in pool.devices:
        by_gpu.setdefault(device_gpu_uuid(device), []).append(device)
    layouts = [_layout(uuid, devices, pool, by_device) for uuid, devices in by_gpu.items()]
    return tuple(sorted(layouts, key=lambda layout: layout.index))


def _layout(
    uuid: str, devices: list[Device], pool: Pool, by_device: Mapping[str, list[Occupant]]
) -> GpuLayout:
    first = devices[0]
    product = str(first.attributes.get(names.PRODUCT_NAME, ""))
    model = _catalog_model(product)
    kind = layout_kind_of(devices)
    blocks: list[MigBlock] = []
    occupants: list[Occupant] = []
    for device in devices:
        held = by_device.get(device.name, [])
        if device.attributes.get(names.TYPE) == "mig":
            static = not device.consumes_counters
            if held or static:
                profile = str(device.attributes.get(names.PROFILE, ""))
                blocks.append(
                    MigBlock(
                        device.name,
                        profile,
                        _int(device, names.PLACEMENT_START),
                        _int(device, names.PLACEMENT_SIZE, 1),
                        compute_slices_of(profile),
                        held[0] if held else None,
                    )
                )
        else:
            occupants.extend(held)
    memory_slices = _memory_slices(devices, pool, model) if kind == "mig" else 0
    compute = 0
    if kind == "mig":
        compute = max((p.compute_slices for p in model.mig.profiles), default=7) if model and model.mig else 7
    return GpuLayout(
        index=_int(first, names.PARENT_INDEX, _int(first, names.INDEX)),
        uuid=uuid,
        product=product,
        kind=kind,
        memory_bytes=_gpu_memory(devices, pool, model),
        memory_slices=memory_slices,
        compute_slices=compute,
        blocks=tuple(sorted(blocks, key=lambda block: block.start)),
        occupants=tuple(occupants),
    )
