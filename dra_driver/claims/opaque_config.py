"""The opaque device configuration API (resource.dra-driver.dev/v1alpha1) and its precedence rules.

Users put these objects in a DeviceClass's `spec.config[].opaque.parameters` or a ResourceClaim's
`spec.devices.config[].opaque.parameters`; the scheduler copies them, unread, into the claim's
`status.allocation.devices.config[]`. Nothing in Kubernetes checks them, so this module is the
only gate: decoding is strict (an unknown field or a typo is an error, never silently ignored,
because an ignored `sharing` block means a user gets a GPU shared differently than they asked)
and every error names the field path and what would have been accepted.

Everything here is pure: raw JSON-like values in, frozen dataclasses or OpaqueConfigError out.
`api/resource.dra-driver.dev/v1alpha1/configs.schema.json` describes the same objects for
editors and admission tooling; tests/unit/test_opaque_config.py keeps the two in agreement.

How the claim engine uses it, per claim: `entries = config_entries(claim)` next to
`allocated_devices(...)`, then per allocated device
`effective_config(entries, driver_name, device.request, inventory_device.type)`.
"""

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from dra_driver.claims.allocation import ClaimRejected
from dra_driver.devices.model import QUANTITY_FACTORS, DeviceType
from dra_driver.hardware.model import TimeSliceInterval

API_VERSION = "resource.dra-driver.dev/v1alpha1"

SharingStrategy = Literal["TimeSlicing", "MPS"]
CoreLimitPolicy = Literal["Default", "Force", "Disable"]
ConfigSource = Literal["FromClass", "FromClaim"]


class OpaqueConfigError(ClaimRejected):
    """A configuration object is malformed or does not fit the device it applies to.

    A ClaimRejected, so the engine reports it as that claim's error without further handling.
    """

    metric_reason = "config"


# --- The API's types, with defaults filled in --------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimeSlicingSettings:
    """`Default` leaves the GPU's time-slice setting alone; the others pick a fixed length."""

    interval: TimeSliceInterval = "Default"


@dataclass(frozen=True, slots=True)
class MpsSettings:
    """Limits for the claim's MPS control daemon; None and an empty mapping mean "no limit"."""

    default_active_thread_percentage: int | None = None
    # Bytes. Keys of the per-device mapping are a device index within the claim or a GPU/MIG UUID.
    default_pinned_device_memory_limit: int | None = None
    default_per_device_pinned_memory_limit: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sharing:
    """How the processes using one allocated device share it.

    Exactly one of `time_slicing` and `mps` is set, the one that matches `strategy`, so a
    consumer never has to guess which settings are in force.
    """

    strategy: SharingStrategy = "TimeSlicing"
    time_slicing: TimeSlicingSettings | None = field(default_factory=TimeSlicingSettings)
    mps: MpsSettings | None = None


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """For a whole GPU (device type `gpu`)."""

    sharing: Sharing = field(default_factory=Sharing)


@dataclass(frozen=True, slots=True)
class MigDeviceConfig:
    """For a MIG device (type `mig`). Its time-slicing interval is always `Default`: the time
    slice is a setting of the physical GPU, which the other MIG devices on it share."""

    sharing: Sharing = field(default_factory=Sharing)


@dataclass(frozen=True, slots=True)
class VgpuConfig:
    """For a vGPU (type `vgpu`): HAMi-core's knobs, see `hami_core_environment`.

    Sharing is always time-slicing with the GPU's own interval: the physical GPU also serves
    other claims, so one claim may change neither its time slice nor its compute mode (MPS).
    """

    sharing: Sharing = field(default_factory=Sharing)
    memory_oversubscription: bool = False
    core_limit_policy: CoreLimitPolicy = "Default"
    # HAMi's convention: 0 = high priority, 1 = low (HAMi-core's own default when unset).
    task_priority: int = 1
    oom_killer: bool = False


DeviceConfig = GpuConfig | MigDeviceConfig | VgpuConfig

# The kind that fits each device type. Class names are the API's kind names.
_FITTING_KIND: Mapping[DeviceType, type[DeviceConfig]] = {
    "gpu": GpuConfig,
    "mig": MigDeviceConfig,
    "vgpu": VgpuConfig,
}


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


# --- Reading JSON values strictly ---------------------------------------------------------------

_SHOWN_MAX = 80
_T = TypeVar("_T")


def _shown(text: str) -> str:
    """A string as JSON text, cut short: parameters come from users and may be kilobytes long."""
    if len(text) <= _SHOWN_MAX:
        return json.dumps(text)
    return json.dumps(text[:_SHOWN_MAX]) + f"... ({len(text)} characters)"


_HUGE_INTEGER = "a number of more than 77 digits"


def _integer_text(value: int) -> str:
    """Python refuses to print integers of thousands of digits; YAML can still produce them."""
    return str(value) if value.bit_length() <= 256 else _HUGE_INTEGER


def _described(value: object) -> str:
    """What the user wrote, in JSON terms; containers by kind only (they may be deeply nested)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"the string {_shown(value)}"
    if isinstance(value, int):
        text = _integer_text(value)
        return f"the integer {text}" if text != _HUGE_INTEGER else text
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def _join(path: str, key: str) -> str:
    """A field path; a key that would garble the message is shown quoted and cut short."""
    name = key if len(key) <= _SHOWN_MAX and key.isprintable() else _shown(key)
    return f"{path}.{name}" if path else name


def _listed(options: Sequence[str]) -> str:
    return ", ".join(options)


def _object(value: object, path: str, allowed: Sequence[str]) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise OpaqueConfigError(f"{path}: expected an object, got {_described(value)}")
    for key in value:
        if not isinstance(key, str):
            raise OpaqueConfigError(f"{path or 'parameters'}: field names are strings, got {_described(key)}")
        if key not in allowed:
            raise OpaqueConfigError(f"{_join(path, key)}: unknown field (allowed here: {_listed(allowed)})")
    return value


def _choice(value: object, path: str, options: Mapping[str, _T]) -> _T:
    if not isinstance(value, str):
        raise OpaqueConfigError(f"{path}: expected one of {_listed(list(options))}, got {_described(value)}")
    if value not in options:
        raise OpaqueConfigError(f"{path}: {_shown(value)} is not one of {_listed(list(options))}")
    return options[value]


def _integer(value: object, path: str, minimum: int, maximum: int) -> int:
    """JSON has one number type: 50.0 is the integer 50 (as JSON Schema agrees); true is not."""
    expected = f"an integer from {minimum} to {maximum}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpaqueConfigError(f"{path}: expected {expected}, got {_described(value)}")
    if not minimum <= value <= maximum:
        raise OpaqueConfigError(f"{path}: {_integer_text(value)} is out of range; expected {expected}")
    return value


def _boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise OpaqueConfigError(f"{path}: expected true or false, got {_described(value)}")
    return value


# Kubernetes quantity suffixes that name whole numbers of bytes. Fractions, exponents and the
# milli suffix are refused: a pinned-memory limit is a whole number of bytes.
_QUANTITY = re.compile(r"(?P<digits>[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
# Kubernetes quantities are int64 underneath; a limit beyond that is a typo, not a real GPU.
_MAX_BYTES = 2**63 - 1
_QUANTITY_FORM = (
    'a whole number of bytes with an optional suffix Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E, e.g. "10Gi"'
)


def memory_bytes(value: object, path: str) -> int:
    """A memory-limit quantity ("10Gi", "512M", "1073741824") as a positive number of bytes."""
    if not isinstance(value, str):
        raise OpaqueConfigError(
            f"{path}: expected a quantity string, {_QUANTITY_FORM}; got {_described(value)}"
        )
    match = _QUANTITY.fullmatch(value)
    if match is None:
        if value.startswith("-"):
            raise OpaqueConfigError(
                f"{path}: {_shown(value)} is negative; a memory limit must be more than zero"
            )
        if "." in value:
            raise OpaqueConfigError(
                f"{path}: {_shown(value)} has a fraction; write it in a smaller unit, e.g. 1536Mi for 1.5Gi"
            )
        raise OpaqueConfigError(f"{path}: {_shown(value)} is not {_QUANTITY_FORM}")
    digits = match["digits"].lstrip("0")
    if not digits:
        raise OpaqueConfigError(f"{path}: {_shown(value)} is zero; a memory limit must be more than zero")
    too_large = OpaqueConfigError(f"{path}: {_shown(value)} is more than {_MAX_BYTES} bytes (2^63 - 1)")
    # Counting digits first means a thousand-digit number costs nothing and never reaches
    # Python's limit on converting long digit strings.
    if len(digits) > len(str(_MAX_BYTES)):
        raise too_large
    total = int(digits) * QUANTITY_FACTORS[match["suffix"] or ""]
    if total > _MAX_BYTES:
        raise too_large
    return total


_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# A device index has at most three digits: no claim has a thousand devices.
_DEVICE_KEY = re.compile(rf"0|[1-9][0-9]{{0,2}}|GPU-{_UUID}|MIG-{_UUID}")


# --- Decoding the three kinds -------------------------------------------------------------------

_STRATEGIES: Mapping[str, SharingStrategy] = {"TimeSlicing": "TimeSlicing", "MPS": "MPS"}
_INTERVALS: Mapping[str, TimeSliceInterval] = {
    "Default": "Default",
    "Short": "Short",
    "Medium": "Medium",
    "Long": "Long",
}
_CORE_LIMIT_POLICIES: Mapping[str, CoreLimitPolicy] = {
    "Default": "Default",
    "Force": "Force",
    "Disable": "Disable",
}
_SHARING_FIELDS = ("strategy", "timeSlicing", "mps")
_MPS_FIELDS = (
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
)


def _time_slicing(raw: object, path: str) -> TimeSlicingSettings:
    settings = _object(raw, path, ("interval",))
    if "interval" not in settings:
        return TimeSlicingSettings()
    return TimeSlicingSettings(_choice(settings["interval"], _join(path, "interval"), _INTERVALS))


def _mps(raw: object, path: str) -> MpsSettings:
    settings = _object(raw, path, _MPS_FIELDS)
    percentage = settings.get("defaultActiveThreadPercentage")
    limit = settings.get("defaultPinnedDeviceMemoryLimit")
    per_device_path = _join(path, "defaultPerDevicePinnedMemoryLimit")
    per_device = settings.get("defaultPerDevicePinnedMemoryLimit", {})
    if not isinstance(per_device, Mapping):
        raise OpaqueConfigError(
            f"{per_device_path}: expected an object of device index or UUID to quantity, "
            f"got {_described(per_device)}"
        )
    limits: dict[str, int] = {}
    for key, quantity in per_device.items():
        if not isinstance(key, str) or not _DEVICE_KEY.fullmatch(key):
            shown_key = _shown(key) if isinstance(key, str) else _described(key)
            raise OpaqueConfigError(
                f"{per_device_path}: key {shown_key} is neither a device index (0, 1, ...) "
                "nor a GPU or MIG UUID (GPU-<uuid>, MIG-<uuid>, lowercase)"
            )
        limits[key] = memory_bytes(quantity, f"{per_device_path}[{_shown(key)}]")
    return MpsSettings(
        default_active_thread_percentage=(
            None
            if "defaultActiveThreadPercentage" not in settings
            else _integer(percentage, _join(path, "defaultActiveThreadPercentage"), 1, 100)
        ),
        default_pinned_device_memory_limit=(
            None
            if "defaultPinnedDeviceMemoryLimit" not in settings
            else memory_bytes(limit, _join(path, "defaultPinnedDeviceMemoryLimit"))
        ),
        default_per_device_pinned_memory_limit=limits,
    )


def _sharing(raw: object, path: str, kind: str, refused: Mapping[str, str]) -> Sharing:
    """`refused` maps the settings a device type cannot honour to the reason, shown to the user.

    A strategy may be refused under its own name ("MPS") and a settings block under its field
    name ("timeSlicing", "mps").
    """
    sharing = _object(raw, path, _SHARING_FIELDS)
    strategy_path = _join(path, "strategy")
    if "strategy" not in sharing:
        raise OpaqueConfigError(f"{strategy_path}: required (one of {_listed(list(_STRATEGIES))})")
    strategy = _choice(sharing["strategy"], strategy_path, _STRATEGIES)
    if strategy in refused:
        allowed = [name for name in _STRATEGIES if name not in refused]
        raise OpaqueConfigError(
            f"{strategy_path}: {strategy} is not supported for a {kind} (allowed: {_listed(allowed)}): "
            f"{refused[strategy]}"
        )
    for name in ("timeSlicing", "mps"):
        if name in sharing and name in refused:
            raise OpaqueConfigError(f"{_join(path, name)}: not supported for a {kind}: {refused[name]}")
    if strategy == "TimeSlicing":
        if "mps" in sharing:
            raise OpaqueConfigError(
                f"{_join(path, 'mps')}: only allowed with strategy MPS (strategy is TimeSlicing)"
            )
        time_slicing = sharing.get("timeSlicing", {})
        return Sharing("TimeSlicing", _time_slicing(time_slicing, _join(path, "timeSlicing")), None)
    if "timeSlicing" in sharing:
        raise OpaqueConfigError(
            f"{_join(path, 'timeSlicing')}: only allowed with strategy TimeSlicing (strategy is MPS)"
        )
    return Sharing("MPS", None, _mps(sharing.get("mps", {}), _join(path, "mps")))


def _gpu_config(parameters: Mapping[str, object]) -> GpuConfig:
    if "sharing" not in parameters:
        return GpuConfig()
    return GpuConfig(_sharing(parameters["sharing"], "sharing", "GPU", {}))


_MIG_REFUSED = {
    "timeSlicing": "the time slice is a setting of the whole GPU, which every MIG device on it shares"
}


def _mig_device_config(parameters: Mapping[str, object]) -> MigDeviceConfig:
    if "sharing" not in parameters:
        return MigDeviceConfig()
    return MigDeviceConfig(_sharing(parameters["sharing"], "sharing", "MIG device", _MIG_REFUSED))


_VGPU_REFUSED = {
    "MPS": "MPS changes the compute mode of the whole GPU, which other claims share",
    "mps": "MPS changes the compute mode of the whole GPU, which other claims share",
    "timeSlicing": "the time slice is a setting of the whole GPU, which other claims share",
}


def _vgpu_config(parameters: Mapping[str, object]) -> VgpuConfig:
    defaults = VgpuConfig()
    return VgpuConfig(
        sharing=(
            _sharing(parameters["sharing"], "sharing", "vGPU", _VGPU_REFUSED)
            if "sharing" in parameters
            else defaults.sharing
        ),
        memory_oversubscription=(
            _boolean(parameters["memoryOversubscription"], "memoryOversubscription")
            if "memoryOversubscription" in parameters
            else defaults.memory_oversubscription
        ),
        core_limit_policy=(
            _choice(parameters["coreLimitPolicy"], "coreLimitPolicy", _CORE_LIMIT_POLICIES)
            if "coreLimitPolicy" in parameters
            else defaults.core_limit_policy
        ),
        task_priority=(
            _integer(parameters["taskPriority"], "taskPriority", 0, 1)
            if "taskPriority" in parameters
            else defaults.task_priority
        ),
        oom_killer=(
            _boolean(parameters["oomKiller"], "oomKiller")
            if "oomKiller" in parameters
            else defaults.oom_killer
        ),
    )


_KINDS: Mapping[str, tuple[tuple[str, ...], Callable[[Mapping[str, object]], DeviceConfig]]] = {
    "GpuConfig": (("sharing",), _gpu_config),
    "MigDeviceConfig": (("sharing",), _mig_device_config),
    "VgpuConfig": (
        ("sharing", "memoryOversubscription", "coreLimitPolicy", "taskPriority", "oomKiller"),
        _vgpu_config,
    ),
}


def decode_parameters(parameters: object) -> DeviceConfig:
    """One `opaque.parameters` object as a typed config with every default filled in.

    Raises OpaqueConfigError naming the field path (e.g. `sharing.mps.defaultActiveThreadPercentage`)
    and the accepted values; any JSON-like input either decodes or raises that error.
    """
    if not isinstance(parameters, Mapping):
        raise OpaqueConfigError(f"parameters: expected an object, got {_described(parameters)}")
    if "apiVersion" not in parameters:
        raise OpaqueConfigError(f"apiVersion: required; this driver's configs are {API_VERSION}")
    api_version = parameters["apiVersion"]
    if api_version != API_VERSION:
        shown = _shown(api_version) if isinstance(api_version, str) else _described(api_version)
        raise OpaqueConfigError(f"apiVersion: {shown} is not supported; this driver reads {API_VERSION}")
    if "kind" not in parameters:
        raise OpaqueConfigError(f"kind: required (one of {_listed(list(_KINDS))})")
    fields, decode = _KINDS[_choice(parameters["kind"], "kind", {kind: kind for kind in _KINDS})]
    return decode(_object(parameters, "", ("apiVersion", "kind", *fields)))


# --- Which config applies to an allocated device ------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConfigEntry:
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


_SOURCES: Mapping[str, ConfigSource] = {"FromClass": "FromClass", "FromClaim": "FromClaim"}


def config_entries(claim: object) -> tuple[ConfigEntry, ...]:
    """The opaque config entries of an allocated claim (the ResourceClaim as JSON), in order.

    Entries without `opaque` are skipped: that is the only kind of device configuration in
    resource.k8s.io/v1, and any future kind cannot name this driver's opaque parameters.
    """
    path = "status.allocation.devices.config"
    node: object = claim
    for key in ("status", "allocation", "devices"):
        node = node.get(key) if isinstance(node, Mapping) else None
    raw_entries = node.get("config") if isinstance(node, Mapping) else None
    if raw_entries is None:
        return ()
    if not isinstance(raw_entries, list):
        raise OpaqueConfigError(f"{path}: expected a list, got {_described(raw_entries)}")
    entries = []
    for position, raw in enumerate(raw_entries):
        where = f"{path}[{position}]"
        if not isinstance(raw, Mapping):
            raise OpaqueConfigError(f"{where}: expected an object, got {_described(raw)}")
        opaque = raw.get("opaque")
        if opaque is None:
            continue
        if not isinstance(opaque, Mapping):
            raise OpaqueConfigError(f"{where}.opaque: expected an object, got {_described(opaque)}")
        requests = raw.get("requests", [])
        if not isinstance(requests, list) or not all(isinstance(request, str) for request in requests):
            raise OpaqueConfigError(
                f"{where}.requests: expected a list of request names, got {_described(requests)}"
            )
        driver = opaque.get("driver")
        if not isinstance(driver, str):
            raise OpaqueConfigError(f"{where}.opaque.driver: expected a string, got {_described(driver)}")
        entries.append(
            ConfigEntry(
                position=position,
                source=_choice(raw.get("source"), f"{where}.source", _SOURCES),
                requests=tuple(requests),
                driver=driver,
                parameters=opaque.get("parameters"),
            )
        )
    return tuple(entries)


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
    fitting = _FITTING_KIND[device_type]
    if winner is None:
        return fitting()
    entry, config = winner
    if not isinstance(config, fitting):
        fits = ", ".join(f"{kind_type} → {kind.__name__}" for kind_type, kind in _FITTING_KIND.items())
        raise OpaqueConfigError(
            f"{entry.label}: a {type(config).__name__} does not fit request {_shown(request)}, "
            f"which was allocated a {device_type} device; it takes a {fitting.__name__} ({fits})"
        )
    return config
