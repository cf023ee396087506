"""Devices taken by prepares still under way, as every agent process on the node sees them.

A prepare takes its claim's exclusive devices in the node-wide turn and holds them until its
record is on disk; another agent process (the other pod of a rolling update) must see them taken
meanwhile. The table of these reservations lives in the state lock file, written and read only
under the node-wide lock, so taking a device costs one small in-place write instead of creating
and later replacing a record file on the state directory's disk (about 0.2 ms of CPU per claim).

A reservation stands only while its prepare runs: the preparing process holds the claim's lock
throughout, and that lock dies with the process, so an entry whose claim lock nobody else holds
is the leftover of a finished or crashed prepare and is dropped by whoever reads it next.
"""

from collections.abc import Iterable, Iterator

import msgspec

from dra_driver.base.compact_json import compact_json
from dra_driver.base.errors import OperatorFault
from dra_driver.base.strict_decode import DecodeError
from dra_driver.base.typed_decode import typed
from dra_driver.claims.identity import ClaimRef, InvalidClaimIdentity, claim_ref

TABLE_VERSION = 1


class InvalidReservationTable(OperatorFault, ValueError):
    """A reservation table that is not what this code writes."""


class Reservation(msgspec.Struct, frozen=True):
    claim: ClaimRef
    devices: tuple[str, ...]
    # The agent process that took them: a random token per process, so that a process can tell
    # its own entries (whose liveness it knows) from a peer's (judged by the peer's claim lock).
    owner: str


def _encoded_entry(reservation: Reservation) -> bytes:
    claim = reservation.claim
    entry = {
        "claim": {"namespace": claim.namespace, "name": claim.name, "uid": claim.uid},
        "devices": list(reservation.devices),
        "owner": reservation.owner,
    }
    return compact_json(entry)


_TABLE_START = b'{"version":%d,"reservations":[' % TABLE_VERSION
_TABLE_END = b"]}"


class ReservationTable:
    """The table as one process holds it, by claim UID. Every change is written whole, so each
    entry keeps its encoded JSON and writing joins bytes: encoding sixteen entries afresh on each
    of a claim's turns cost 40 µs."""

    def __init__(self, reservations: Iterable[Reservation] = ()) -> None:
        self._entries = {r.claim.uid: (r, _encoded_entry(r)) for r in reservations}

    def get(self, claim_uid: str) -> Reservation | None:
        entry = self._entries.get(claim_uid)
        return None if entry is None else entry[0]

    def add(self, reservation: Reservation) -> None:
        self._entries[reservation.claim.uid] = (reservation, _encoded_entry(reservation))

    def discard(self, claim_uid: str) -> None:
        self._entries.pop(claim_uid, None)

    def __iter__(self) -> Iterator[Reservation]:
        return (reservation for reservation, _ in self._entries.values())

    def encoded(self) -> bytes:
        return _TABLE_START + b",".join(encoded for _, encoded in self._entries.values()) + _TABLE_END


class _ClaimFile(msgspec.Struct, frozen=True):
    namespace: str
    name: str
    uid: str


class _EntryFile(msgspec.Struct, frozen=True):
    claim: _ClaimFile
    devices: tuple[str, ...]
    owner: str


class _Version(msgspec.Struct, frozen=True):
    """Read first, so that a table of another layout is refused by its version, not by a field."""

    version: int


class _TableFile(msgspec.Struct, frozen=True):
    """The table past its version, which `_Version` has read."""

    reservations: tuple[_EntryFile, ...]


def _reservation(entry: _EntryFile, where: str) -> Reservation:
    claim = entry.claim
    try:
        ref = claim_ref(claim.namespace, claim.name, claim.uid)
    except InvalidClaimIdentity as error:
        raise InvalidReservationTable(f"{where}.claim: {error}") from error
    return Reservation(claim=ref, devices=entry.devices, owner=entry.owner)


def decode_table(data: bytes) -> ReservationTable:
    """The table `encoded` wrote; an empty one (a lock file never written) has no entries."""
    if not data:
        return ReservationTable()
    try:
        document = msgspec.json.decode(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidReservationTable(f"not JSON: {error}") from error
    try:
        version = typed(document, _Version).version
        if version != TABLE_VERSION:
            raise InvalidReservationTable(f"version: expected {TABLE_VERSION}, got {version}")
        table = typed(document, _TableFile)
    except DecodeError as error:
        raise InvalidReservationTable(str(error)) from error
    return ReservationTable(
        _reservation(entry, f"reservations[{position}]") for position, entry in enumerate(table.reservations)
    )
