"""Which `gpus[]` entry of a node config applies to which GPU.

index/uuid entries name one GPU of one node; model/productName entries name every GPU of a kind,
so that one file serves a fleet of different nodes. The narrower entry wins: index/uuid over
model/productName, either over `default`. A model/productName entry that matches nothing on this
node is fine (it is for other nodes); an index/uuid entry that matches nothing is a mistake.
"""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from dra_driver.hardware.catalog import gpu_models
from dra_driver.hardware.model import Gpu

if TYPE_CHECKING:
    from dra_driver.devices.node_config import GpuEntry


def catalog_model(gpu: Gpu) -> str | None:
    """The GPU's catalog key: the model with NVML's product name (and the GPU's memory, should two
    models share a name); None for a GPU the catalog does not know."""
    named = [model for model in gpu_models().values() if model.product_name == gpu.product_name]
    if len(named) > 1:
        named = [model for model in named if model.memory_bytes == gpu.memory_bytes]
    return named[0].key if len(named) == 1 else None


def entry_matches(entry: "GpuEntry", gpu: Gpu) -> bool:
    if entry.index is not None:
        return entry.index == gpu.index
    if entry.uuid is not None:
        return entry.uuid == gpu.uuid
    if entry.model is not None:
        return entry.model == catalog_model(gpu)
    return entry.product_name == gpu.product_name


class Selection(msgspec.Struct, frozen=True):
    # GPU UUID -> the entries of the highest rank that match it (more than one: a conflict).
    entries_of_gpu: Mapping[str, tuple["GpuEntry", ...]]
    # index/uuid entries that name no GPU of this node.
    unmatched: tuple["GpuEntry", ...]


def select_entries(entries: Sequence["GpuEntry"], gpus: Sequence[Gpu]) -> Selection:
    chosen: dict[str, tuple[GpuEntry, ...]] = {}
    for gpu in gpus:
        matching = [entry for entry in entries if entry_matches(entry, gpu)]
        narrow = tuple(entry for entry in matching if entry.names_one_gpu)
        if found := narrow or tuple(matching):
            chosen[gpu.uuid] = found
    unmatched = tuple(
        entry
        for entry in entries
        if entry.names_one_gpu and not any(entry_matches(entry, gpu) for gpu in gpus)
    )
    return Selection(chosen, unmatched)
