"""The `sharing` block of the opaque configs: how processes share one allocated device.

Its own module because its fields have rules across each other (a strategy, and the settings
block of that strategy only), which a one-line field declaration cannot carry; the kinds in
opaque_config declare `sharing` as one field decoded here. Raises DecodeError; opaque_config
turns that into the claim's error.
"""

import re
from collections.abc import Mapping
from typing import Literal

import msgspec

from dra_driver.base.strict_decode import (
    DecodeError,
    byte_quantity,
    choice,
    described,
    integer,
    join,
    listed,
    literal_options,
    mapping,
    shown,
)
from dra_driver.hardware.model import TimeSliceInterval

SharingStrategy = Literal["TimeSlicing", "MPS"]


class TimeSlicingSettings(msgspec.Struct, frozen=True):
    """`Default` leaves the GPU's time-slice setting alone; the others pick a fixed length."""

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
_STRATEGIES: Mapping[str, SharingStrategy] = literal_options(SharingStrategy)
_SHARING_FIELDS = ("strategy", "timeSlicing", "mps")
_MPS_FIELDS = (
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
)


def _time_slicing(raw: object, path: str) -> TimeSlicingSettings:
    settings = mapping(raw, path, ("interval",))
    if "interval" not in settings:
        return TimeSlicingSettings()
    return TimeSlicingSettings(
        choice(settings["interval"], join(path, "interval"), literal_options(TimeSliceInterval))
    )


def _per_device_limits(raw: object, path: str) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        raise DecodeError(
            path, f"expected an object of device index or UUID to quantity, got {described(raw)}"
        )
    limits: dict[str, int] = {}
    for key, quantity in raw.items():
        if not isinstance(key, str) or not _DEVICE_KEY.fullmatch(key):
            shown_key = shown(key) if isinstance(key, str) else described(key)
            raise DecodeError(
                path,
                f"key {shown_key} is neither a device index (0, 1, ...) "
                "nor a GPU or MIG UUID (GPU-<uuid>, MIG-<uuid>, lowercase)",
            )
        limits[key] = byte_quantity(quantity, f"{path}[{shown(key)}]")
    return limits


def _mps(raw: object, path: str) -> MpsSettings:
    settings = mapping(raw, path, _MPS_FIELDS)
    percentage, limit, per_device = (join(path, name) for name in _MPS_FIELDS)
    return MpsSettings(
        default_active_thread_percentage=(
            integer(settings[_MPS_FIELDS[0]], percentage, 1, 100, json_number=True)
            if _MPS_FIELDS[0] in settings
            else None
        ),
        default_pinned_device_memory_limit=(
            byte_quantity(settings[_MPS_FIELDS[1]], limit) if _MPS_FIELDS[1] in settings else None
        ),
        default_per_device_pinned_memory_limit=_per_device_limits(
            settings.get(_MPS_FIELDS[2], {}), per_device
        ),
    )


def decode_sharing(raw: object, path: str, kind: str, refused: Mapping[str, str]) -> Sharing:
    """`refused` maps the settings a device type cannot honour to the reason, shown to the user.

    A strategy may be refused under its own name ("MPS") and a settings block under its field
    name ("timeSlicing", "mps").
    """
    sharing = mapping(raw, path, _SHARING_FIELDS)
    strategy_path = join(path, "strategy")
    if "strategy" not in sharing:
        raise DecodeError(strategy_path, f"required (one of {listed(list(_STRATEGIES))})")
    strategy = choice(sharing["strategy"], strategy_path, _STRATEGIES)
    if strategy in refused:
        allowed = [name for name in _STRATEGIES if name not in refused]
        raise DecodeError(
            strategy_path,
            f"{strategy} is not supported for a {kind} (allowed: {listed(allowed)}): {refused[strategy]}",
        )
    for name in ("timeSlicing", "mps"):
        if name in sharing and name in refused:
            raise DecodeError(join(path, name), f"not supported for a {kind}: {refused[name]}")
    if strategy == "TimeSlicing":
        if "mps" in sharing:
            raise DecodeError(join(path, "mps"), "only allowed with strategy MPS (strategy is TimeSlicing)")
        time_slicing = sharing.get("timeSlicing", {})
        return Sharing("TimeSlicing", _time_slicing(time_slicing, join(path, "timeSlicing")), None)
    if "timeSlicing" in sharing:
        raise DecodeError(
            join(path, "timeSlicing"), "only allowed with strategy TimeSlicing (strategy is MPS)"
        )
    return Sharing("MPS", None, _mps(sharing.get("mps", {}), join(path, "mps")))
