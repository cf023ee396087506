"""The node configuration file decoded strictly: every problem of the file at once, one line
each, naming the setting and what was expected (`parse_node_config`); planning it against the
node's GPUs is node_config.py's part.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from dra_driver.base.quantity import UP_TO_TERA, parse_quantity
from dra_driver.base.strict_decode import (
    DecodeError,
    choice,
    items,
    literal_options,
    mapping,
    quoted,
)
from dra_driver.devices.modes.contract import DeviceMode, SettingsBlock
from dra_driver.devices.modes.registry import AUTO, CONFIG_MODES, MODES, find_mode, names_where, taking
from dra_driver.devices.node_config import (
    MIB,
    Enforcement,
    GpuEntry,
    GpuSettings,
    Mode,
    NodeConfig,
    NodeConfigError,
    VgpuPartitionSize,
)
from dra_driver.devices.order import PackingPolicy
from dra_driver.hardware.catalog import gpu_models

_MODE_OPTIONS = {name: name for name in CONFIG_MODES}


def _bytes(value: object, where: str) -> int:
    """Whole bytes up to Ti/T, written without leading zeros (YAML 1.1 reads 010 as octal)."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    quantity = parse_quantity(text) if isinstance(text, str) else None
    total = quantity.whole_number(UP_TO_TERA) if quantity is not None else None
    if quantity is None or total is None or (quantity.whole.startswith("0") and quantity.whole != "0"):
        raise NodeConfigError(
            f"{where}: expected a whole number of bytes such as 10Gi, 512Mi or 1073741824, "
            f"got {quoted(value)}"
        )
    return total


def _mapping(raw: object, where: str, allowed: Sequence[str]) -> Mapping[str, Any]:
    try:
        return mapping(raw, where, allowed)
    except DecodeError as error:
        raise NodeConfigError(f"{error.path or 'node config'}: {error.problem}") from error


def _list(raw: object, where: str) -> list[Any]:
    try:
        return items(raw, where)
    except DecodeError as error:
        raise NodeConfigError(str(error)) from error


def _partition(raw: object, where: str) -> VgpuPartitionSize:
    found = _Found()
    fields = _fields(raw, where, ("memory", "cores"), found)
    memory = 0
    if "memory" not in fields:
        found.add(f"{where}.memory: required (the partition's memory, e.g. 10Gi)")
    else:
        memory = found.take(lambda: _bytes(fields["memory"], f"{where}.memory"), MIB)
        if memory < MIB or memory % MIB:
            found.add(
                f"{where}.memory: must be a positive whole number of MiB, got {quoted(fields['memory'])}"
            )
    cores = fields.get("cores")
    if cores is not None and (not isinstance(cores, int) or isinstance(cores, bool) or not 1 <= cores <= 100):
        found.add(f"{where}.cores: expected an integer percentage from 1 to 100, got {quoted(cores)}")
    found.raise_any()
    return VgpuPartitionSize(memory, cores)


_T = TypeVar("_T")


class _Found:
    """The problems of one object, every one of them: the README promises one line per problem,
    and a config fixed one error per run is a config fixed slowly. A check whose input did not
    decode is skipped, so a bad value is reported once, not again by each check that reads it."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def take(self, decode: Callable[[], _T], fallback: _T) -> _T:
        try:
            return decode()
        except NodeConfigError as error:
            self.problems.extend(error.problems)
            return fallback

    def add(self, problem: str) -> None:
        self.problems.append(problem)

    def raise_any(self) -> None:
        if self.problems:
            raise NodeConfigError(*self.problems)


def _fields(raw: object, where: str, allowed: Sequence[str], found: _Found) -> Mapping[str, Any]:
    """The known fields of a mapping; unknown ones (and a value that is no mapping) are problems."""
    decoded = found.take(lambda: _mapping(raw, where, allowed), None)
    if decoded is not None:
        return decoded
    return {key: value for key, value in raw.items() if key in allowed} if isinstance(raw, Mapping) else {}


def _partition_of(raw: object, where: str, found: _Found) -> VgpuPartitionSize | None:
    no_partition: VgpuPartitionSize | None = None
    return found.take(lambda: _partition(raw, where), no_partition)


def _memory_step(vgpu: Mapping[str, Any], where: str) -> int:
    memory_step = _bytes(vgpu.get("memoryStep", "1Mi"), f"{where}.vgpu.memoryStep")
    if memory_step < MIB or memory_step % MIB:
        raise NodeConfigError(f"{where}.vgpu.memoryStep: must be a positive whole number of MiB")
    return memory_step


def _decoded_choice(value: object, where: str, options: Mapping[str, _T]) -> _T:
    try:
        return choice(value, where, options)
    except DecodeError as error:
        raise NodeConfigError(str(error)) from error


def _profiles(mig: Mapping[str, Any], where: str) -> tuple[str, ...]:
    profiles = _list(mig.get("profiles", []), f"{where}.mig.profiles")
    for number, name in enumerate(profiles):
        if not isinstance(name, str):
            raise NodeConfigError(
                f"{where}.mig.profiles: expected profile names such as 1g.10gb, "
                f"got {quoted(name)} at [{number}]"
            )
    return tuple(profiles)


def _settings(raw: Mapping[str, Any], where: str) -> GpuSettings:
    found = _Found()
    mode: Mode | None = found.take(
        lambda: _decoded_choice(raw.get("mode", AUTO), f"{where}.mode", _MODE_OPTIONS), None
    )
    described = find_mode(mode) if mode is not None else None
    vgpu = _fields(raw.get("vgpu", {}), f"{where}.vgpu", ("memoryStep", "partitions", "enforcement"), found)
    mig = _fields(raw.get("mig", {}), f"{where}.mig", ("profiles",), found)
    blocks: tuple[tuple[SettingsBlock, Mapping[str, Any]], ...] = (("vgpu", vgpu), ("mig", mig))
    for block, given in blocks:
        if mode is not None and given and (described is None or block not in described.blocks):
            found.add(f"{where}.{block}: only allowed with mode {names_where(taking(block))}")
    memory_step = found.take(lambda: _memory_step(vgpu, where), MIB)
    no_entries: list[Any] = []
    entries = found.take(lambda: _list(vgpu.get("partitions", []), f"{where}.vgpu.partitions"), no_entries)
    partitions = tuple(
        partition
        for number, entry in enumerate(entries)
        if (partition := _partition_of(entry, f"{where}.vgpu.partitions[{number}]", found)) is not None
    )
    if described is not None and described.partitions and not entries:
        found.add(f"{where}.vgpu.partitions: mode {mode} needs at least one partition size")
    if mode is not None and "partitions" in vgpu and (described is None or not described.partitions):
        partitioned = names_where([each for each in MODES if each.partitions])
        found.add(f"{where}.vgpu.partitions: only allowed with mode {partitioned}")
    enforcement: Enforcement = found.take(
        lambda: _decoded_choice(
            vgpu.get("enforcement", "mps"), f"{where}.vgpu.enforcement", literal_options(Enforcement)
        ),
        "mps",
    )
    no_profiles: tuple[str, ...] = ()
    profiles = found.take(lambda: _profiles(mig, where), no_profiles)
    packing: PackingPolicy = "binpack"
    if mode is not None:
        packing = found.take(lambda: _packing(raw, described, where), "binpack")
    found.raise_any()
    assert mode is not None  # a mode that did not decode is a problem raised above
    return GpuSettings(
        mode=mode,
        memory_step=memory_step,
        partitions=partitions,
        mig_profiles=profiles,
        packing=packing,
        enforcement=enforcement,
    )


def _packing(raw: Mapping[str, Any], mode: DeviceMode | None, where: str) -> PackingPolicy:
    """`mode` None: auto, whose modes all allow either packing."""
    try:
        packing: PackingPolicy = choice(
            raw.get("packing", "binpack"), f"{where}.packing", literal_options(PackingPolicy)
        )
    except DecodeError as error:
        raise NodeConfigError(str(error)) from error
    if packing == "spread" and mode is not None and mode.no_spread:
        raise NodeConfigError(f"{where}.packing: {mode.no_spread}")
    return packing


_SETTINGS_FIELDS = ("mode", "vgpu", "mig", "packing")
_SELECTORS = ("index", "uuid", "model", "productName")


def _entry(raw: object, where: str) -> GpuEntry:
    found = _Found()
    fields = _fields(raw, where, (*_SELECTORS, *_SETTINGS_FIELDS), found)
    if not isinstance(raw, Mapping):
        found.raise_any()
    given = [name for name in _SELECTORS if fields.get(name) is not None]
    if len(given) != 1:
        found.add(
            f"{where}: set exactly one of 'index', 'uuid', 'model' or 'productName' to say which GPUs "
            f"this is for, got {given or 'none'}"
        )
    index, uuid, model, product_name = (fields.get(name) for name in _SELECTORS)
    if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
        found.add(f"{where}.index: expected a GPU index (an integer ≥ 0), got {quoted(index)}")
    if uuid is not None and not isinstance(uuid, str):
        found.add(f"{where}.uuid: expected a GPU UUID string such as GPU-…, got {quoted(uuid)}")
    if model is not None and (not isinstance(model, str) or model not in gpu_models()):
        found.add(
            f"{where}.model: {quoted(model)} is not a GPU model of the catalog; "
            f"known: {', '.join(gpu_models())}"
        )
    if product_name is not None and (not isinstance(product_name, str) or not product_name.strip()):
        found.add(
            f"{where}.productName: expected the GPU's name as nvidia-smi shows it, such as 'NVIDIA L4', "
            f"got {quoted(product_name)}"
        )
    settings = found.take(lambda: _settings(fields, where), None)
    found.raise_any()
    assert settings is not None  # settings that did not decode are problems raised above
    return GpuEntry(
        where=where, index=index, uuid=uuid, settings=settings, model=model, product_name=product_name
    )


def _conflicts(entry: GpuEntry) -> tuple[tuple[str, object], ...]:
    """The keys under which an earlier entry of equal rank would select the same GPUs as this one.
    A model entry and a productName entry of the model's product name select the same GPUs; two
    models never do (should two models share a product name, the GPU's memory tells them apart)."""
    if entry.index is not None:
        return (("index", entry.index),)
    if entry.uuid is not None:
        return (("uuid", entry.uuid),)
    if entry.model is not None:
        return (("model", entry.model), ("productName", gpu_models()[entry.model].product_name))
    return (("productName", entry.product_name), ("model of productName", entry.product_name))


def _registered(entry: GpuEntry) -> tuple[tuple[str, object], ...]:
    """The keys this entry answers to for the entries after it."""
    if entry.model is not None:
        return (("model", entry.model), ("model of productName", gpu_models()[entry.model].product_name))
    return _conflicts(entry)[:1]


def duplicate_problems(entries: Sequence[GpuEntry]) -> list[str]:
    """Entries that select the same GPUs with equal rank: on any node with such a GPU neither can
    win, so the GPU would be left out. The same index, the same uuid, the same model, the same
    productName, or a model and its product name. (An index and a uuid naming one GPU can only be
    told on the node; `plan_node` reports those.)"""
    seen: dict[tuple[str, object], GpuEntry] = {}
    problems = []
    for entry in entries:
        earlier = next((seen[key] for key in _conflicts(entry) if key in seen), None)
        if earlier is not None:
            problems.append(
                f"{entry.where}: selects the same GPUs as {earlier.where} ({earlier.selector}); "
                "give each GPU or kind of GPU one entry"
            )
        for key in _registered(entry):
            seen.setdefault(key, entry)
    return problems


def _default(fields: Mapping[str, Any]) -> GpuSettings:
    found = _Found()
    known = _fields(fields.get("default", {}), "default", _SETTINGS_FIELDS, found)
    settings = found.take(lambda: _settings(known, "default"), None)
    found.raise_any()
    assert settings is not None  # settings that did not decode are problems raised above
    return settings


def parse_node_config(raw: object, origin: str) -> NodeConfig:
    """Raises NodeConfigError with one line per malformed part (the default, each entry), each
    starting with `origin`: an operator sees every problem of the file at once."""
    if raw is None:
        return NodeConfig()
    problems: list[str] = []
    default = GpuSettings()
    entries: list[GpuEntry] = []
    try:
        fields = _mapping(raw, "", ("default", "gpus"))
        try:
            default = _default(fields)
        except NodeConfigError as error:
            problems.extend(error.problems)
        for number, entry in enumerate(_list(fields.get("gpus", []), "gpus")):
            try:
                entries.append(_entry(entry, f"gpus[{number}]"))
            except NodeConfigError as error:
                problems.extend(error.problems)
    except NodeConfigError as error:
        problems.extend(error.problems)
    problems.extend(duplicate_problems(entries))
    if problems:
        raise NodeConfigError(*(f"{origin}: {problem}" for problem in problems))
    return NodeConfig(default=default, gpus=tuple(entries))
