"""What the stand-in API server (apiserver.py) does with a body before and beyond its OpenAPI
schema, as the real kube-apiserver does it. Each rule here was a difference that
tests/e2e/test_stand_in_api_server.py found between the two:

- Unknown fields follow the request's `fieldValidation`: `Strict` refuses the object with 400
  BadRequest ("strict decoding error"), `Warn` (also what a request without the parameter gets)
  drops the fields and answers with a `Warning` header, `Ignore` drops them silently.
- A quantity that does not parse is a decoding error: 400 BadRequest, not 422.
- ResourceSlice rules of the real validation that a schema cannot say: at most 128 devices (64
  once a device consumes counters or has taints), device names DNS labels and unique, and each
  attribute exactly one value.
- Claim request names are DNS labels.
- An Invalid answer names the field in `details.causes`, as clients and kubectl read it.
"""

import contextvars
import re
from collections.abc import Iterator
from typing import Any

import kubernetes_validate

from dra_driver.kube.k8s_names import dns_label_problem
from tests.support.cel import parse_quantity

Obj = dict[str, Any]

FIELD_VALIDATIONS = ("Strict", "Warn", "Ignore")
MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS_OR_TAINTS = 64
_UNEXPECTED = re.compile(r"'([^']+)' (?:was|were) unexpected")
_BOUNDED_DROPS = 100

# The warnings of the request being served, for its Warning headers, and its fieldValidation
# (set by the server's middleware around each request).
warnings: contextvars.ContextVar[list[str]] = contextvars.ContextVar("warnings")
field_validation: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "field_validation", default=None
)


class DecodeError(ValueError):
    """The body does not decode: the real server answers 400 BadRequest."""


class InvalidField(ValueError):
    """A rule of the real validation: the real server answers 422 Invalid naming `field`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def causes(detail: str) -> list[Obj]:
    """`details.causes` of an Invalid answer whose message is `<field>: <what is wrong>`."""
    field, separator, message = detail.partition(": ")
    if not separator or " " in field:
        return []
    return [{"reason": "FieldValueInvalid", "message": message, "field": field}]


def _shown(path: Iterator[Any] | list[Any]) -> str:
    """A schema error's path as the API server writes field paths: `spec.devices[0].name`."""
    shown = ""
    for part in path:
        shown += f"[{part}]" if isinstance(part, int) else (f".{part}" if shown else str(part))
    return shown


def drop_unknown_fields(obj: Obj, schema_version: str, field_validation: str | None) -> None:
    """Takes the fields its schema does not declare out of `obj`, as `field_validation` says to
    treat them (see the module docstring); warnings go to `warnings`."""
    mode = field_validation or "Warn"
    if mode not in FIELD_VALIDATIONS:
        raise DecodeError(
            f'fieldValidation: Unsupported value: "{mode}": supported values: "Ignore", "Strict", "Warn"'
        )
    unknown = []
    for _ in range(_BOUNDED_DROPS):
        try:
            kubernetes_validate.validate(obj, schema_version, strict=True)
            break
        except kubernetes_validate.ValidationError as error:
            names = _UNEXPECTED.findall(error.message)
            if error.validator != "additionalProperties" or not names:
                break  # not an unknown field: the schema check that follows reports it
            parent: Any = obj
            for part in error.path:
                parent = parent[part]
            for name in names:
                parent.pop(name, None)
                unknown.append(_shown([*error.path, name]))
    if unknown and mode == "Strict":
        raise DecodeError(
            "strict decoding error: " + ", ".join(f'unknown field "{path}"' for path in unknown)
        )
    if mode == "Warn":
        current = warnings.get(None)
        if current is not None:
            current += [f'unknown field "{path}"' for path in unknown]


def _quantities(kind: str, obj: Obj) -> Iterator[tuple[str, Any]]:
    """(path, value) of every quantity of a ResourceSlice or a ResourceClaim."""
    spec = obj.get("spec") or {}
    if kind == "ResourceSlice":
        for i, device in enumerate(spec.get("devices") or []):
            for name, capacity in (device.get("capacity") or {}).items():
                base = f"spec.devices[{i}].capacity[{name}]"
                yield f"{base}.value", capacity.get("value")
                policy = capacity.get("requestPolicy") or {}
                if "default" in policy:
                    yield f"{base}.requestPolicy.default", policy["default"]
                for key, value in (policy.get("validRange") or {}).items():
                    yield f"{base}.requestPolicy.validRange.{key}", value
                for j, value in enumerate(policy.get("validValues") or []):
                    yield f"{base}.requestPolicy.validValues[{j}]", value
            for j, consumption in enumerate(device.get("consumesCounters") or []):
                for name, counter in (consumption.get("counters") or {}).items():
                    yield (
                        f"spec.devices[{i}].consumesCounters[{j}].counters[{name}].value",
                        counter.get("value"),
                    )
        for i, counter_set in enumerate(spec.get("sharedCounters") or []):
            for name, counter in (counter_set.get("counters") or {}).items():
                yield f"spec.sharedCounters[{i}].counters[{name}].value", counter.get("value")
    if kind == "ResourceClaim":
        for i, request in enumerate((spec.get("devices") or {}).get("requests") or []):
            alternatives = [("exactly", request.get("exactly"))] + [
                (f"firstAvailable[{j}]", sub) for j, sub in enumerate(request.get("firstAvailable") or [])
            ]
            for where, alternative in alternatives:
                for name, value in ((alternative or {}).get("capacity") or {}).get("requests", {}).items():
                    yield f"spec.devices.requests[{i}].{where}.capacity.requests[{name}]", value


def check_quantities(kind: str, obj: Obj) -> None:
    for path, value in _quantities(kind, obj):
        try:
            parse_quantity(str(value))
        except ValueError:
            raise DecodeError(
                f"{path}: quantities must match the regular expression "
                "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            ) from None


# The minor from which a duplicate device is named by its entry (`spec.devices[1]`) rather than
# its name field (`spec.devices[1].name`): 1.34.4 and 1.37.2 were compared, 1.35 and 1.36 not.
DUPLICATE_NAMED_BY_ENTRY = 37


def _check_dns_label(field: str, name: str) -> None:
    if problem := dns_label_problem(name):
        raise InvalidField(field, f'Invalid value: "{name}": {problem}')


def check_slice_devices(spec: Obj, minor: int) -> None:
    """ValidateResourceSliceSpec's device rules that valid JSON can break."""
    devices = spec.get("devices") or []
    limited = any(device.get("consumesCounters") or device.get("taints") for device in devices)
    limit = MAX_DEVICES_WITH_COUNTERS_OR_TAINTS if limited else MAX_DEVICES
    if len(devices) > limit:
        raise InvalidField("spec.devices", f"Too many: {len(devices)}: must have at most {limit} items")
    seen: set[str] = set()
    for i, device in enumerate(devices):
        name = device.get("name", "")
        _check_dns_label(f"spec.devices[{i}].name", name)
        if name in seen:
            field = f"spec.devices[{i}]" if minor >= DUPLICATE_NAMED_BY_ENTRY else f"spec.devices[{i}].name"
            raise InvalidField(field, f'Duplicate value: "{name}"')
        seen.add(name)
        for attribute, value in (device.get("attributes") or {}).items():
            if len(value) != 1:
                raise InvalidField(
                    f"spec.devices[{i}].attributes[{attribute}]",
                    "Invalid value: exactly one value must be specified",
                )


def check_claim_requests(devices: Obj, path: str) -> None:
    """Request and subrequest names are DNS labels (`path`: where the claim spec's devices are)."""
    for i, request in enumerate(devices.get("requests") or []):
        named = [(f"{path}.requests[{i}].name", request.get("name", ""))] + [
            (f"{path}.requests[{i}].firstAvailable[{j}].name", sub.get("name", ""))
            for j, sub in enumerate(request.get("firstAvailable") or [])
        ]
        for field, name in named:
            _check_dns_label(field, name)
