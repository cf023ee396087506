"""The opaque device configuration API (resource.dra-driver.dev/v1alpha1) and its precedence rules.

Users put these objects in a DeviceClass's `spec.config[].opaque.parameters` or a ResourceClaim's
`spec.devices.config[].opaque.parameters`; the scheduler copies them, unread, into the claim's
`status.allocation.devices.config[]`. Nothing in Kubernetes checks them, so this module is the
only gate: decoding is strict (an unknown field or a typo is an error, never silently ignored,
because an ignored `sharing` block means a user gets a GPU shared differently than they asked)
and every error names the field path and what would have been accepted.

Each kind's format is declared once, as a Struct (`api_format`: its API names, types, ranges
and defaults); `typed` decodes it, the rules across fields are checked on the decoded Struct, and
the test that keeps `api/resource.dra-driver.dev/v1alpha1/configs.schema.json` in step reads the
same Struct, so a new field is a line in the format, one in its kind, plus the schema.

Everything here is pure: raw JSON-like values in, frozen values or OpaqueConfigError out.

How the claim engine uses it, per claim: the entries come decoded with the claim
(`ResourceClaimView.config`, claim_object.py), then per allocated device
`effective_config(entries, driver_name, device.request, inventory_device.type)`.
"""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import msgspec

from dra_driver.base.strict_decode import DecodeError, JsonInteger, described, shown
from dra_driver.base.typed_decode import typed
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.opaque_sharing import (
    MpsSettings,
    Sharing,
    SharingFile,
    SharingStrategy,
    TimeSlicingSettings,
    decode_sharing,
)
from dra_driver.devices.model import DeviceType
from dra_driver.hardware.model import TimeSliceInterval

# The sharing types are part of this API; they live in opaque_sharing and are named here too.
__all__ = [
    "API_VERSION",
    "KINDS",
    "ConfigEntry",
    "ConfigSource",
    "CoreLimitPolicy",
    "DeviceConfig",
    "GpuConfig",
    "MigDeviceConfig",
    "MpsSettings",
    "OpaqueConfigError",
    "Sharing",
    "SharingStrategy",
    "TimeSliceInterval",
    "TimeSlicingSettings",
    "VgpuConfig",
    "api_format",
    "decode_parameters",
    "effective_config",
    "hami_core_environment",
]

API_VERSION = "resource.dra-driver.dev/v1alpha1"

CoreLimitPolicy = Literal["Default", "Force", "Disable"]
ConfigSource = Literal["FromClass", "FromClaim"]


class TaskPriority(JsonInteger):
    """HAMi's task priorities: 0 = high, 1 = low."""

    minimum, maximum = 0, 1


class OpaqueConfigError(ClaimRejected):
    """A configuration object is malformed or does not fit the device it applies to.

    A ClaimRejected, so the engine reports it as that claim's error without further handling.
    """

    metric_reason = "config"


# --- The kinds, as users write them and as the engine reads them --------------------------------


class _Header(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """apiVersion and kind, checked by hand before the rest is decoded: they pick the format."""

    api_version: str
    kind: str


class _ConfigFile(_Header, frozen=True):
    """GpuConfig and MigDeviceConfig as written; every kind has their fields."""

    sharing: SharingFile | msgspec.UnsetType = msgspec.UNSET


class _VgpuFile(_ConfigFile, frozen=True):
    """VgpuConfig as written."""

    memory_oversubscription: bool = False
    core_limit_policy: CoreLimitPolicy = "Default"
    task_priority: TaskPriority = TaskPriority(1)
    oom_killer: bool = False


_MIG_REFUSED = {
    "timeSlicing": "the time slice is a setting of the whole GPU, which every MIG device on it shares"
}
_VGPU_REFUSED = {
    "MPS": "MPS changes the compute mode of the whole GPU, which other claims share",
    "mps": "MPS changes the compute mode of the whole GPU, which other claims share",
    "timeSlicing": "the time slice is a setting of the whole GPU, which other claims share",
}


class GpuConfig(msgspec.Struct, frozen=True):
    """For a whole GPU (device type `gpu`)."""

    sharing: Sharing = msgspec.field(default_factory=Sharing)


class MigDeviceConfig(msgspec.Struct, frozen=True):
    """For a MIG device (type `mig`). Its time-slicing interval is always `Default`: the time
    slice is a setting of the physical GPU, which the other MIG devices on it share."""

    sharing: Sharing = msgspec.field(default_factory=Sharing)


class VgpuConfig(msgspec.Struct, frozen=True):
    """For a vGPU (type `vgpu`): HAMi-core's knobs, see `hami_core_environment`.

    Sharing is always time-slicing with the GPU's own interval: the physical GPU also serves
    other claims, so one claim may change neither its time slice nor its compute mode (MPS).
    """

    sharing: Sharing = msgspec.field(default_factory=Sharing)
    memory_oversubscription: bool = False
    core_limit_policy: CoreLimitPolicy = "Default"
    # HAMi's convention: 0 = high priority, 1 = low (HAMi-core's own default when unset).
    task_priority: int = 1
    oom_killer: bool = False


DeviceConfig = GpuConfig | MigDeviceConfig | VgpuConfig

# Class names are the API's kind names.
KINDS: Mapping[str, type[DeviceConfig]] = {
    kind.__name__: kind for kind in (GpuConfig, MigDeviceConfig, VgpuConfig)
}
# Each kind's format, and what its sharing block is called and may not hold.
_FORMATS: Mapping[type[DeviceConfig], type[_ConfigFile]] = {
    GpuConfig: _ConfigFile,
    MigDeviceConfig: _ConfigFile,
    VgpuConfig: _VgpuFile,
}
_SHARING_RULES: Mapping[type[DeviceConfig], tuple[str, Mapping[str, str]]] = {
    GpuConfig: ("GPU", {}),
    MigDeviceConfig: ("MIG device", _MIG_REFUSED),
    VgpuConfig: ("vGPU", _VGPU_REFUSED),
}
# The kind that fits each device type. A type with no kind of its own (a mode's, as a GPU given to
# a VM) takes GpuConfig's, which its origin may refuse but for the defaults (origins.refuses_config).
_FITTING_KIND: Mapping[DeviceType, type[DeviceConfig]] = {
    "gpu": GpuConfig,
    "mig": MigDeviceConfig,
    "vgpu": VgpuConfig,
}


if TYPE_CHECKING:
    _KindName = str
else:
    # The kinds as a Literal, which msgspec checks and typed_decode names in order; mypy builds
    # no Literal from a tuple it cannot see, so to it a kind is a string.
    _KindName = Literal[tuple(KINDS)]


class _KindOnly(msgspec.Struct, frozen=True):
    """The field that picks the format, read before the format is known."""

    kind: _KindName


def api_format(kind: type[DeviceConfig]) -> type[msgspec.Struct]:
    """The Struct a kind is decoded from: its API fields, types, ranges and defaults, which the
    test keeping configs.schema.json in step compares."""
    return _FORMATS[kind]


def hami_core_environment(config: VgpuConfig) -> dict[str, str]:
    """The environment that makes HAMi-core (libvgpu.so) behave as `config` says.

    Every variable is always set: HAMi-core's defaults differ from this API's (an unset
    ACTIVE_OOM_KILLER means "on"), so leaving one out would let the library decide.
    """
    return {
        "CUDA_OVERSUBSCRIBE": "true" if config.memory_oversubscription else "false",
        "GPU_CORE_UTILIZATION_POLICY": config.core_limit_policy.lower(),
        "CUDA_TASK_PRIORITY": str(config.task_priority),
        "ACTIVE_OOM_KILLER": "true" if config.oom_killer else "false",
    }


def _decode_kind(kind: type[DeviceConfig], parameters: Mapping[str, object]) -> DeviceConfig:
    written = typed(parameters, _FORMATS[kind])
    sharing = decode_sharing(written.sharing, "sharing", *_SHARING_RULES[kind])
    if not isinstance(written, _VgpuFile):
        return kind(sharing)
    return VgpuConfig(
        sharing=sharing,
        memory_oversubscription=written.memory_oversubscription,
        core_limit_policy=written.core_limit_policy,
        task_priority=int(written.task_priority),
        oom_killer=written.oom_killer,
    )


def _opaque_error(error: DecodeError) -> OpaqueConfigError:
    """The document's root is the `parameters` object."""
    return OpaqueConfigError(f"{error.path or 'parameters'}: {error.problem}")


def decode_parameters(parameters: object) -> DeviceConfig:
    """One `opaque.parameters` object as a typed config with every default filled in.

    Raises OpaqueConfigError naming the field path (e.g. `sharing.mps.defaultActiveThreadPercentage`)
    and the accepted values; any JSON-like input either decodes or raises that error.
    """
    if not isinstance(parameters, Mapping):
        raise OpaqueConfigError(f"parameters: expected an object, got {described(parameters)}")
    if "apiVersion" not in parameters:
        raise OpaqueConfigError(f"apiVersion: required; this driver's configs are {API_VERSION}")
    api_version = parameters["apiVersion"]
    if api_version != API_VERSION:
        shown_version = shown(api_version) if isinstance(api_version, str) else described(api_version)
        raise OpaqueConfigError(
            f"apiVersion: {shown_version} is not supported; this driver reads {API_VERSION}"
        )
    try:
        return _decode_kind(KINDS[typed(parameters, _KindOnly).kind], parameters)
    except DecodeError as error:
        raise _opaque_error(error) from error


# --- Which config applies to an allocated device ------------------------------------------------


class ConfigEntry(msgspec.Struct, frozen=True):
    """One `status.allocation.devices.config[]` entry, structure checked, parameters still raw.

    Parameters stay undecoded here because entries for other drivers are none of our business,
    and ours are decoded only where they apply, with `position` to say which entry was bad.
    """

    position: int
    source: ConfigSource
    requests: tuple[str, ...]
    driver: str
    parameters: object

    @property
    def label(self) -> str:
        return f"status.allocation.devices.config[{self.position}] ({self.source})"

    def applies_to(self, request: str) -> bool:
        """Empty `requests` means every request; a `req/sub` result also matches its parent `req`."""
        return not self.requests or request in self.requests or request.split("/", 1)[0] in self.requests


def effective_config(
    entries: Sequence[ConfigEntry], driver_name: str, request: str, device_type: DeviceType
) -> DeviceConfig:
    """The config in force for one allocation result (`request` is `req` or `req/sub`).

    DeviceClass entries come before claim entries (in their given order within each source), and
    the last entry that applies wins outright: whole-object replacement, not a field-by-field
    merge. NVIDIA's driver does the same, and it keeps the outcome readable from the claim alone:
    what is in force is one object a user wrote, never a blend of a class's and a claim's.
    Every applicable entry is decoded, so a broken one is reported even where a later one wins;
    only the winner must be of the kind that fits `device_type`. With none, the kind's defaults.
    """
    ordered = sorted(entries, key=lambda entry: entry.source != "FromClass")
    winner: tuple[ConfigEntry, DeviceConfig] | None = None
    for entry in ordered:
        if entry.driver != driver_name or not entry.applies_to(request):
            continue
        try:
            winner = (entry, decode_parameters(entry.parameters))
        except OpaqueConfigError as error:
            raise OpaqueConfigError(f"{entry.label}: {error}") from error
    fitting = _FITTING_KIND.get(device_type, GpuConfig)
    if winner is None:
        return fitting()
    entry, config = winner
    if not isinstance(config, fitting):
        fits = ", ".join(f"{kind_type} → {kind.__name__}" for kind_type, kind in _FITTING_KIND.items())
        raise OpaqueConfigError(
            f"{entry.label}: a {type(config).__name__} does not fit request {shown(request)}, "
            f"which was allocated a {device_type} device; it takes a {fitting.__name__} ({fits})"
        )
    return config
