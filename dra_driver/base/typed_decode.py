"""Formats declared as msgspec Structs, decoded in the house wording of strict_decode.

msgspec checks a typed document in one pass and names the place of a problem, but in its own
words ("Expected `int` >= 0 - at `$.devices[0].facts.gpuIndex`"). An operator reading the agent's
errors should meet one way of naming a field and of saying what was expected, so its complaint is
told again here: the field path as strict_decode writes it, what the declared type expects there,
and what the document holds instead. A type annotated with `msgspec.Meta(description=...)` is
expected in those words, for a format whose type alone says too little ("a list of XID numbers").
"""

import re
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

import msgspec
import msgspec.inspect as types

from dra_driver.base.strict_decode import DecodeError, described, integer_text, join, listed, shown

_T = TypeVar("_T")

_AT = re.compile(r"^(?P<problem>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `", re.DOTALL)
_STEP = re.compile(r"\.(?P<field>[^.\[]+)|\[(?P<index>\d+)\]")
_MISSING_VALUE = object()

_Steps = list[tuple[str | None, int | None]]
# A place in the declared type: its type there, and the values of its literals in the order the
# Struct declares them (msgspec.inspect sorts them; users read "Default, Short, Medium, Long").
_Place = tuple[types.Type | None, tuple[object, ...]]


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
    steps: _Steps = [
        (step["field"], None if step["index"] is None else int(step["index"]))
        for step in _STEP.finditer(tail)
    ]
    if missing := _MISSING.match(problem):
        field_info, order = _type_at(kind, [*steps, (missing["field"], None)])
        hint = _expected(field_info, order) if _hinted(field_info) else None
        return DecodeError(join(where, missing["field"]), f"required ({hint})" if hint else "required")
    info, order = _type_at(kind, steps)
    held = _value_at(value, steps)
    odd_keys = [key for key in held if not isinstance(key, str)] if isinstance(held, Mapping) else []
    if found["key"] and odd_keys:
        return DecodeError(where, f"field names are strings, got {described(odd_keys[0])}")
    if _UNKNOWN.match(problem) and (struct := _member(info, types.StructType)) and isinstance(held, Mapping):
        return _unknown_fields(where, struct, held)
    expected = _expected(info, order)
    if expected is None or held is _MISSING_VALUE:
        return DecodeError(where, problem[:1].lower() + problem[1:])
    if isinstance(held, str) and (literal := _member(info, types.LiteralType)) and held not in literal.values:
        return DecodeError(where, f"{shown(held)} is not one of {_options(literal, order)}")
    if _ranged(info) and isinstance(held, int) and not isinstance(held, bool):
        return DecodeError(where, f"{integer_text(held)} is out of range; expected {expected}")
    return DecodeError(where, f"expected {expected}, got {described(held)}")


def _unknown_fields(where: str, info: types.StructType, held: Mapping[Any, Any]) -> DecodeError:
    """Every unknown field of the object, not only the first msgspec met: a misplaced block is
    several at once."""
    allowed = [field.encode_name for field in info.fields]
    unknown = [key for key in held if isinstance(key, str) and key not in allowed]
    if len(unknown) == 1:
        return DecodeError(join(where, unknown[0]), f"unknown field (allowed here: {listed(allowed)})")
    return DecodeError(
        ", ".join(join(where, key) for key in unknown), f"unknown fields (allowed here: {listed(allowed)})"
    )


def _bare(info: types.Type) -> types.Type:
    return info.type if isinstance(info, types.Metadata) else info


def _members(info: types.Type | None) -> tuple[types.Type, ...]:
    """The types a value may be (a union's members, or the one type), descriptions set aside."""
    if info is None:
        return ()
    bare = _bare(info)
    return tuple(map(_bare, bare.types)) if isinstance(bare, types.UnionType) else (bare,)


_Member = TypeVar("_Member", bound=types.Type)


def _member(info: types.Type | None, kind: type[_Member]) -> _Member | None:
    return next((member for member in _members(info) if isinstance(member, kind)), None)


def _type_at(kind: type[Any], steps: _Steps) -> _Place:
    info: types.Type = types.type_info(kind)
    order: tuple[object, ...] = ()
    for field, index in steps:
        following: types.Type | None = None
        for candidate in _members(info):
            if index is not None and isinstance(candidate, types.ListType | types.VarTupleType):
                following = candidate.item_type
            elif field is not None and isinstance(candidate, types.StructType):
                for declared in candidate.fields:
                    if declared.encode_name == field:
                        following, order = declared.type, _literal_order(candidate.cls, declared.name)
        if following is None:
            return None, ()
        info = following
    return info, order


def _literal_order(cls: type[Any], name: str) -> tuple[object, ...]:
    annotation = next(field.type for field in msgspec.structs.fields(cls) if field.name == name)
    return _literals(annotation)


def _literals(annotation: object) -> tuple[object, ...]:
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    return tuple(value for argument in get_args(annotation) for value in _literals(argument))


def _options(literal: types.LiteralType, order: tuple[object, ...]) -> str:
    ordered = sorted(literal.values, key=lambda value: order.index(value) if value in order else len(order))
    return listed([str(value) for value in ordered])


def _hinted(info: types.Type | None) -> bool:
    """Whether a missing field's type is worth naming: a choice of values, or described in words."""
    return isinstance(info, types.Metadata) or _member(info, types.LiteralType) is not None


def _ranged(info: types.Type | None) -> bool:
    """An integer with both bounds, whose out-of-range values strict_decode.integer words so."""
    whole = _member(info, types.IntType)
    return whole is not None and whole.ge is not None and whole.le is not None


def _expected(info: types.Type | None, order: tuple[object, ...] = ()) -> str | None:
    """What the declared type asks for, in words; None for a type without words here."""
    if isinstance(info, types.Metadata):
        description = (info.extra_json_schema or {}).get("description")
        return str(description) if description else _expected(info.type, order)
    if isinstance(info, types.UnionType):
        members = info.types
        if any(isinstance(member, types.IntType) for member in members):
            # `int | float` is a JSON number written as an integer (50.0): the float is no choice.
            members = tuple(member for member in members if not isinstance(member, types.FloatType))
        parts = [_expected(member, order) for member in members]
        return None if None in parts else " or ".join(part for part in parts if part)
    if isinstance(info, types.IntType):
        if info.ge is not None and info.le is not None:
            return f"an integer from {info.ge} to {info.le}"
        return "a non-negative integer" if info.ge == 0 else "an integer"
    if isinstance(info, types.LiteralType):
        return f"one of {_options(info, order)}"
    if isinstance(info, types.StructType) and info.forbid_unknown_fields:
        return f"an object with fields {listed([field.encode_name for field in info.fields])}"
    words = {
        types.StrType: "a string",
        types.BoolType: "true or false",
        types.NoneType: "null",
        types.StructType: "an object",
        types.VarTupleType: "a list",
        types.ListType: "a list",
    }
    return next((text for kind, text in words.items() if isinstance(info, kind)), None)


def _value_at(value: object, steps: _Steps) -> object:
    for field, index in steps:
        if index is not None and isinstance(value, list | tuple) and index < len(value):
            value = value[index]
        elif field is not None and isinstance(value, Mapping) and field in value:
            value = value[field]
        else:
            return _MISSING_VALUE
    return value
