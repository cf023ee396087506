"""The node configuration file decoded by typed Structs (`parse_node_config`): every problem of
the file at once, one line each, naming the setting and what was expected; planning it against
the node's GPUs is node_config.py's part.

The default and each entry of `gpus` are decoded on their own by `typed_all`, which names every
field of the part that is wrong, so a broken entry hides nothing of the others. The rules between
a part's fields (which blocks a mode takes, one selector per entry) are checked once the part has
decoded, and those between entries (two selecting the same GPUs) once every entry has.
"""

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from dra_driver.base.quantity import UP_TO_TERA, parse_quantity
from dra_driver.base.strict_decode import DecodeError, quoted
from dra_driver.base.typed_decode import DecodeProblems, typed, typed_all
from dra_driver.devices.modes.contract import SettingsBlock
from dra_driver.devices.modes.registry import AUTO, CONFIG_MODES, MODES, find_mode, names_where, taking
from dra_driver.devices.node_config import (
    MIB,
    Enforcement,
    GpuEntry,
    GpuSettings,
    NodeConfig,
    NodeConfigError,
    VgpuPartitionSize,
)
from dra_driver.devices.order import PackingPolicy
from dra_driver.hardware.catalog import gpu_models

if TYPE_CHECKING:
    _ModeName = str
else:
    # The registry's modes as a Literal, which msgspec checks and typed_decode names in order;
    # mypy builds no Literal from a tuple it cannot see, so to it a mode is a string.
    _ModeName = Literal[CONFIG_MODES]

_V = TypeVar("_V")
_T = TypeVar("_T")


def _bytes(value: object) -> int:
    """Whole bytes up to Ti/T, written without leading zeros (YAML 1.1 reads 010 as octal)."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    quantity = parse_quantity(text) if isinstance(text, str) else None
    total = quantity.whole_number(UP_TO_TERA) if quantity is not None else None
    if quantity is None or total is None or (quantity.whole.startswith("0") and quantity.whole != "0"):
        raise ValueError(
            f"expected a whole number of bytes such as 10Gi, 512Mi or 1073741824, got {quoted(value)}"
        )
    return total


class _MibBytes(int):
    """Bytes (`_bytes`) that are a whole number of MiB; typed_decode calls it with the value as
    written."""

    def __new__(cls, value: object) -> "_MibBytes":
        total = _bytes(value)
        if total < MIB or total % MIB:
            raise ValueError(f"must be a positive whole number of MiB, got {quoted(value)}")
        return super().__new__(cls, total)


class _CatalogModel(str):
    """A key of the GPU catalog (hardware/catalog/gpus.yaml), which no Literal can list: the
    catalog is read at run time."""

    def __new__(cls, value: object) -> "_CatalogModel":
        if not isinstance(value, str) or value not in gpu_models():
            raise ValueError(
                f"{quoted(value)} is not a GPU model of the catalog; known: {', '.join(gpu_models())}"
            )
        return super().__new__(cls, value)


class _Partition(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    memory: Annotated[_MibBytes, msgspec.Meta(description="the partition's memory, e.g. 10Gi")]
    cores: (
        Annotated[int, msgspec.Meta(ge=1, le=100, description="an integer percentage from 1 to 100")]
        | UnsetType
    ) = UNSET


class _Vgpu(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    memory_step: _MibBytes = _MibBytes(MIB)
    # Unset and empty differ: an empty list is a vgpu-partitions mode without partitions.
    partitions: tuple[_Partition, ...] | UnsetType = UNSET
    enforcement: Enforcement = "mps"


_ProfileName = Annotated[str, msgspec.Meta(description="a MIG profile name such as 1g.10gb")]


class _Mig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    profiles: Annotated[
        tuple[_ProfileName, ...],
        msgspec.Meta(description="a list of MIG profile names such as [1g.10gb, 3g.40gb]"),
    ] = ()


class _Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The default's settings, and each entry's. A block that is unset differs from one left
    empty: any block given is one its mode must take."""

    mode: _ModeName = AUTO
    vgpu: _Vgpu | UnsetType = UNSET
    mig: _Mig | UnsetType = UNSET
    packing: PackingPolicy = "binpack"


_ProductName = Annotated[
    str,
    msgspec.Meta(pattern=r"\S", description="the GPU's name as nvidia-smi shows it, such as 'NVIDIA L4'"),
]


class _Entry(_Settings, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """One `gpus[]` entry: its selectors come first, being positional, then the settings."""

    index: Annotated[int, msgspec.Meta(ge=0, description="a GPU index (an integer ≥ 0)")] | UnsetType = UNSET
    uuid: Annotated[str, msgspec.Meta(description="a GPU UUID string such as GPU-…")] | UnsetType = UNSET
    model: _CatalogModel | UnsetType = UNSET
    product_name: _ProductName | UnsetType = UNSET


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The parts, kept as written to be decoded one by one."""

    default: Any = msgspec.field(default_factory=dict)
    gpus: tuple[Any, ...] = ()


def _given(value: _V | UnsetType) -> _V | None:
    return None if isinstance(value, UnsetType) else value


def _rule_problems(written: _Settings, where: str) -> list[str]:
    """The rules between a part's settings; `find_mode` is None for auto, which takes no block."""
    mode = find_mode(written.mode)
    blocks: tuple[tuple[SettingsBlock, object], ...] = (("vgpu", written.vgpu), ("mig", written.mig))
    problems = [
        f"{where}.{block}: only allowed with mode {names_where(taking(block))}"
        for block, given in blocks
        if given is not UNSET and (mode is None or block not in mode.blocks)
    ]
    partitions = _given(written.vgpu.partitions) if isinstance(written.vgpu, _Vgpu) else None
    if mode is not None and mode.partitions and not partitions:
        problems.append(f"{where}.vgpu.partitions: mode {mode.name} needs at least one partition size")
    if partitions is not None and (mode is None or not mode.partitions):
        partitioned = names_where([each for each in MODES if each.partitions])
        problems.append(f"{where}.vgpu.partitions: only allowed with mode {partitioned}")
    if written.packing == "spread" and mode is not None and mode.no_spread:
        problems.append(f"{where}.packing: {mode.no_spread}")
    return problems


def _settings(written: _Settings) -> GpuSettings:
    """The settings of a part whose rules `_rule_problems` found kept."""
    vgpu = _given(written.vgpu) or _Vgpu()
    return GpuSettings(
        mode=written.mode,
        memory_step=int(vgpu.memory_step),
        partitions=tuple(
            VgpuPartitionSize(int(partition.memory), _given(partition.cores))
            for partition in _given(vgpu.partitions) or ()
        ),
        mig_profiles=written.mig.profiles if isinstance(written.mig, _Mig) else (),
        packing=written.packing,
        enforcement=vgpu.enforcement,
    )


def _default(raw: object) -> GpuSettings:
    written = typed_all(raw, _Settings, "default")
    if problems := _rule_problems(written, "default"):
        raise NodeConfigError(*problems)
    return _settings(written)


def _entry(raw: object, where: str) -> GpuEntry:
    written = typed_all(raw, _Entry, where)
    selectors = {
        "index": written.index,
        "uuid": written.uuid,
        "model": written.model,
        "productName": written.product_name,
    }
    given = [name for name, value in selectors.items() if value is not UNSET]
    problems = _rule_problems(written, where)
    if len(given) != 1:
        problems.insert(
            0,
            f"{where}: set exactly one of 'index', 'uuid', 'model' or 'productName' to say which GPUs "
            f"this is for, got {given or 'none'}",
        )
    if problems:
        raise NodeConfigError(*problems)
    model = _given(written.model)
    return GpuEntry(
        where=where,
        index=_given(written.index),
        uuid=_given(written.uuid),
        settings=_settings(written),
        model=None if model is None else str(model),
        product_name=_given(written.product_name),
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


def _part(decode: Callable[[], _T], problems: list[str]) -> _T | None:
    """A part of the file, or None with its problems added to `problems`."""
    try:
        return decode()
    except DecodeProblems as error:
        problems.extend(map(str, error.errors))
    except NodeConfigError as error:
        problems.extend(error.problems)
    return None


def parse_node_config(raw: object, origin: str) -> NodeConfig:
    """Raises NodeConfigError with one line per problem (of the default, of each entry), each
    starting with `origin`: an operator sees every problem of the file at once."""
    if raw is None:
        return NodeConfig()
    try:
        parts = typed(raw, _File)
    except DecodeError as error:
        raise NodeConfigError(f"{origin}: {error.path or 'node config'}: {error.problem}") from None
    problems: list[str] = []
    default = _part(partial(_default, parts.default), problems)
    entries = []
    for number, written in enumerate(parts.gpus):
        where = f"gpus[{number}]"
        if (entry := _part(partial(_entry, written, where), problems)) is not None:
            entries.append(entry)
    problems.extend(duplicate_problems(entries))
    if problems or default is None:
        raise NodeConfigError(*(f"{origin}: {problem}" for problem in problems))
    return NodeConfig(default=default, gpus=tuple(entries))
