"""Formats declared as msgspec Structs, decoded in the house wording of strict_decode.

msgspec checks a typed document in one pass and names the place of a problem, but in its own
words ("Expected `int` >= 0 - at `$.devices[0].facts.gpuIndex`"). An operator reading the agent's
errors should meet one way of naming a field and of saying what was expected, so its complaint is
told again here: the field path as strict_decode writes it, what the declared type expects there,
and what the document holds instead.
"""

import re
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as types

from dra_driver.base.strict_decode import DecodeError, described, join

_T = TypeVar("_T")

_AT = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]*)`$")
_STEP = re.compile(r"\.(?P<field>[^.\[]+)|\[(?P<index>\d+)\]")
_MISSING_VALUE = object()


def typed(value: object, kind: type[_T], path: str = "") -> _T:
    """`value` (parsed JSON) as `kind`; raises DecodeError naming the field under `path`."""
    try:
        return msgspec.convert(value, kind, strict=True)
    except msgspec.ValidationError as error:
        raise _in_house_words(str(error), kind, value, path) from None


def _in_house_words(message: str, kind: type[Any], value: object, path: str) -> DecodeError:
    found = _AT.match(message)
    assert found is not None  # the pattern matches any text
    problem, tail = found["problem"], found["path"] or ""
    where = f"{path}{tail}" if path else tail.removeprefix(".")
    if missing := _MISSING.match(problem):
        return DecodeError(join(where, missing["field"]), "required")
    steps = [
        (step["field"], None if step["index"] is None else int(step["index"]))
        for step in _STEP.finditer(tail)
    ]
    expected = _expected(_type_at(types.type_info(kind), steps))
    held = _value_at(value, steps)
    if expected is None or held is _MISSING_VALUE:
        return DecodeError(where, problem[:1].lower() + problem[1:])
    return DecodeError(where, f"expected {expected}, got {described(held)}")


def _type_at(info: types.Type, steps: list[tuple[str | None, int | None]]) -> types.Type | None:
    for field, index in steps:
        candidates = info.types if isinstance(info, types.UnionType) else (info,)
        following: types.Type | None = None
        for candidate in candidates:
            if index is not None and isinstance(candidate, types.ListType | types.VarTupleType):
                following = candidate.item_type
            elif field is not None and isinstance(candidate, types.StructType):
                following = next((f.type for f in candidate.fields if f.encode_name == field), following)
        if following is None:
            return None
        info = following
    return info


def _expected(info: types.Type | None) -> str | None:
    """What the declared type asks for, in words; None for a type without words here."""
    if isinstance(info, types.UnionType):
        parts = [_expected(member) for member in info.types]
        return None if None in parts else " or ".join(part for part in parts if part)
    if isinstance(info, types.IntType):
        return "a non-negative integer" if info.ge == 0 else "an integer"
    if isinstance(info, types.LiteralType):
        return f"one of {', '.join(str(option) for option in info.values)}"
    words = {
        types.StrType: "a string",
        types.BoolType: "true or false",
        types.NoneType: "null",
        types.StructType: "an object",
        types.VarTupleType: "a list",
        types.ListType: "a list",
    }
    return next((text for kind, text in words.items() if isinstance(info, kind)), None)


def _value_at(value: object, steps: list[tuple[str | None, int | None]]) -> object:
    for field, index in steps:
        if index is not None and isinstance(value, list | tuple) and index < len(value):
            value = value[index]
        elif field is not None and isinstance(value, Mapping) and field in value:
            value = value[field]
        else:
            return _MISSING_VALUE
    return value
