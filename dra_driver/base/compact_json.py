"""JSON in its most compact form, as the driver writes its records, specs and metadata files.

Encoded by msgspec's encoder straight to bytes: on the pod-startup path, where about five small
documents are encoded per claim, the standard library's encoder and the `str.encode` after it
took 13 µs for a 700-byte record on the benchmark machine, msgspec 1.9 µs (issue 31). The text is
what `json.dumps(value, separators=(",", ":"), ensure_ascii=False)` writes for the driver's
documents (objects with string keys, arrays, strings, integers, booleans, null); floats, which
they do not hold, may be spelled differently (`0.00001` for `1e-05`).
"""

import msgspec

_ENCODER = msgspec.json.Encoder()


def compact_json(value: object) -> bytes:
    """The document as UTF-8 JSON without spaces; tuples become arrays. A value JSON cannot hold
    (an object, a tuple as a key) raises TypeError."""
    return _ENCODER.encode(value)
