"""Formats declared as msgspec Structs, decoded in the house wording of strict_decode.

msgspec checks a typed document in one pass and names the place of a problem, but in its own
words ("Expected `int` >= 0 - at `$.devices[0].facts.gpuIndex`"). An operator reading the agent's
errors should meet one way of naming a field and of saying what was expected, so its complaint is
told again here: the field path as strict_decode writes it, what the declared type expects there,
and what the document holds instead. A type annotated with `msgspec.Meta(description=...)` is
expected in those words, for a format whose type alone says too little ("a list of XID numbers").
A value no type can check by its form (a quantity, a name from a catalog) is a class of its own,
made by calling it with the value as written; the ValueError it raises words the problem.

msgspec stops at the first problem; `typed_all` goes on to the others, so that an operator fixing
a file meets each of its mistakes in one run, not one per run.
"""

import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, Literal, TypeVar, get_args, get_origin

import msgspec
import msgspec.inspect as types

from dra_driver.base.errors import OperatorFault
from dra_driver.base.strict_decode import (
    DecodeError,
    described,
    integer_range,
    join,
    listed,
    out_of_range,
    shown,
)

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


class DecodeProblems(OperatorFault, ValueError):
    """Every problem `typed_all` found, in the order the types declare their fields."""

    def __init__(self, errors: Sequence[DecodeError]) -> None:
        super().__init__("\n".join(map(str, errors)))
        self.errors = tuple(errors)


def typed(value: object, kind: type[_T], path: str = "") -> _T:
    """`value` (parsed JSON) as `kind`; raises DecodeError naming the field under `path`."""
    converted: _T = _convert(value, kind, path)
    return converted


def typed_values(value: Mapping[str, object], kind: type[_T], path: str = "") -> dict[str, _T]:
    """Each value of an already decoded mapping as `kind`, the key in the path of a problem
    (`path.key`): msgspec names a mapping's value by no key, which leaves a reader of the error
    looking for the wrong entry."""
    return {key: typed(item, kind, join(path, key)) for key, item in value.items()}


def typed_all(value: object, kind: type[_T], path: str = "") -> _T:
    """`typed`, but a value that does not decode raises DecodeProblems with a problem for each
    field of each object that is wrong, where `typed` names the first."""
    try:
        return typed(value, kind, path)
    except DecodeError as first:
        raise DecodeProblems(_problems(value, kind, path) or [first]) from None


def _convert(value: object, annotation: Any, path: str) -> Any:
    try:
        return msgspec.convert(value, annotation, strict=True, dec_hook=_made)
    except msgspec.ValidationError as error:
        raise _in_house_words(str(error), annotation, value, path) from None


# msgspec builds a type's whole tree, and resolves a Struct's annotations, on each call; a
# complaint asks several times, typed_all again at each field.
@cache
def _type_info(annotation: Any) -> types.Type:
    return types.type_info(annotation)


@cache
def _fields(cls: Any) -> tuple[msgspec.structs.FieldInfo, ...]:
    return msgspec.structs.fields(cls)


def _made(kind: type[Any], value: object) -> object:
    """msgspec's hook for a type it does not know: the class checks the value itself."""
    return kind(value)


def _problems(value: object, annotation: Any, path: str) -> list[DecodeError]:
    """Each field of an object, and each object of a list of them, decoded on its own: a wrong
    field then hides neither its neighbours' problems nor those of the entries after it."""
    try:
        _convert(value, annotation, path)
    except DecodeError as error:
        first = error
    else:
        return []
    info = _bare(_type_info(annotation))
    items = info.item_type if isinstance(info, types.ListType | types.VarTupleType) else None
    if isinstance(items, types.StructType) and isinstance(value, list):
        found = [
            problem for n, item in enumerate(value) for problem in _problems(item, items.cls, f"{path}[{n}]")
        ]
        return found or [first]
    if not (isinstance(info, types.StructType) and isinstance(value, Mapping)):
        return [first]
    if any(not isinstance(key, str) for key in value):
        return [first]
    allowed = {field.encode_name for field in info.fields}
    found = (
        [_unknown_fields(path, info, value)] if info.forbid_unknown_fields and set(value) - allowed else []
    )
    for field in _fields(info.cls):
        where = join(path, field.encode_name)
        if field.encode_name in value:
            found += _problems(value[field.encode_name], field.type, where)
        elif field.required:
            found.append(_required(where, *_type_at(info.cls, [(field.encode_name, None)])))
    return found or [first]


def _in_house_words(message: str, kind: Any, value: object, path: str) -> DecodeError:
    found = _AT.match(message)
    assert found is not None  # the pattern matches any text
    problem, tail = found["problem"], found["path"] or ""
    where = f"{path}{tail}" if path else tail.removeprefix(".")
    steps: _Steps = [
        (step["field"], None if step["index"] is None else int(step["index"]))
        for step in _STEP.finditer(tail)
    ]
    if missing := _MISSING.match(problem):
        return _required(join(where, missing["field"]), *_type_at(kind, [*steps, (missing["field"], None)]))
    info, order = _type_at(kind, steps)
    if _member(info, types.CustomType):
        return DecodeError(where, problem)
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
        return DecodeError(where, out_of_range(held, expected))
    return DecodeError(where, f"expected {expected}, got {described(held)}")


def _required(where: str, info: types.Type | None, order: tuple[object, ...]) -> DecodeError:
    hint = _expected(info, order) if _hinted(info) else None
    return DecodeError(where, f"required ({hint})" if hint else "required")


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


def _type_at(kind: Any, steps: _Steps) -> _Place:
    info: types.Type = _type_info(kind)
    order: tuple[object, ...] = _literals(kind)
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


def _literal_order(cls: Any, name: str) -> tuple[object, ...]:
    annotation = next(field.type for field in _fields(cls) if field.name == name)
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
    """An integer with both bounds, whose out-of-range values get `out_of_range`'s words."""
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
            return integer_range(info.ge, info.le)
        return "a non-negative integer" if info.ge == 0 else "an integer"
    if isinstance(info, types.FloatType):
        return "a non-negative number" if info.ge == 0 else "a number"
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
