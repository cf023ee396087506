"""The stand-in's reading of Helm's protobuf release records (tests/support/release_records.py).

The bytes below are written out by hand from the protobuf wire format, so that the reader is not
checked against an encoder of its own; tests/api/test_helm_chart.py runs it on what Helm sends.
"""

import pytest

from tests.support.release_records import MAGIC, RecordError, parse_record, secret_list

# ObjectMeta {1 name: "r.v1", 11 labels: {owner: helm}, 11 labels: {status: deployed}}
METADATA = b"\x0a\x04r.v1" + b"\x5a\x0d\x0a\x05owner\x12\x04helm" + b"\x5a\x12\x0a\x06status\x12\x08deployed"
SECRET = b"\x0a\x29" + METADATA  # Secret {1 metadata}
TYPE_META = b"\x0a\x0c\x0a\x02v1\x12\x06Secret"  # Unknown {1 typeMeta {apiVersion, kind}}
BODY = MAGIC + TYPE_META + b"\x12\x2b" + SECRET  # ... {2 raw: the Secret}


def test_the_name_and_labels_are_read_and_the_body_kept() -> None:
    record = parse_record(BODY)

    assert (record.name, dict(record.labels)) == ("r.v1", {"owner": "helm", "status": "deployed"})
    assert (record.secret, record.body) == (SECRET, BODY)


def test_a_list_wraps_the_secrets_as_items() -> None:
    listed = secret_list([parse_record(BODY), parse_record(BODY)])

    list_type = b"\x0a\x10\x0a\x02v1\x12\x0aSecretList"
    items = b"\x0a\x00" + (b"\x12\x2b" + SECRET) * 2  # {1 metadata: {}, 2 items, 2 items}
    assert listed == MAGIC + list_type + b"\x12" + bytes([len(items)]) + items


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"kind": "Secret"}', "must be sent as application/vnd.kubernetes.protobuf"),
        (MAGIC + b"\x0a\x10\x0a\x02v1\x12\x0aConfigMapX", "must be a Secret, not ConfigMapX"),
        (MAGIC + TYPE_META + b"\x12\x02\x0a\x00", "must have metadata.name"),
        (MAGIC + TYPE_META + b"\x12\x7f", "field 2 runs past the end"),
        (MAGIC + TYPE_META + b"\x13", "unsupported wire type 3"),
    ],
)
def test_anything_else_is_refused_with_the_reason(body: bytes, problem: str) -> None:
    with pytest.raises(RecordError, match=problem):
        parse_record(body)
