"""typed() tells msgspec's complaints in strict_decode's words: the cases strict_decode's own
helpers word in a particular way (unknown fields, field names, ranges, described types); a class
that checks its own values words its own problem; typed_all names every problem, not the first."""

from typing import Annotated, Literal

import msgspec
import pytest

from dra_driver.base.strict_decode import DecodeError
from dra_driver.base.typed_decode import DecodeProblems, typed, typed_all


class _Inner(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    start: int
    size: int = 1


class _Doc(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    count: Annotated[int, msgspec.Meta(ge=1, le=16)] = 1
    names: Annotated[tuple[str, ...], msgspec.Meta(description="a list of names such as [a, b]")] = ()
    inner: _Inner | None = None
    loose: dict[str, int] = {}
    interval: Literal["Default", "Short", "Long"] = "Default"
    # JSON's one number type: 50.0 is an integer the caller takes whole.
    number: Annotated[int, msgspec.Meta(ge=1, le=100)] | float = 1


class _Choice(msgspec.Struct, frozen=True):
    strategy: Literal["TimeSlicing", "MPS"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"cuont": 1},
            "doc.cuont: unknown field (allowed here: count, names, inner, loose, interval, number)",
        ),
        (
            {"a": 1, "count": 1, "b": 2},
            "doc.a, doc.b: unknown fields (allowed here: count, names, inner, loose, interval, number)",
        ),
        ({"inner": {"start": 0, "end": 1}}, "doc.inner.end: unknown field (allowed here: start, size)"),
        ({1: 2}, "doc: field names are strings, got the integer 1"),
        ({"loose": {"a": 1, 2: 3}}, "doc.loose: field names are strings, got the integer 2"),
        ([], "doc: expected an object with fields count, names, inner, loose, interval, number, got a list"),
        ({"inner": "x"}, 'doc.inner: expected an object with fields start, size or null, got the string "x"'),
        ({"inner": {}}, "doc.inner.start: required"),
        ({"count": 0}, "doc.count: 0 is out of range; expected an integer from 1 to 16"),
        (
            {"count": 10**400},
            "doc.count: a number of more than 77 digits is out of range; expected an integer from 1 to 16",
        ),
        ({"count": True}, "doc.count: expected an integer from 1 to 16, got true"),
        ({"names": "a"}, 'doc.names: expected a list of names such as [a, b], got the string "a"'),
        ({"names": [1]}, "doc.names[0]: expected a string, got the integer 1"),
        ({"interval": "long"}, 'doc.interval: "long" is not one of Default, Short, Long'),
        ({"interval": 1}, "doc.interval: expected one of Default, Short, Long, got the integer 1"),
        ({"number": "5"}, 'doc.number: expected an integer from 1 to 100, got the string "5"'),
        ({"number": 0}, "doc.number: 0 is out of range; expected an integer from 1 to 100"),
    ],
)
def test_complaints_name_the_field_and_what_was_expected(value: object, message: str) -> None:
    with pytest.raises(DecodeError) as raised:
        typed(value, _Doc, "doc")
    assert str(raised.value) == message


def test_a_missing_choice_names_its_options_in_their_declared_order() -> None:
    with pytest.raises(DecodeError) as raised:
        typed({}, _Choice, "sharing")
    assert str(raised.value) == "sharing.strategy: required (one of TimeSlicing, MPS)"


class _Keyed(msgspec.Struct, frozen=True):
    limits: dict[Annotated[str, msgspec.Meta(pattern="^[0-9]+$")], int]


def test_a_key_of_the_wrong_form_is_a_decode_error_too() -> None:
    with pytest.raises(DecodeError, match=r"^doc\.limits: "):
        typed({"limits": {"x": 1}}, _Keyed, "doc")


class _Even(int):
    def __new__(cls, value: object) -> "_Even":
        if not isinstance(value, int) or value % 2:
            raise ValueError(f"must be an even integer, got {value!r}")
        return super().__new__(cls, value)


class _Slot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    width: Annotated[_Even, msgspec.Meta(description="an even width such as 2")]
    name: str = ""


class _Rack(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    slots: tuple[_Slot, ...] = ()
    interval: Literal["Default", "Short", "Long"] = "Default"


def test_a_class_of_its_own_checks_the_value_as_written_and_words_the_problem() -> None:
    assert typed({"width": 4}, _Slot).width == 4
    with pytest.raises(DecodeError) as raised:
        typed({"slots": [{"width": 2}, {"width": 3}]}, _Rack, "rack")
    assert str(raised.value) == "rack.slots[1].width: must be an even integer, got 3"
    with pytest.raises(DecodeError) as raised:
        typed({}, _Slot, "slot")
    assert str(raised.value) == "slot.width: required (an even width such as 2)"


def test_typed_all_names_each_wrong_field_of_each_object_in_declared_order() -> None:
    rack = {"colour": 1, "interval": "long", "slots": [{"width": 1, "name": 2}, {"width": 2}, {"name": "x"}]}
    with pytest.raises(DecodeProblems) as raised:
        typed_all(rack, _Rack, "rack")
    assert [str(error) for error in raised.value.errors] == [
        "rack.colour: unknown field (allowed here: slots, interval)",
        "rack.slots[0].width: must be an even integer, got 1",
        "rack.slots[0].name: expected a string, got the integer 2",
        "rack.slots[2].width: required (an even width such as 2)",
        'rack.interval: "long" is not one of Default, Short, Long',
    ]


def test_typed_all_gives_what_decodes_and_one_problem_where_there_are_no_fields() -> None:
    assert typed_all({"slots": [{"width": 2}]}, _Rack).slots == (_Slot(_Even(2)),)
    with pytest.raises(DecodeProblems) as raised:
        typed_all([], _Rack, "rack")
    assert str(raised.value) == "rack: expected an object with fields slots, interval, got a list"
