"""The strict-decoding kit itself: the wording every document's errors share."""

from collections.abc import Callable

import pytest

from dra_driver.base.strict_decode import (
    DecodeError,
    byte_quantity,
    choice,
    integer,
)


@pytest.mark.parametrize(
    ("decode", "message"),
    [
        (lambda: choice(True, "m", {"on": 1}), "m: expected one of on, got true"),
        (lambda: choice("off", "m", {"on": 1}), 'm: "off" is not one of on'),
        (lambda: integer(2.0, "n", 1, 3), "n: expected an integer from 1 to 3, got the number 2.0"),
        (lambda: integer(7, "n", 1, 3), "n: 7 is out of range; expected an integer from 1 to 3"),
        (lambda: byte_quantity("0Gi", "q"), 'q: "0Gi" is zero; a memory limit must be more than zero'),
    ],
)
def test_each_check_names_the_path_and_what_it_expected(decode: Callable[[], object], message: str) -> None:
    with pytest.raises(DecodeError) as raised:
        decode()
    assert str(raised.value) == message


def test_json_numbers_may_be_whole_floats_but_yaml_ones_may_not() -> None:
    assert integer(2.0, "n", 1, 3, json_number=True) == 2
    with pytest.raises(DecodeError):
        integer(2.0, "n", 1, 3)
    with pytest.raises(DecodeError):
        integer(True, "n", 0, 3, json_number=True)


def test_what_decodes_comes_back_as_given() -> None:
    assert choice("on", "m", {"on": 5}) == 5
    assert byte_quantity("2Ki", "q") == 2048
