"""Kubernetes quantities ("10Gi", "512M", "1.5", "100m", "1e3"), read by one grammar.

Quantities are read in four places (claim configs, node configs, `plan --pods`, slices read
back) and each allows less than Kubernetes does: a byte count has no fraction, a node config no
suffix beyond Ti. So the grammar is here once, as Kubernetes' `ParseQuantity` has it (a sign,
digits with an optional point, then a binary suffix Ki..Ei, a decimal one k..E or m, or an
exponent e/E<n>), and each reader states what it allows of a parsed `Quantity`.
"""

import re
from collections.abc import Mapping

import msgspec

BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
DECIMAL_SUFFIXES = ("k", "M", "G", "T", "P", "E")
# The suffixes that multiply by a whole number (not m, not an exponent), and by what.
QUANTITY_FACTORS: Mapping[str, int] = {
    "": 1,
    **{suffix: 1024**power for power, suffix in enumerate(BINARY_SUFFIXES, start=1)},
    **{suffix: 1000**power for power, suffix in enumerate(DECIMAL_SUFFIXES, start=1)},
}
WHOLE_SUFFIXES = frozenset(QUANTITY_FACTORS)
# Up to tebi and tera: what GPU-sized memory is written with.
UP_TO_TERA = frozenset({"", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"})

# "E" alone is exa; "E3" an exponent: fullmatch tries the exponent when "E" leaves digits over.
_GRAMMAR = re.compile(
    r"(?P<sign>[+-]?)(?P<whole>[0-9]*)(?:(?P<point>\.)(?P<fraction>[0-9]*))?"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)


class Quantity(msgspec.Struct, frozen=True):
    """A quantity as written: its parts, not yet a number (a reader decides which it takes)."""

    sign: str  # "", "+" or "-"
    whole: str  # the digits before the point, as written (leading zeros kept; may be "")
    point: bool
    fraction: str  # the digits after the point
    suffix: str  # "", a binary or decimal suffix, "m", or an exponent such as "e3"

    @property
    def whole_digits(self) -> str:
        """The whole part without leading zeros ("" for zero)."""
        return self.whole.lstrip("0")

    def whole_number(self, suffixes: frozenset[str] = WHOLE_SUFFIXES) -> int | None:
        """The value, where the quantity is plain digits times one of `suffixes` (no sign, no
        point, no milli, no exponent); None otherwise."""
        if self.sign or self.point or not self.whole or self.suffix not in suffixes:
            return None
        return int(self.whole) * QUANTITY_FACTORS[self.suffix]


def parse_quantity(text: str) -> Quantity | None:
    """The quantity `text` writes, or None where it is not one in Kubernetes' grammar."""
    match = _GRAMMAR.fullmatch(text)
    if match is None or not (match["whole"] or match["fraction"]):
        return None
    return Quantity(
        sign=match["sign"],
        whole=match["whole"],
        point=match["point"] is not None,
        fraction=match["fraction"] or "",
        suffix=match["suffix"] or "",
    )
