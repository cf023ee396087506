"""Operator YAML is refused past its bounds before anything is built from it (issue 33)."""

import time
import tracemalloc

import pytest

from dra_driver.base.bounded_yaml import MAX_BYTES, MAX_DEPTH, YamlProblem, load_bounded_yaml


def alias_bomb(levels: int) -> str:
    """Each level a list of ten aliases of the one before: 10**levels strings behind 10 lines."""
    lines = ['gpus:\n  - {productName: &l0 "xxxxxxxxxx"}']
    lines += [f"  - {{productName: &l{n} [{', '.join([f'*l{n - 1}'] * 10)}]}}" for n in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_an_alias_bomb_is_refused_at_its_first_alias_in_bounded_time_and_memory() -> None:
    tracemalloc.start()
    started = time.monotonic()
    with pytest.raises(YamlProblem) as caught:
        load_bounded_yaml(alias_bomb(9))
    elapsed = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert str(caught.value) == (
        "an alias (*l0) at line 3, column 24: aliases are refused in these files (write the value out)"
    )
    assert elapsed < 1.0
    assert peak < 4 * 2**20


def test_an_anchor_without_an_alias_is_harmless_and_read() -> None:
    assert load_bounded_yaml("default: &d {mode: gpu}\n") == {"default": {"mode": "gpu"}}


def test_nesting_is_refused_one_level_past_the_bound() -> None:
    assert isinstance(load_bounded_yaml(nested(MAX_DEPTH)), list)
    with pytest.raises(YamlProblem, match=f"^nested more than {MAX_DEPTH} levels deep at line 1, column 33$"):
        load_bounded_yaml(nested(MAX_DEPTH + 1))


def test_a_document_over_the_size_bound_is_refused_unparsed() -> None:
    assert load_bounded_yaml(b"#" * MAX_BYTES) is None
    with pytest.raises(YamlProblem, match=r"^larger than 1 MiB"):
        load_bounded_yaml(b"#" * (MAX_BYTES + 1))
    with pytest.raises(YamlProblem, match=r"^larger than 1 MiB"):
        load_bounded_yaml("é" * (MAX_BYTES // 2 + 1))  # characters of two bytes each


def test_malformed_text_is_one_line_with_line_and_column_and_no_stream_name() -> None:
    with pytest.raises(YamlProblem) as caught:
        load_bounded_yaml("default:\n  mode: [mig-dynamic\n")
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("not valid YAML: ")
    assert "at line 3, column 1" in str(caught.value)
    assert "<unicode string>" not in str(caught.value)
    with pytest.raises(YamlProblem, match=r"^not UTF-8 text: byte 9 cannot be decoded$"):
        load_bounded_yaml(b"default: \xff\n")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "default: {mode: auto}\ndefault: {mode: gpu}\n",
            "key 'default' at line 2 is given twice (first at line 1)",
        ),
        (
            "gpus:\n  - index: 0\n    mode: gpu\n    mode: mig-dynamic\n",
            "key 'mode' at line 4 is given twice (first at line 3)",
        ),
        ('a: 1\n"a": 2\n', "key 'a' at line 2 is given twice (first at line 1)"),
        ("default: {mode: gpu, mode: auto}\n", "key 'mode' at line 1 is given twice (first at line 1)"),
    ],
    ids=["top-level", "in-a-list-entry", "quoted-and-plain", "one-line"],
)
def test_a_key_given_twice_in_one_mapping_is_refused_naming_both_lines(text: str, said: str) -> None:
    with pytest.raises(YamlProblem) as caught:
        load_bounded_yaml(text)
    assert said in str(caught.value)


def test_the_same_key_in_different_mappings_and_values_equal_to_keys_are_fine() -> None:
    text = (
        "gpus:\n  - {index: 0, mode: gpu}\n  - {index: 1, mode: gpu}\n"
        "default: {mode: mode}\nmode: [mode, mode]\n"
    )
    assert load_bounded_yaml(text) == {
        "gpus": [{"index": 0, "mode": "gpu"}, {"index": 1, "mode": "gpu"}],
        "default": {"mode": "mode"},
        "mode": ["mode", "mode"],
    }
