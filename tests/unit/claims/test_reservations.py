"""The shared reservation table: what one agent process writes, another reads back exactly, and
anything else is refused naming the field."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.claims.identity import claim_ref
from dra_driver.claims.reservations import (
    InvalidReservationTable,
    Reservation,
    ReservationTable,
    decode_table,
)

UIDS = ("0f1e2d3c-4b5a-4968-8776-655443322110", "6a0c9c2e-1b7f-4d3a-9e58-2f4b7c1d0e93")


def reservation(number: int, devices: tuple[str, ...] = ("gpu-0",), owner: str = "a1b2") -> Reservation:
    return Reservation(claim_ref("default", f"claim-{number}", UIDS[number]), devices, owner)


def test_a_table_reads_back_as_written_and_changes_in_place() -> None:
    table = ReservationTable([reservation(0), reservation(1, ("gpu-1", "gpu-2"), "c3d4")])
    assert list(decode_table(table.encoded())) == list(table)
    table.discard(UIDS[0])
    table.discard(UIDS[0])  # what is not there is fine
    table.add(reservation(1, ("gpu-3",)))
    assert list(decode_table(table.encoded())) == [reservation(1, ("gpu-3",))]
    assert decode_table(table.encoded()).get(UIDS[0]) is None
    document = json.loads(table.encoded())
    assert document["version"] == 1 and document["reservations"][0]["devices"] == ["gpu-3"]


def test_nothing_written_yet_is_an_empty_table() -> None:
    assert list(decode_table(b"")) == []
    assert list(decode_table(ReservationTable().encoded())) == []


@given(
    st.lists(
        st.tuples(
            st.lists(st.text(alphabet="abcdefgh-0123456789", min_size=1, max_size=20), max_size=4),
            st.text(min_size=1, max_size=12),
        ),
        max_size=2,
    )
)
def test_any_devices_and_owner_survive_the_round_trip(entries: list[tuple[list[str], str]]) -> None:
    table = ReservationTable(
        Reservation(claim_ref("ns", f"c{number}", UIDS[number]), tuple(devices), owner)
        for number, (devices, owner) in enumerate(entries)
    )
    assert list(decode_table(table.encoded())) == list(table)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "^expected an object, got a list$"),
        (b'{"version":2,"reservations":[]}', "version: expected 1, got 2"),
        (b'{"version":1}', "^reservations: required$"),
        (b'{"version":"1"}', '^version: expected an integer, got the string "1"$'),
        (b'{"version":1,"reservations":[7]}', r"^reservations\[0\]: expected an object, got the integer 7$"),
        (
            b'{"version":1,"reservations":[{"devices":[],"owner":"x"}]}',
            r"^reservations\[0\].claim: required$",
        ),
        (
            b'{"version":1,"reservations":[{"claim":{"namespace":"d","name":"n","uid":"%s"},'
            b'"devices":"gpu-0","owner":"x"}]}' % UIDS[0].encode(),
            r'^reservations\[0\].devices: expected a list, got the string "gpu-0"$',
        ),
        (
            b'{"version":1,"reservations":[{"claim":{"namespace":"d","name":"n","uid":"%s"},'
            b'"devices":["gpu-0",1],"owner":"x"}]}' % UIDS[0].encode(),
            r"^reservations\[0\].devices\[1\]: expected a string, got the integer 1$",
        ),
        (
            b'{"version":1,"reservations":[{"claim":{"namespace":"d","name":"n","uid":"%s"},'
            b'"devices":[],"owner":3}]}' % UIDS[0].encode(),
            r"^reservations\[0\].owner: expected a string, got the integer 3$",
        ),
        (
            b'{"version":1,"reservations":[{"claim":{"namespace":"d","name":"n","uid":"../x"},'
            b'"devices":[],"owner":"x"}]}',
            r"reservations\[0\].claim: invalid claim identity: uid",
        ),
    ],
)
def test_a_table_that_is_not_ours_is_refused_naming_the_field(data: bytes, problem: str) -> None:
    with pytest.raises(InvalidReservationTable, match=problem):
        decode_table(data)
