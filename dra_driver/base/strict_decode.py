"""Strict decoding of documents from outside the process (opaque configs in claims, the node
config, the XID policy, simulated node files, records), with one wording for every module.

Strict, because an ignored or misread field means the driver does something other than what
the author asked (a GPU shared differently, a GPU offered in the wrong mode). One kit, because
an operator reading errors from several files should meet one way of naming a field and of
showing what was wrong with it.

Formats are declared as msgspec Structs and decoded by `typed_decode.typed` in this wording; the
values here are the few whose form no builtin type says (a JSON number taken as an integer, a
memory-limit quantity): classes a Struct declares, which check the value as written.

Everything raises DecodeError(path, problem); each caller turns it into its own error type
(kubelet claim error, node-config error, ...) and adds where the document came from.
"""

import json
from collections.abc import Mapping, Sequence
from typing import ClassVar, Self

from dra_driver.base.errors import OperatorFault
from dra_driver.base.quantity import QUANTITY_FACTORS, WHOLE_SUFFIXES, parse_quantity

_SHOWN_MAX = 80
_HUGE_INTEGER = "a number of more than 77 digits"


class DecodeError(OperatorFault, ValueError):
    """`path` names the field (dotted, with [n] for list items; "" for the document itself)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


def shown(text: str) -> str:
    """A string as JSON text, cut short: documents come from users and may be kilobytes long."""
    if len(text) <= _SHOWN_MAX:
        return json.dumps(text)
    return json.dumps(text[:_SHOWN_MAX]) + f"... ({len(text)} characters)"


def quoted(value: object) -> str:
    """A scalar as Python writes it, a string cut short; a container by kind only (an aliased
    one can stand for billions of values, issue 33)."""
    if isinstance(value, str):
        return (
            repr(value) if len(value) <= _SHOWN_MAX else f"{value[:_SHOWN_MAX]!r}… ({len(value)} characters)"
        )
    if isinstance(value, int) and not isinstance(value, bool):
        return integer_text(value)
    if value is None or isinstance(value, bool | float):
        return repr(value)
    return described(value)


def integer_text(value: int) -> str:
    """Python refuses to print integers of thousands of digits; YAML can still produce them."""
    return str(value) if value.bit_length() <= 256 else _HUGE_INTEGER


def described(value: object) -> str:
    """What the author wrote, in JSON terms; containers by kind only (they may be deeply nested)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"the string {shown(value)}"
    if isinstance(value, int):
        text = integer_text(value)
        return f"the integer {text}" if text != _HUGE_INTEGER else text
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def join(path: str, key: str) -> str:
    """A field path; a key that would garble the message is shown quoted and cut short."""
    name = key if len(key) <= _SHOWN_MAX and key.isprintable() else shown(key)
    return f"{path}.{name}" if path else name


def listed(options: Sequence[str]) -> str:
    return ", ".join(options)


def integer_range(minimum: int, maximum: int) -> str:
    return f"an integer from {minimum} to {maximum}"


def out_of_range(value: int, expected: str) -> str:
    return f"{integer_text(value)} is out of range; expected {expected}"


class JsonInteger(int):
    """An integer of a JSON document, from the subclass's `minimum` to its `maximum`.

    JSON has one number type, so 50.0 is the integer 50 (as JSON Schema agrees); true never is.
    A class, so that a Struct declares the field and `typed_decode` checks it where it decodes the
    document, by calling the class with the value as written.
    """

    minimum: ClassVar[int]
    maximum: ClassVar[int]

    def __new__(cls, value: object) -> Self:
        expected = integer_range(cls.minimum, cls.maximum)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected {expected}, got {described(value)}")
        if not cls.minimum <= value <= cls.maximum:
            raise ValueError(out_of_range(value, expected))
        return super().__new__(cls, value)


# Fractions, exponents, signs and the milli suffix are refused: a pinned-memory limit is a
# whole number of bytes.
# Kubernetes quantities are int64 underneath; a limit beyond that is a typo, not a real GPU.
_MAX_BYTES = 2**63 - 1
_MAX_DIGITS = len(str(_MAX_BYTES))
_QUANTITY_FORM = (
    'a whole number of bytes with an optional suffix Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E, e.g. "10Gi"'
)


class ByteQuantity(int):
    """A memory-limit quantity ("10Gi", "512M", "1073741824") as a positive number of bytes.

    A class for the reason JsonInteger is one; its ValueError words the problem without a path,
    which the decoder (or a caller with a value of its own) puts in front.
    """

    def __new__(cls, value: object) -> Self:
        return super().__new__(cls, _bytes(value))


def _bytes(value: object) -> int:
    if not isinstance(value, str):
        raise ValueError(f"expected a quantity string, {_QUANTITY_FORM}; got {described(value)}")
    quantity = parse_quantity(value)
    if quantity is None or quantity.sign or quantity.point or quantity.suffix not in WHOLE_SUFFIXES:
        if value.startswith("-"):
            raise ValueError(f"{shown(value)} is negative; a memory limit must be more than zero")
        if "." in value:
            raise ValueError(
                f"{shown(value)} has a fraction; write it in a smaller unit, e.g. 1536Mi for 1.5Gi"
            )
        raise ValueError(f"{shown(value)} is not {_QUANTITY_FORM}")
    digits = quantity.whole_digits
    if not digits:
        raise ValueError(f"{shown(value)} is zero; a memory limit must be more than zero")
    # Counting digits first means a thousand-digit number costs nothing and never reaches
    # Python's limit on converting long digit strings.
    total = int(digits) * QUANTITY_FACTORS[quantity.suffix] if len(digits) <= _MAX_DIGITS else None
    if total is None or total > _MAX_BYTES:
        raise ValueError(f"{shown(value)} is more than {_MAX_BYTES} bytes (2^63 - 1)")
    return total
