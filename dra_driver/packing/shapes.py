"""Pod shapes for `dra-driver plan`: `--pods 10x1g.10gb,4xvgpu:10Gi/30%,2xgpu,3xgpu:8`.

A shape is what one pod's claim asks for, in the words operators use: a whole GPU (or several
in the claim's one request: `gpu:8`), a MIG profile, or a vGPU share of memory and (optionally)
cores. The grammar is checked here, with no knowledge of the node, so a typo is reported before
any hardware is read; whether a MIG profile exists is the node's question (`packing.planner`).

    item   := [count "x"] kind            count: 1..MAX_COUNT, no leading zeros (default 1)
    kind   := "gpu" [":" gpus] | profile | "vgpu:" memory ["/" cores "%"]
    gpus   := 1..MAX_GPUS_PER_POD, no leading zeros: whole GPUs in the one request (default 1)
    profile:= <n>"g."<m>"gb" ["+me" | "-me" ...]    e.g. 1g.10gb, 3g.40gb, 1g.10gb+me
    memory := a whole quantity: digits with Ki, Mi, Gi, Ti, k, M, G or T
    cores  := 1..100
"""

import re
from typing import Literal

import msgspec

from dra_driver.base.errors import OperatorFault
from dra_driver.base.quantity import UP_TO_TERA, parse_quantity

ShapeKind = Literal["gpu", "mig", "vgpu"]

# More pods than any node could hold by orders of magnitude, and small enough that a typo such as
# an extra zero is caught before a plan loops over it.
MAX_COUNT = 100_000
# The largest NVIDIA nodes (DGX/HGX) have 8 GPUs, and one claim is allocated on one node: a pod
# asking for more whole GPUs than a node has can never be placed, so it is a typo.
MAX_GPUS_PER_POD = 8
ALL_CORES = 100
FLAG = "--pods"

_ITEM = re.compile(r"(?:(?P<count>[0-9]+)x)?(?P<kind>.*)", re.S)
_PROFILE = re.compile(r"[1-9][0-9]*g\.[1-9][0-9]*gb(?:[+-][a-z][a-z0-9.]*)*")
_CORES = re.compile(r"(?P<digits>[0-9]+)%")
_GPUS = re.compile(r"[1-9][0-9]*")
_KIND_FORM = (
    f"gpu or gpu:<GPUs 1 to {MAX_GPUS_PER_POD}>, a MIG profile such as 1g.10gb or 3g.40gb, "
    "or vgpu:<memory>[/<cores>%]"
)


class ShapeError(OperatorFault, ValueError):
    """One bad `--pods` item: the message names the item, the field and what was expected."""


class PodShape(msgspec.Struct, frozen=True):
    """What one pod asks for. `text` is the kind as written (`1g.10gb`, `vgpu:10Gi/30%`, `gpu:8`)."""

    kind: ShapeKind
    text: str
    # How many devices the pod's one request takes: more than 1 only for whole GPUs (`gpu:N`).
    devices: int = 1
    # MIG: the profile name.
    profile: str = ""
    # vGPU: the share's memory in bytes, and its cores in percent (None: not asked, so the
    # request policy's default, all of them, as the scheduler charges it).
    memory_bytes: int = 0
    cores: int | None = None


class PodGroup(msgspec.Struct, frozen=True):
    """`count` pods of one shape; `position` is the item's place in --pods, for messages."""

    count: int
    shape: PodShape
    position: int

    @property
    def item(self) -> str:
        return f"{self.count}x{self.shape.text}"


def _where(position: int, item: str) -> str:
    return f'{FLAG}[{position}] "{item}"'


def _count(text: str | None, where: str) -> int:
    if text is None:
        return 1
    if text.startswith("0") or len(text) > len(str(MAX_COUNT)) or int(text) > MAX_COUNT:
        raise ShapeError(f'{where}: count "{text}": expected a whole number from 1 to {MAX_COUNT}')
    return int(text)


def _memory(text: str, where: str) -> int:
    quantity = parse_quantity(text)
    memory = quantity.whole_number(UP_TO_TERA) if quantity is not None else None
    if not memory:
        raise ShapeError(f'{where}: memory "{text}": expected a quantity like 10Gi, more than zero')
    return memory


def _cores(text: str, where: str) -> int:
    match = _CORES.fullmatch(text)
    if match is None or not 1 <= int(match["digits"]) <= ALL_CORES:
        raise ShapeError(f'{where}: cores "{text}": expected a percentage from 1% to {ALL_CORES}%')
    return int(match["digits"])


def _gpus(text: str, where: str) -> int:
    digits = text.removeprefix("gpu:")
    if (
        not _GPUS.fullmatch(digits)
        or len(digits) > len(str(MAX_GPUS_PER_POD))
        or int(digits) > MAX_GPUS_PER_POD
    ):
        raise ShapeError(
            f'{where}: gpus "{digits}": expected a whole number of GPUs from 1 to {MAX_GPUS_PER_POD}'
        )
    return int(digits)


def _vgpu(text: str, where: str) -> PodShape:
    memory_text, slash, cores_text = text.removeprefix("vgpu:").partition("/")
    memory = _memory(memory_text, where)
    cores = _cores(cores_text, where) if slash else None
    return PodShape("vgpu", text, memory_bytes=memory, cores=cores)


def parse_shape(text: str, where: str) -> PodShape:
    if text == "gpu":
        return PodShape("gpu", text)
    if text.startswith("gpu:"):
        return PodShape("gpu", text, devices=_gpus(text, where))
    if text.startswith("vgpu:"):
        return _vgpu(text, where)
    if _PROFILE.fullmatch(text):
        return PodShape("mig", text, profile=text)
    raise ShapeError(f'{where}: kind "{text}": expected {_KIND_FORM}')


def parse_item(item: str, position: int) -> PodGroup:
    where = _where(position, item)
    match = _ITEM.fullmatch(item)
    assert match is not None  # the pattern matches every string
    if not match["kind"]:
        raise ShapeError(f"{where}: expected [<count>x]<kind>, e.g. 2x1g.10gb, with <kind> {_KIND_FORM}")
    return PodGroup(_count(match["count"], where), parse_shape(match["kind"], where), position)


def parse_pods(text: str) -> tuple[PodGroup, ...]:
    """`--pods` as written: comma-separated items, spaces around them allowed. Raises
    ShapeError for the first bad item."""
    if not text.strip():
        raise ShapeError(
            f"{FLAG}: expected at least one pod shape, e.g. 10x1g.10gb,4xvgpu:10Gi/30%,2xgpu,gpu:8"
        )
    return tuple(parse_item(item.strip(), position) for position, item in enumerate(text.split(",")))
