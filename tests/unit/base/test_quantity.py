"""One grammar of Kubernetes quantities, and each reader's rules on top of it: every reader
takes exactly what its own regex took before the grammar was shared (the regexes are kept here
as the oracle), with the same value."""

import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.base.quantity import Quantity, parse_quantity
from dra_driver.base.strict_decode import ByteQuantity
from dra_driver.devices.node_config_decode import _bytes
from dra_driver.packing.published import PublishedSliceError
from dra_driver.packing.published import parse_quantity as published_quantity
from dra_driver.packing.shapes import ShapeError, _memory

_FACTORS = {
    "": 1,
    **{s: 1024**p for p, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
    **{s: 1000**p for p, s in enumerate(("k", "M", "G", "T", "P", "E"), start=1)},
}
# The four readers' regexes before this module, and what each did with a match.
_BYTES = re.compile(r"(?P<digits>[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
_NODE_CONFIG = re.compile(r"(0|[1-9][0-9]*)(Ki|Mi|Gi|Ti|k|M|G|T)?")
_SHAPES = re.compile(r"(?P<digits>[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|k|M|G|T)?")
_PUBLISHED = re.compile(r"([0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")


def _old_bytes(text: str) -> int | None:
    match = _BYTES.fullmatch(text)
    if match is None:
        return None
    total = int(match["digits"]) * _FACTORS[match["suffix"] or ""]
    return total if 0 < total <= 2**63 - 1 else None


def _old(pattern: re.Pattern[str], nonzero: bool = False) -> Callable[[str], int | None]:
    def read(text: str) -> int | None:
        match = pattern.fullmatch(text)
        if match is None:
            return None
        total = int(match[1]) * _FACTORS[match[2] or ""]
        return None if nonzero and total == 0 else total

    return read


def _new(read: Callable[[str, str], int], error: type[Exception]) -> Callable[[str], int | None]:
    def taken(text: str) -> int | None:
        try:
            return read(text, "where")
        except error:
            return None

    return taken


READERS = {
    "claim config byte limits": (_old_bytes, _new(lambda text, where: ByteQuantity(text), ValueError)),
    "node config": (_old(_NODE_CONFIG), _new(lambda text, where: _bytes(text), ValueError)),
    "plan --pods memory": (_old(_SHAPES, nonzero=True), _new(_memory, ShapeError)),
    "slices read back": (_old(_PUBLISHED), _new(published_quantity, PublishedSliceError)),
}
SUFFIXES = [
    "",
    "Ki",
    "Mi",
    "Gi",
    "Ti",
    "Pi",
    "Ei",
    "k",
    "M",
    "G",
    "T",
    "P",
    "E",
    "m",
    "e3",
    "E-2",
    "ki",
    "K",
    "i",
]
QUANTITY_LIKE = st.builds(
    lambda sign, whole, point, fraction, suffix: f"{sign}{whole}{point}{fraction}{suffix}",
    st.sampled_from(["", "", "", "+", "-"]),
    st.from_regex(r"[0-9]{0,22}", fullmatch=True),
    st.sampled_from(["", "", "", "."]),
    st.from_regex(r"[0-9]{0,2}", fullmatch=True),
    st.sampled_from(SUFFIXES),
)
ANY_TEXT = st.text(alphabet="0123456789.+-eEkKMGTPim ", max_size=8)


@pytest.mark.parametrize("reader", sorted(READERS))
@settings(max_examples=400, deadline=None)
@given(text=st.one_of(QUANTITY_LIKE, ANY_TEXT))
def test_each_reader_takes_what_its_own_regex_took(reader: str, text: str) -> None:
    old, new = READERS[reader]

    assert new(text) == old(text)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("10Gi", ("", "10", False, "", "Gi")),
        ("1.5", ("", "1", True, "5", "")),
        (".5", ("", "", True, "5", "")),
        ("5.", ("", "5", True, "", "")),
        ("-100m", ("-", "100", False, "", "m")),
        ("+1e3", ("+", "1", False, "", "e3")),
        ("1E", ("", "1", False, "", "E")),
        ("1E-3", ("", "1", False, "", "E-3")),
        ("007k", ("", "007", False, "", "k")),
    ],
)
def test_the_grammar_is_kubernetes(text: str, parts: tuple[str, str, bool, str, str]) -> None:
    assert parse_quantity(text) == Quantity(*parts)


@pytest.mark.parametrize(
    "text", ["", ".", "+", "Gi", "1 Gi", "1gi", "1K", "1e", "e3", "1.2.3", "1Gi2", "--1"]
)
def test_what_kubernetes_refuses_is_no_quantity(text: str) -> None:
    assert parse_quantity(text) is None


def test_a_whole_number_has_no_sign_point_milli_or_exponent() -> None:
    whole = {
        text: q.whole_number()
        for text in ("3Ki", "+3", "3.0", "3m", "3e2", "0")
        if (q := parse_quantity(text))
    }

    assert whole == {"3Ki": 3072, "+3": None, "3.0": None, "3m": None, "3e2": None, "0": 0}
