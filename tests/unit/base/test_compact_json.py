"""compact_json writes the JSON json.dumps writes with compact separators, as UTF-8 bytes."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.base.compact_json import compact_json

# What the driver's documents hold: no floats (attribute values, sizes and counts are integers).
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_the_same_text_as_json_dumps_with_compact_separators(value: object) -> None:
    assert compact_json(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def test_tuples_are_arrays_and_non_ascii_is_written_as_utf8() -> None:
    assert compact_json({"a": (1, "é")}) == '{"a":[1,"é"]}'.encode()
    assert json.loads(compact_json({"a": (1, "é")})) == {"a": [1, "é"]}


def test_a_value_json_cannot_hold_is_refused() -> None:
    with pytest.raises(TypeError):
        compact_json({"a": object()})
