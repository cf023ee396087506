"""The `sharing` block of the opaque configs: how processes share one allocated device.

Its own module because its fields have rules across each other (a strategy, and the settings
block of that strategy only), which a Struct's types cannot carry: the block is decoded as
written (SharingFile, by opaque_config's `typed` call) and its rules are checked here, on the
decoded block. Raises DecodeError; opaque_config turns that into the claim's error.
"""

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

import msgspec

from dra_driver.base.strict_decode import (
    ByteQuantity,
    DecodeError,
    JsonInteger,
    described,
    join,
    listed,
    shown,
)
from dra_driver.hardware.model import TimeSliceInterval

SharingStrategy = Literal["TimeSlicing", "MPS"]


class TimeSlicingSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`Default` leaves the GPU's time-slice setting alone; the others pick a fixed length.

    Also the `timeSlicing` block as written: the API's form and the model's are one here.
    """

    interval: TimeSliceInterval = "Default"


class MpsSettings(msgspec.Struct, frozen=True):
    """Limits for the claim's MPS control daemon; None and an empty mapping mean "no limit"."""

    default_active_thread_percentage: int | None = None
    # Bytes. Keys of the per-device mapping are a device index within the claim or a GPU/MIG UUID.
    default_pinned_device_memory_limit: int | None = None
    default_per_device_pinned_memory_limit: Mapping[str, int] = msgspec.field(default_factory=dict)


class Sharing(msgspec.Struct, frozen=True):
    """How the processes using one allocated device share it.

    Exactly one of `time_slicing` and `mps` is set, the one that matches `strategy`, so a
    consumer never has to guess which settings are in force.
    """

    strategy: SharingStrategy = "TimeSlicing"
    time_slicing: TimeSlicingSettings | None = msgspec.field(default_factory=TimeSlicingSettings)
    mps: MpsSettings | None = None


_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# A device index has at most three digits: no claim has a thousand devices.
_DEVICE_KEY = re.compile(rf"0|[1-9][0-9]{{0,2}}|GPU-{_UUID}|MIG-{_UUID}")
_STRATEGIES: tuple[SharingStrategy, ...] = get_args(SharingStrategy)


class ThreadPercentage(JsonInteger):
    """`defaultActiveThreadPercentage`: the share of the GPU's threads MPS gives a client."""

    minimum, maximum = 1, 100


class _MpsFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """The `mps` block as written. The per-device limits' keys and quantities are checked by
    `_per_device_limits`: msgspec names a mapping's value by no key, and the key is what a user
    needs to find the wrong one."""

    default_active_thread_percentage: ThreadPercentage | msgspec.UnsetType = msgspec.UNSET
    default_pinned_device_memory_limit: ByteQuantity | msgspec.UnsetType = msgspec.UNSET
    default_per_device_pinned_memory_limit: Annotated[
        dict[Any, Any], msgspec.Meta(description="an object of device index or UUID to quantity")
    ] = msgspec.field(default_factory=dict)


class SharingFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """The `sharing` block as written, before the rules across its fields (decode_sharing)."""

    strategy: SharingStrategy
    time_slicing: TimeSlicingSettings | msgspec.UnsetType = msgspec.UNSET
    mps: _MpsFile | msgspec.UnsetType = msgspec.UNSET


def _per_device_limits(written: Mapping[Any, Any], path: str) -> dict[str, int]:
    limits: dict[str, int] = {}
    for key, quantity in written.items():
        if not isinstance(key, str) or not _DEVICE_KEY.fullmatch(key):
            shown_key = shown(key) if isinstance(key, str) else described(key)
            raise DecodeError(
                path,
                f"key {shown_key} is neither a device index (0, 1, ...) "
                "nor a GPU or MIG UUID (GPU-<uuid>, MIG-<uuid>, lowercase)",
            )
        try:
            limits[key] = int(ByteQuantity(quantity))
        except ValueError as error:
            raise DecodeError(f"{path}[{shown(key)}]", str(error)) from None
    return limits


def _mps(written: _MpsFile, path: str) -> MpsSettings:
    percentage = written.default_active_thread_percentage
    limit = written.default_pinned_device_memory_limit
    return MpsSettings(
        default_active_thread_percentage=None
        if isinstance(percentage, msgspec.UnsetType)
        else int(percentage),
        default_pinned_device_memory_limit=None if isinstance(limit, msgspec.UnsetType) else int(limit),
        default_per_device_pinned_memory_limit=_per_device_limits(
            written.default_per_device_pinned_memory_limit, join(path, "defaultPerDevicePinnedMemoryLimit")
        ),
    )


def decode_sharing(
    written: SharingFile | msgspec.UnsetType, path: str, kind: str, refused: Mapping[str, str]
) -> Sharing:
    """`refused` maps the settings a device type cannot honour to the reason, shown to the user.

    A strategy may be refused under its own name ("MPS") and a settings block under its field
    name ("timeSlicing", "mps").
    """
    if isinstance(written, msgspec.UnsetType):
        return Sharing()
    strategy = written.strategy
    if strategy in refused:
        allowed = [name for name in _STRATEGIES if name not in refused]
        raise DecodeError(
            join(path, "strategy"),
            f"{strategy} is not supported for a {kind} (allowed: {listed(allowed)}): {refused[strategy]}",
        )
    blocks = {"timeSlicing": written.time_slicing, "mps": written.mps}
    given = [name for name, block in blocks.items() if not isinstance(block, msgspec.UnsetType)]
    for name in given:
        if name in refused:
            raise DecodeError(join(path, name), f"not supported for a {kind}: {refused[name]}")
    if strategy == "TimeSlicing":
        if "mps" in given:
            raise DecodeError(join(path, "mps"), "only allowed with strategy MPS (strategy is TimeSlicing)")
        time_slicing = written.time_slicing
        return Sharing(
            "TimeSlicing",
            TimeSlicingSettings() if isinstance(time_slicing, msgspec.UnsetType) else time_slicing,
            None,
        )
    if "timeSlicing" in given:
        raise DecodeError(
            join(path, "timeSlicing"), "only allowed with strategy TimeSlicing (strategy is MPS)"
        )
    mps = _MpsFile() if isinstance(written.mps, msgspec.UnsetType) else written.mps
    return Sharing("MPS", None, _mps(mps, join(path, "mps")))
