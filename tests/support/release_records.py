"""Helm's release records (Secrets `sh.helm.release.v1.<release>.v<revision>`), kept as sent.

Helm writes them in Kubernetes' protobuf encoding and reads them back by name (get) and by labels
(list: `name=<release>,owner=helm`, sometimes `status=deployed`). The stand-in API server has no
protobuf schemas, and the records are Helm's bookkeeping rather than objects under test, so they
are not decoded into JSON: only the name and the labels are read from the wire format, and a get
or a list answers with the bytes Helm sent, which Helm's own decoder then reads. That is what lets
`helm upgrade`, `helm history` and `helm uninstall` run against the stand-in.

The wire format (protobuf, and the `k8s\\0` envelope of runtime.Unknown around it) is read only as
far as these fields; see k8s.io/apimachinery/pkg/runtime/serializer/protobuf and the generated.proto
files of k8s.io/api/core/v1 (Secret: 1 metadata; ObjectMeta: 1 name, 11 labels; SecretList:
1 metadata, 2 items; Unknown: 1 typeMeta {1 apiVersion, 2 kind}, 2 raw).
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


class RecordError(ValueError):
    """A body that is not a protobuf Secret; the message says what was wrong."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise RecordError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(message: bytes) -> Iterator[tuple[int, bytes | int]]:
    """Each (field number, value) of a message: bytes for length-delimited fields, else the number."""
    at = 0
    while at < len(message):
        key, at = _varint(message, at)
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            value, at = _varint(message, at)
            yield number, value
        elif wire_type == LENGTH_DELIMITED:
            length, at = _varint(message, at)
            if at + length > len(message):
                raise RecordError(f"field {number} runs past the end of its message")
            yield number, message[at : at + length]
            at += length
        elif wire_type in (FIXED64, FIXED32):
            size = 8 if wire_type == FIXED64 else 4
            yield number, int.from_bytes(message[at : at + size], "little")
            at += size
        else:
            raise RecordError(f"field {number} has the unsupported wire type {wire_type}")


def _messages(message: bytes, number: int) -> list[bytes]:
    return [value for field, value in _fields(message) if field == number and isinstance(value, bytes)]


def _text(message: bytes, number: int) -> str:
    values = _messages(message, number)
    return values[-1].decode() if values else ""


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _encode(number: int, value: bytes) -> bytes:
    return _encode_varint(number << 3 | LENGTH_DELIMITED) + _encode_varint(len(value)) + value


@dataclass(frozen=True)
class Record:
    name: str
    labels: Mapping[str, str]
    # The Secret message itself (runtime.Unknown's raw), and the whole body as Helm sent it.
    secret: bytes
    body: bytes


def parse_record(body: bytes) -> Record:
    """Reads the name and labels of a protobuf-encoded Secret, as sent in a create or update."""
    if not body.startswith(MAGIC):
        raise RecordError(f"a release record must be sent as {MEDIA_TYPE} (the k8s\\0 envelope)")
    envelope = body[len(MAGIC) :]
    type_meta = _messages(envelope, 1)
    kind = _text(type_meta[-1], 2) if type_meta else ""
    if kind != "Secret":
        raise RecordError(f"a release record must be a Secret, not {kind or 'an unnamed kind'}")
    raws = _messages(envelope, 2)
    secret = raws[-1] if raws else b""
    metadata = _messages(secret, 1)
    name = _text(metadata[-1], 1) if metadata else ""
    if not name:
        raise RecordError("a release record must have metadata.name")
    labels = {_text(entry, 1): _text(entry, 2) for entry in _messages(metadata[-1], 11)}
    return Record(name, labels, secret, body)


def secret_list(records: list[Record]) -> bytes:
    """A protobuf SecretList of the records, in the envelope a list answer comes in."""
    type_meta = _encode(1, b"v1") + _encode(2, b"SecretList")
    items = _encode(1, b"") + b"".join(_encode(2, record.secret) for record in records)
    return MAGIC + _encode(1, type_meta) + _encode(2, items)
