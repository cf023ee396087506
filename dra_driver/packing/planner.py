"""`dra-driver plan`: how many pods of the given shapes a node takes, where the scheduler puts
them, and what is left stranded, for each way the node's GPUs can be offered.

Each mode's devices are rendered by the agent's own code (`devices.node_config.plan_node` for the
per-GPU decision, `publish.desired.desired_pool` for the inventory), and the pods are placed by
the allocator model in the order given, one claim each, as the scheduler would place them
arriving one after another. So a plan answers for the devices the driver really publishes, in
the order it publishes them.

Stranded memory is free memory on a GPU that can take none of the pod shapes asked for: free,
but of no use to this workload (a lone memory slice next to a 3g instance when only 3g pods are
asked for, or the rest of a GPU whose cores a vGPU share has taken).
"""

from collections.abc import Callable, Iterable, Mapping, Sequence

import msgspec
from msgspec.structs import replace

from dra_driver.devices import attributes as names
from dra_driver.devices.inventory import Inventory
from dra_driver.devices.mig import has_instances
from dra_driver.devices.model import Device
from dra_driver.devices.modes.contract import DeviceMode, PlanAsks
from dra_driver.devices.modes.registry import MODES, auto_mode, mode_named
from dra_driver.devices.node_config import (
    GpuEntry,
    GpuPlan,
    GpuSettings,
    NodeConfig,
    NodePlan,
    plan_node,
)
from dra_driver.hardware.model import Gpu, MigMode
from dra_driver.health.tracker import HealthState
from dra_driver.packing.allocator import Allocation, Claim, DeviceResult, NodeState, Pool, Refusal, Request
from dra_driver.packing.layout import GpuLayout, Occupant, device_gpu_uuid, device_memory, gpu_layouts
from dra_driver.packing.shapes import ALL_CORES, PodGroup, PodShape, ShapeError
from dra_driver.publish.desired import ApiCapabilities, desired_pool

# What a plan's column is: a registered mode's name (devices.modes.registry), "node-config"
# (every GPU as a node config file says) or "published" (as a live node publishes).
PlanMode = str


class PlacedPod(msgspec.Struct, frozen=True):
    number: int
    shape: str
    # The devices its claim got and the index of each one's GPU, in allocation order: one each,
    # but for a pod of several whole GPUs (`gpu:8`).
    devices: tuple[str, ...]
    gpus: tuple[int, ...]
    # What it holds over all its devices: bytes of memory, and percent of one GPU's cores summed
    # (800 for eight whole GPUs).
    memory_bytes: int
    cores: int

    @property
    def device(self) -> str:
        return self.devices[0]

    @property
    def gpu(self) -> int:
        return self.gpus[0]


class GroupOutcome(msgspec.Struct, frozen=True):
    group: PodGroup
    placed: tuple[PlacedPod, ...]
    # Why the first pod that did not fit was refused ("" when all fit).
    refusal: str

    @property
    def refused(self) -> int:
        return self.group.count - len(self.placed)


class GpuOutcome(msgspec.Struct, frozen=True):
    layout: GpuLayout
    stranded_bytes: int


class ModePlan(msgspec.Struct, frozen=True):
    mode: PlanMode
    groups: tuple[GroupOutcome, ...]
    gpus: tuple[GpuOutcome, ...]
    # What the mode could not do with some GPUs (a GPU without MIG stays whole in MIG mode).
    notes: tuple[str, ...] = ()
    # A trace replay's device order ("static" or "live"); "" for a plan of --pods.
    order: str = ""

    @property
    def column(self) -> str:
        """The mode, and the order where a trace was replayed in two: names the plan's column."""
        return f"{self.mode}, {self.order} order" if self.order else self.mode

    @property
    def asked(self) -> int:
        return sum(outcome.group.count for outcome in self.groups)

    @property
    def placed(self) -> int:
        return sum(len(outcome.placed) for outcome in self.groups)

    @property
    def memory_bytes(self) -> int:
        return sum(gpu.layout.memory_bytes for gpu in self.gpus)

    @property
    def used_bytes(self) -> int:
        return sum(gpu.layout.used_bytes for gpu in self.gpus)

    @property
    def stranded_bytes(self) -> int:
        return sum(gpu.stranded_bytes for gpu in self.gpus)


def _is_type(device_type: str) -> Callable[[Device], bool]:
    def selector(device: Device) -> bool:
        return device.attributes.get(names.TYPE) == device_type

    return selector


def _is_profile(profile: str) -> Callable[[Device], bool]:
    def selector(device: Device) -> bool:
        return device.attributes.get(names.TYPE) == "mig" and device.attributes.get(names.PROFILE) == profile

    return selector


def _request(shape: PodShape, selector: Callable[[Device], bool]) -> Request:
    if shape.kind != "vgpu":
        return Request(shape.kind, selector, count=shape.devices)
    capacity = {"memory": shape.memory_bytes}
    if shape.cores is not None:
        capacity["cores"] = shape.cores
    return Request("vgpu", selector, capacity=capacity)


def _selector(shape: PodShape) -> Callable[[Device], bool]:
    """The shipped DeviceClass of the shape's kind, and for MIG the profile the pod asks for."""
    return _is_profile(shape.profile) if shape.kind == "mig" else _is_type(shape.kind)


def _on_gpu(selector: Callable[[Device], bool], uuid: str) -> Callable[[Device], bool]:
    def on_gpu(device: Device) -> bool:
        return device_gpu_uuid(device) == uuid and selector(device)

    return on_gpu


def offered_profiles(pool: Pool) -> list[str]:
    return sorted(
        {str(d.attributes[names.PROFILE]) for d in pool.devices if d.attributes.get(names.TYPE) == "mig"}
    )


def check_profiles(groups: Iterable[PodGroup], profiles_by_product: Mapping[str, Sequence[str]]) -> None:
    """Raises ShapeError for a MIG shape no GPU of the node offers, naming the profiles they do."""
    known = {profile for profiles in profiles_by_product.values() for profile in profiles}
    for group in groups:
        if group.shape.kind != "mig" or group.shape.profile in known:
            continue
        where = f'--pods[{group.position}] "{group.item}"'
        offered = "; ".join(
            f"{product}: {', '.join(names)}" for product, names in profiles_by_product.items()
        )
        raise ShapeError(
            f'{where}: MIG profile "{group.shape.profile}" is not offered by this node\'s GPUs; '
            + (f"they offer {offered}" if offered else "none of them supports MIG")
        )


def gpu_profiles(gpus: Iterable[Gpu]) -> dict[str, list[str]]:
    """The MIG profiles each GPU model of the node offers, by product name."""
    return {gpu.product_name: [p.name for p in gpu.mig_profiles] for gpu in gpus if gpu.mig_profiles}


def plan_asks(groups: Iterable[PodGroup]) -> PlanAsks:
    """What the pods ask for that a mode's settings depend on (the vGPU sizes to cut)."""
    return PlanAsks(tuple((g.shape.memory_bytes, g.shape.cores) for g in groups if g.shape.kind == "vgpu"))


def _mode_settings(gpu: Gpu, mode: DeviceMode, asks: PlanAsks) -> tuple[Gpu, GpuSettings]:
    """The GPU as it would be in this mode (MIG mode switched as an operator would), and its
    settings; a GPU with MIG instances keeps them, and one that cannot be offered in the mode is
    offered whole (as mode auto offers a GPU with MIG off)."""
    if has_instances(gpu):
        return gpu, GpuSettings(mode=auto_mode(gpu).name)
    mig_off = MigMode.UNSUPPORTED if not gpu.mig_profiles else MigMode.DISABLED
    whole = replace(gpu, mig_mode=mig_off, mig_instances=())
    moded = replace(gpu, mig_mode=MigMode.ENABLED, mig_instances=()) if mode.in_mig_mode else whole
    settings = mode.planned(moded, asks) if gpu.mig_profiles or not mode.in_mig_mode else None
    if settings is None:
        return whole, GpuSettings(mode=auto_mode(whole).name)
    return moded, settings


def _mode_note(plan: GpuPlan, mode: DeviceMode) -> str:
    gpu = f"{plan.gpu.label} ({plan.gpu.product_name})"
    if has_instances(plan.gpu):
        return (
            f"{gpu} has MIG instances, so it is planned as they are ({plan.mode}); "
            f"destroy them to offer it as {mode.name}"
        )
    return f"{gpu} {mode.not_planned}; offered whole"


def _published(node_plan: NodePlan, driver: str) -> tuple[Inventory, tuple[str, ...]]:
    """The inventory the agent would publish for the plan, and its notes (GPUs left out,
    instances not published)."""
    pool = desired_pool(node_plan.plans, ApiCapabilities(), HealthState(started_at=0.0), driver)
    notes = (*(problem.message for problem in node_plan.problems), *pool.published.notes)
    return pool.published, notes


def mode_inventory(
    gpus: Sequence[Gpu], mode: PlanMode, groups: Sequence[PodGroup], driver: str
) -> tuple[Inventory, tuple[str, ...]]:
    """What the agent would publish with every GPU in `mode`, and notes on GPUs that cannot be."""
    described = mode_named(mode)
    asks = plan_asks(groups)
    moded = [_mode_settings(gpu, described, asks) for gpu in gpus]
    entries = tuple(
        GpuEntry(where=f"gpus[{number}]", index=gpu.index, uuid=None, settings=settings)
        for number, (gpu, settings) in enumerate(moded)
    )
    node_plan = plan_node(NodeConfig(gpus=entries), [gpu for gpu, _ in moded])
    inventory, notes = _published(node_plan, driver)
    moved = (_mode_note(plan, described) for plan in node_plan.plans if plan.mode != mode)
    return inventory, (*notes, *moved)


def mode_pool(
    gpus: Sequence[Gpu], mode: PlanMode, groups: Sequence[PodGroup], driver: str
) -> tuple[Pool, tuple[str, ...]]:
    """The pool the agent would publish with every GPU in `mode`, and notes on GPUs that cannot be."""
    inventory, notes = mode_inventory(gpus, mode, groups, driver)
    return Pool.from_inventory(inventory, driver), notes


def config_inventory(
    gpus: Sequence[Gpu], config: NodeConfig, driver: str
) -> tuple[Inventory, tuple[str, ...]]:
    """What the agent would publish with this node config, on the GPUs as they are (MIG mode and
    instances included), and why any GPU is left out."""
    return _published(plan_node(config, gpus), driver)


def modes_for(gpus: Sequence[Gpu], groups: Sequence[PodGroup]) -> tuple[PlanMode, ...]:
    """Every mode that can serve some shape, in the registry's order: static MIG only where a GPU
    has instances, dynamic MIG only where a GPU supports it, vGPU partitions only when vGPU shapes
    say which sizes to cut (each mode's `serves`)."""
    asks = plan_asks(groups)
    return tuple(mode.name for mode in MODES if mode.serves(gpus, asks))


def occupant_of(pool_device: Device, result: DeviceResult, label: str) -> Occupant:
    if result.consumed:
        return Occupant(
            result.device, label, result.consumed.get("memory", 0), result.consumed.get("cores", 0)
        )
    cores = pool_device.capacity.get("cores")
    return Occupant(result.device, label, device_memory(pool_device), cores.value if cores else ALL_CORES)


def placed_pod(
    number: int,
    label: str,
    allocation: Allocation,
    devices: Mapping[str, Device],
    gpu_index: Mapping[str, int],
) -> tuple[PlacedPod, tuple[Occupant, ...]]:
    """The pod an allocation placed, and what it occupies: one occupant per device it got."""
    occupants = tuple(occupant_of(devices[result.device], result, label) for result in allocation.results)
    gpus = tuple(gpu_index[device_gpu_uuid(devices[occupant.device])] for occupant in occupants)
    memory = sum(occupant.memory_bytes for occupant in occupants)
    cores = sum(occupant.cores for occupant in occupants)
    return PlacedPod(number, label, tuple(o.device for o in occupants), gpus, memory, cores), occupants


def _claim(shape: PodShape, on_gpu: str) -> Claim:
    selector = _selector(shape)
    if not on_gpu:
        return Claim((_request(shape, selector),))
    # A pod of several GPUs can use this one when it and enough others are free: one device
    # here, the rest anywhere (the allocator never gives one device twice in a claim).
    here = _request(replace(shape, devices=1), _on_gpu(selector, on_gpu))
    rest = (Request("others", selector, count=shape.devices - 1),) if shape.devices > 1 else ()
    return Claim((here, *rest))


def shape_claims(groups: Iterable[PodGroup], on_gpu: str = "") -> dict[PodShape, Claim]:
    """One claim per distinct shape: equal pods share one selector, so the allocator model
    finds their candidate devices once (`NodeState` caches them per selector). With `on_gpu`,
    claims that must take a device of that GPU."""
    return {group.shape: _claim(group.shape, on_gpu) for group in groups}


def plan_pool(
    pool: Pool,
    groups: Sequence[PodGroup],
    mode: PlanMode,
    notes: tuple[str, ...] = (),
    allocated: Sequence[tuple[Allocation, str]] = (),
) -> ModePlan:
    """Places the pods group by group in the given order, first fit, one claim per pod, around
    what is `allocated` already (each allocation with the label the layout shows for it)."""
    state = NodeState(pool)
    devices = {device.name: device for device in pool.devices}
    claims = shape_claims(groups)
    occupants: list[Occupant] = []
    for allocation, label in allocated:
        known = tuple(result for result in allocation.results if result.device in devices)
        state.add(Allocation(known))
        occupants += [occupant_of(devices[result.device], result, label) for result in known]
    # Allocations only take, so a shape refused once stays refused for the rest of the plan.
    refused: dict[PodShape, str] = {}
    gpu_index = {layout.uuid: layout.index for layout in gpu_layouts(pool, ())}
    outcomes = []
    number = 0
    for group in groups:
        placed: list[PlacedPod] = []
        for _ in range(0 if group.shape in refused else group.count):
            outcome = state.allocate(claims[group.shape])
            if isinstance(outcome, Refusal):
                refused[group.shape] = outcome.reason
                break
            state.add(outcome)
            pod, held = placed_pod(number, group.shape.text, outcome, devices, gpu_index)
            occupants += held
            placed.append(pod)
            number += 1
        number += group.count - len(placed)
        outcomes.append(GroupOutcome(group, tuple(placed), refused.get(group.shape, "")))
    layouts = gpu_layouts(pool, occupants)
    return ModePlan(
        mode, tuple(outcomes), tuple(gpu_outcome(state, layout, groups) for layout in layouts), notes
    )


def gpu_outcome(state: NodeState, layout: GpuLayout, groups: Sequence[PodGroup]) -> GpuOutcome:
    """All the GPU's free memory when no shape asked for fits on it any more, else none."""
    for claim in shape_claims(groups, on_gpu=layout.uuid).values():
        if not isinstance(state.allocate(claim), Refusal):
            return GpuOutcome(layout, 0)
    return GpuOutcome(layout, layout.free_bytes)


def plan_node_modes(
    gpus: Sequence[Gpu], groups: Sequence[PodGroup], driver: str, modes: Sequence[PlanMode] = ()
) -> tuple[ModePlan, ...]:
    """The plan in every mode the node's GPUs allow (or the modes named). Raises ShapeError for
    a MIG profile the GPUs do not offer."""
    check_profiles(groups, gpu_profiles(gpus))
    plans = []
    for mode in modes or modes_for(gpus, groups):
        pool, notes = mode_pool(gpus, mode, groups, driver)
        plans.append(plan_pool(pool, groups, mode, notes))
    return tuple(plans)


def plan_node_config(
    gpus: Sequence[Gpu], groups: Sequence[PodGroup], driver: str, config: NodeConfig
) -> ModePlan:
    """The plan of the node as the config offers its GPUs. Raises ShapeError for a MIG profile
    the GPUs do not offer."""
    check_profiles(groups, gpu_profiles(gpus))
    inventory, notes = config_inventory(gpus, config, driver)
    return plan_pool(Pool.from_inventory(inventory, driver), groups, "node-config", notes)
