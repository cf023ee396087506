"""compact_json writes exactly what json.dumps with the compact separators writes."""

import json

from hypothesis import given
from hypothesis import strategies as st

from dra_driver.base.compact_json import compact_json

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_the_same_text_as_json_dumps_with_compact_separators(value: object) -> None:
    assert compact_json(value) == json.dumps(value, separators=(",", ":"))


def test_tuples_are_lists_and_non_ascii_is_escaped_as_dumps_does() -> None:
    assert compact_json({"a": (1, "é")}) == '{"a":[1,"\\u00e9"]}'
