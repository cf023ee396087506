"""Kubernetes DRA CEL device selectors, evaluated by a real CEL engine.

DeviceClass selectors and the selectors users write in claims are CEL. A wrong nesting or a
misspelt attribute shows only when the scheduler evaluates them in a live cluster, so the tests
evaluate them here with `cel-expr-python`, the Python binding of Google's C++ CEL
implementation: its parser, type checker and interpreter run the expression exactly as written.
Nothing is rewritten; what this module adds is the input and the Kubernetes function libraries.

How the pieces are represented, and why:

- `device` is declared as `map(string, dyn)` holding `driver`, `attributes`, `capacity` and
  `allowMultipleAllocations`. Kubernetes declares an object type (`kubernetes.DRADevice`), but
  cel-expr-python can declare object types only as protobuf messages, and protobuf has no map of
  maps of mixed values. The one consequence: a misspelt field such as `device.drivr` is a
  runtime error here where Kubernetes refuses it at compile time.
- `device.attributes` and `device.capacity` nest the way Kubernetes nests them: domain, then
  short name. Names without a domain belong to the driver's domain.
- `kubernetes.Quantity` and `kubernetes.Semver` are protobuf message types, built at import time
  in a private descriptor pool. cel-expr-python cannot carry opaque Python values (an abstract
  type is refused as unimplemented), but it does carry messages and dispatches member functions
  declared on message types, so the Kubernetes functions (`compareTo`, `add`, `major`, ...) are
  registered as overloads on those types and implemented in Python. Each message holds one
  canonical string (a quantity's value in nano units, a version without build metadata), which
  makes CEL's message equality the value equality Kubernetes has: `quantity("200M") ==
  quantity("0.2G")`. Quantities are parsed here with exact arithmetic, as the API server does.
- Kubernetes answers a lookup of an absent domain (`device.attributes["other.example.com"]`) with
  an empty map instead of an error, so that `"x" in device.attributes["d"]` is false on devices
  without that domain. cel-expr-python cannot give a map a default, so when an evaluation fails
  because a key containing a dot (a domain: attribute names never contain one) is missing, that
  domain is added to both maps as an empty map and the expression evaluated again.

Known differences from Kubernetes, each either loud (a compile error) or confined to unusual
expressions: `size()` or iteration over `device.attributes`/`device.capacity` also sees the
empty domains added for absent-domain lookups; an optional lookup of an absent domain
(`device.attributes[?"x.y"]`) is `optional.none()` here where Kubernetes answers
`optional.of({})`; only the libraries a device selector needs are present (quantity without
`asApproximateFloat`, `mul`, `div` and `divInt`; semver without the normalizing overloads;
strings, `cel.bind` and optionals), so anything else fails to compile; and no cost limit is
enforced. `sign` is a global function, `sign(q)`, because that is how Kubernetes declares it,
whatever its documentation says.

A runtime error is an exception (`CelEvaluationError`): Kubernetes lets a selector error abort
the allocation attempt, which is never what a selector's author intends, so tests must see it.
"""

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any

# cel-expr-python ships .pyi stubs but no py.typed marker, so mypy reads them only with a
# `follow_untyped_imports = true` override for "cel_expr_python.*" (this module passes with it).
from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message


class CelError(Exception):
    """A selector that Kubernetes would refuse or fail on."""


class CelCompileError(CelError):
    """The API server would refuse the object carrying this selector."""


class CelEvaluationError(CelError):
    """The scheduler would fail on this selector for this device."""


# --- Quantities -------------------------------------------------------------------------------

_NANO = 10**9
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DECIMAL_SUFFIXES = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_BINARY_SUFFIXES = {
    f"{letter}i": Fraction(2 ** (10 * power)) for power, letter in enumerate("KMGTPE", start=1)
}
_QUANTITY = re.compile(r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<suffix>.*)", re.DOTALL)
_EXPONENT = re.compile(r"[eE](?P<exponent>[+-]?[0-9]+)")
# Kubernetes accepts any int32 exponent; Python would spend minutes on 10**2000000000.
_MAX_EXPONENT = 1000


def parse_quantity(text: str) -> Fraction:
    """A Kubernetes quantity's exact value, rounded and capped the way the API server parses it.

    The API server keeps at most nano precision and rounds the magnitude up to it (a request for
    0.1n of something gets 1n rather than nothing), and caps binary-suffixed values at 2**63-1.
    """
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a quantity: expected a number with an optional suffix, like 1.5Gi, 100m or 1e3"
        )
    suffix = match["suffix"]
    binary = suffix in _BINARY_SUFFIXES
    if binary:
        factor = _BINARY_SUFFIXES[suffix]
    elif suffix in _DECIMAL_SUFFIXES:
        factor = _DECIMAL_SUFFIXES[suffix]
    elif exponent := _EXPONENT.fullmatch(suffix):
        if abs(int(exponent["exponent"])) > _MAX_EXPONENT:
            raise ValueError(f"{text!r}: exponents beyond ±{_MAX_EXPONENT} are not supported here")
        factor = Fraction(10) ** int(exponent["exponent"])
    else:
        raise ValueError(
            f"{text!r} has an unknown suffix {suffix!r}: expected one of n u m k M G T P E, "
            "Ki Mi Gi Ti Pi Ei, or an exponent like e3"
        )
    nanos = math.ceil(Fraction(match["number"]) * factor * _NANO)
    if binary:
        nanos = min(nanos, _INT64_MAX * _NANO)
    return Fraction(-nanos if match["sign"] == "-" else nanos, _NANO)


# --- Semantic versions ------------------------------------------------------------------------

_SEMVER = re.compile(
    r"(?P<major>0|[1-9][0-9]*)\.(?P<minor>0|[1-9][0-9]*)\.(?P<patch>0|[1-9][0-9]*)"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"
)


@dataclass(frozen=True, slots=True)
class _Semver:
    major: int
    minor: int
    patch: int
    pre_release: tuple[str, ...]

    @property
    def text(self) -> str:
        """Without build metadata, which semver precedence (and so equality) ignores."""
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.pre_release)}" if self.pre_release else core

    def precedence(self) -> tuple[Any, ...]:
        """Semver 2.0.0 ordering: a release ranks above its pre-releases; numeric identifiers
        compare as numbers and rank below alphanumeric ones; a longer prefix-equal list ranks higher."""
        identifiers = tuple(
            (0, int(part), "") if part.isdigit() else (1, 0, part) for part in self.pre_release
        )
        return (self.major, self.minor, self.patch, not self.pre_release, identifiers)


def _parse_semver(text: str) -> _Semver:
    """Strict semver 2.0.0, as Kubernetes parses `version` attributes and `semver()` arguments."""
    problem = f"{text!r} is not a semantic version like 1.2.3 or 1.2.3-rc.1"
    match = _SEMVER.fullmatch(text)
    if match is None:
        raise ValueError(problem)
    pre_release = tuple(match["pre"].split(".")) if match["pre"] else ()
    if any(part.isdigit() and len(part) > 1 and part[0] == "0" for part in pre_release):
        raise ValueError(problem)
    return _Semver(int(match["major"]), int(match["minor"]), int(match["patch"]), pre_release)


# --- The Kubernetes types as protobuf messages ------------------------------------------------

_CANONICAL = "canonical"


def _kubernetes_types() -> tuple[descriptor_pool.DescriptorPool, type[Message], type[Message]]:
    file = descriptor_pb2.FileDescriptorProto(
        name="tests/support/kubernetes_cel_types.proto", package="kubernetes", syntax="proto3"
    )
    for name in ("Quantity", "Semver"):
        file.message_type.add(name=name).field.add(
            name=_CANONICAL,
            number=1,
            type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return (
        pool,
        message_factory.GetMessageClass(pool.FindMessageTypeByName("kubernetes.Quantity")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("kubernetes.Semver")),
    )


_POOL, _QUANTITY_MESSAGE, _SEMVER_MESSAGE = _kubernetes_types()
_QUANTITY_TYPE = cel.Type("kubernetes.Quantity")
_SEMVER_TYPE = cel.Type("kubernetes.Semver")


def _canonical(message: Message) -> str:
    text: str = getattr(message, _CANONICAL)
    return text


def _quantity_message(value: Fraction) -> Message:
    nanos = value * _NANO
    assert nanos.denominator == 1, f"{value} is finer than the nano precision quantities keep"
    return _QUANTITY_MESSAGE(**{_CANONICAL: str(nanos.numerator)})


def _quantity_value(message: Message) -> Fraction:
    return Fraction(int(_canonical(message)), _NANO)


def _semver_message(text: str) -> Message:
    return _SEMVER_MESSAGE(**{_CANONICAL: _parse_semver(text).text})


def _semver_value(message: Message) -> _Semver:
    return _parse_semver(_canonical(message))


def _compare(left: Any, right: Any) -> int:
    return int(left > right) - int(left < right)


def _is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except ValueError:
        return False
    return True


def _is_semver(text: str) -> bool:
    try:
        _parse_semver(text)
    except ValueError:
        return False
    return True


def _as_integer(message: Message) -> int:
    value = _quantity_value(message)
    if value.denominator != 1 or not _INT64_MIN <= value.numerator <= _INT64_MAX:
        raise ValueError("cannot convert value to integer")
    return value.numerator


def _is_integer(message: Message) -> bool:
    value = _quantity_value(message)
    return value.denominator == 1 and _INT64_MIN <= value.numerator <= _INT64_MAX


def _ordering(left: Message, right: Message) -> int:
    """compareTo for two quantities or two semvers: -1, 0 or 1.

    The C++ runtime picks an implementation by argument kind, not type, and every message type is
    the same kind, so one implementation serves the quantity and the semver overloads. A dyn
    receiver (any attribute) can still bring a quantity and a semver together at runtime, which
    Kubernetes answers with "no matching overload".
    """
    types = left.DESCRIPTOR.full_name, right.DESCRIPTOR.full_name
    if types == ("kubernetes.Quantity", "kubernetes.Quantity"):
        return _compare(_quantity_value(left), _quantity_value(right))
    if types == ("kubernetes.Semver", "kubernetes.Semver"):
        return _compare(_semver_value(left).precedence(), _semver_value(right).precedence())
    raise TypeError(f"no matching overload for {types[0]} compared with {types[1]}")


def _member(
    overload_id: str, result: cel.Type, parameters: list[cel.Type], impl: Callable[..., Any] | None = None
) -> cel.Overload:
    """A receiver-style overload; without `impl` it is declared for the type checker only."""
    if impl is None:
        return cel.Overload(overload_id, return_type=result, parameters=parameters, is_member=True)
    return cel.Overload(overload_id, return_type=result, parameters=parameters, is_member=True, impl=impl)


def _global(
    overload_id: str, result: cel.Type, parameter: cel.Type, impl: Callable[[Any], Any]
) -> cel.Overload:
    return cel.Overload(overload_id, return_type=result, parameters=[parameter], is_member=False, impl=impl)


def _functions() -> list[cel.FunctionDecl]:
    """Kubernetes' quantity and semver libraries, with the overload IDs and call styles it uses."""
    q, s = _QUANTITY_TYPE, _SEMVER_TYPE
    string, integer, boolean = cel.Type.STRING, cel.Type.INT, cel.Type.BOOL
    qv, sv = _quantity_value, _semver_value
    overloads: dict[str, list[cel.Overload]] = {
        "quantity": [
            _global("string_to_quantity", q, string, lambda t: _quantity_message(parse_quantity(t)))
        ],
        "isQuantity": [_global("is_quantity_string", boolean, string, _is_quantity)],
        "sign": [_global("quantity_sign", integer, q, lambda a: _compare(qv(a), 0))],
        "asInteger": [_member("quantity_get_int", integer, [q], _as_integer)],
        "isInteger": [_member("quantity_is_integer", boolean, [q], _is_integer)],
        "add": [
            _member("quantity_add", q, [q, q], lambda a, b: _quantity_message(qv(a) + qv(b))),
            _member("quantity_add_int", q, [q, integer], lambda a, b: _quantity_message(qv(a) + b)),
        ],
        "sub": [
            _member("quantity_sub", q, [q, q], lambda a, b: _quantity_message(qv(a) - qv(b))),
            _member("quantity_sub_int", q, [q, integer], lambda a, b: _quantity_message(qv(a) - b)),
        ],
        "semver": [_global("string_to_semver", s, string, _semver_message)],
        "isSemver": [_global("is_semver_string", boolean, string, _is_semver)],
        "major": [_member("semver_major", integer, [s], lambda a: sv(a).major)],
        "minor": [_member("semver_minor", integer, [s], lambda a: sv(a).minor)],
        "patch": [_member("semver_patch", integer, [s], lambda a: sv(a).patch)],
        # One implementation per name serves both types: see _ordering.
        "compareTo": [
            _member("quantity_compare_to", integer, [q, q], _ordering),
            _member("semver_compare_to", integer, [s, s]),
        ],
        "isGreaterThan": [
            _member("quantity_is_greater_than", boolean, [q, q], lambda a, b: _ordering(a, b) > 0),
            _member("semver_is_greater_than", boolean, [s, s]),
        ],
        "isLessThan": [
            _member("quantity_is_less_than", boolean, [q, q], lambda a, b: _ordering(a, b) < 0),
            _member("semver_is_less_than", boolean, [s, s]),
        ],
    }
    return [cel.FunctionDecl(name, declared) for name, declared in overloads.items()]


@cache
def _environment() -> cel.Env:
    return cel.NewEnv(
        _POOL,
        variables={"device": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)},
        extensions=[ext_bindings.ExtBindings(), ext_strings.ExtStrings(2), ext_optional.ExtOptional()],
        functions=_functions(),
    )


# --- Selectors --------------------------------------------------------------------------------


@cache
def _compiled(expression: str) -> cel.Expression:
    try:
        program = _environment().compile(expression)
    except RuntimeError as error:
        raise CelCompileError(f"{expression!r} does not compile: {error}") from error
    if program.return_type() not in (cel.Type.BOOL, cel.Type.DYN):
        raise CelCompileError(f"{expression!r} must evaluate to bool, not {program.return_type().name()}")
    return program


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, slash, short = name.partition("/")
    return (domain, short) if slash else (driver, name)


def _attribute_value(name: str, attribute: Mapping[str, Any]) -> Any:
    if len(attribute) != 1 or next(iter(attribute)) not in ("bool", "int", "string", "version"):
        raise ValueError(f"attribute {name!r} must have exactly one of bool, int, string or version")
    ((kind, value),) = attribute.items()
    return _semver_message(value) if kind == "version" else value


def _device_variable(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, dict[str, Any]] = {}
    for name, attribute in device.get("attributes", {}).items():
        domain, short = _split(name, driver)
        attributes.setdefault(domain, {})[short] = _attribute_value(name, attribute)
    capacity: dict[str, dict[str, Message]] = {}
    for name, value in device.get("capacity", {}).items():
        domain, short = _split(name, driver)
        capacity.setdefault(domain, {})[short] = _quantity_message(parse_quantity(value["value"]))
    return {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": device.get("allowMultipleAllocations", False),
    }


_ABSENT_KEY = re.compile(r'NOT_FOUND: Key not found in map : "(?P<key>[^"]*)"')


def _add_absent_domain(variable: dict[str, Any], key: str) -> bool:
    """Give an absent domain the empty map Kubernetes answers with; False when that cannot help.

    Only a key with a dot can be a domain (attribute and capacity names are C identifiers), and
    one already present in both maps was not the lookup that failed.
    """
    if "." not in key:
        return False
    added = False
    for grouped in (variable["attributes"], variable["capacity"]):
        if key not in grouped:
            grouped[key] = {}
            added = True
    return added


def selects(expression: str, driver: str, device: Mapping[str, Any]) -> bool:
    """Whether a DRA CEL selector selects `device` (a resource.k8s.io/v1 Device as a dict) of `driver`.

    Raises CelCompileError where the API server would refuse the selector, and CelEvaluationError
    where the scheduler would fail on it (a missing attribute, a type mismatch, a non-bool result).
    """
    program = _compiled(expression)
    variable = _device_variable(driver, device)
    while True:
        result = program.eval(data={"device": variable})
        if result.type() != cel.Type.ERROR:
            break
        message = str(result.value())
        absent = _ABSENT_KEY.fullmatch(message)
        if absent is None or not _add_absent_domain(variable, absent["key"]):
            raise CelEvaluationError(
                f"{expression!r} fails on device {device.get('name')!r} of driver {driver!r}: {message}"
            )
    value = result.value()
    if not isinstance(value, bool):
        raise CelEvaluationError(f"{expression!r} evaluated to {value!r}, not a bool")
    return value
