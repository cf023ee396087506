"""The strict-decoding kit itself: the wording every document's errors share, and the value
classes a Struct declares for what no builtin type says."""

import msgspec
import pytest

from dra_driver.base.strict_decode import ByteQuantity, DecodeError, JsonInteger
from dra_driver.base.typed_decode import typed


class _OneToThree(JsonInteger):
    minimum, maximum = 1, 3


class _Document(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    n: _OneToThree | msgspec.UnsetType = msgspec.UNSET
    q: ByteQuantity | msgspec.UnsetType = msgspec.UNSET


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"n": "2"}, 'n: expected an integer from 1 to 3, got the string "2"'),
        ({"n": 2.5}, "n: expected an integer from 1 to 3, got the number 2.5"),
        ({"n": True}, "n: expected an integer from 1 to 3, got true"),
        ({"n": None}, "n: expected an integer from 1 to 3, got null"),
        ({"n": 7}, "n: 7 is out of range; expected an integer from 1 to 3"),
        ({"n": 7.0}, "n: 7 is out of range; expected an integer from 1 to 3"),
        (
            {"n": 10**400},
            "n: a number of more than 77 digits is out of range; expected an integer from 1 to 3",
        ),
        ({"q": "0Gi"}, 'q: "0Gi" is zero; a memory limit must be more than zero'),
        ({"q": "-1Gi"}, 'q: "-1Gi" is negative; a memory limit must be more than zero'),
        ({"q": "1.5Gi"}, 'q: "1.5Gi" has a fraction; write it in a smaller unit, e.g. 1536Mi for 1.5Gi'),
        (
            {"q": 5},
            "q: expected a quantity string, a whole number of bytes with an optional suffix Ki, "
            'Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E, e.g. "10Gi"; got the integer 5',
        ),
        ({"q": "9" * 30}, f'q: "{"9" * 30}" is more than 9223372036854775807 bytes (2^63 - 1)'),
    ],
)
def test_each_value_class_names_the_path_and_what_it_expected(document: object, message: str) -> None:
    with pytest.raises(DecodeError) as raised:
        typed(document, _Document)
    assert str(raised.value) == message


def test_json_numbers_may_be_whole_floats_but_never_booleans() -> None:
    assert typed({"n": 2.0}, _Document).n == 2
    assert _OneToThree(3) == 3
    with pytest.raises(ValueError, match="got false"):
        _OneToThree(False)


def test_what_decodes_comes_back_as_its_number() -> None:
    assert typed({"q": "2Ki"}, _Document).q == 2048
    assert ByteQuantity("1Gi") == 2**30
    assert ByteQuantity("16G") == 16 * 10**9
