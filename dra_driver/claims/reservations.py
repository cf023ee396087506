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

import json
from collections.abc import Iterable
from dataclasses import dataclass

from dra_driver.claims.identity import ClaimRef, InvalidClaimIdentity, claim_ref

TABLE_VERSION = 1


class InvalidReservationTable(ValueError):
    """A reservation table that is not what this code writes."""


@dataclass(frozen=True, slots=True)
class Reservation:
    claim: ClaimRef
    devices: tuple[str, ...]
    # The agent process that took them: a random token per process, so that a process can tell
    # its own entries (whose liveness it knows) from a peer's (judged by the peer's claim lock).
    owner: str


def encode_table(reservations: Iterable[Reservation]) -> bytes:
    return json.dumps(
        {
            "version": TABLE_VERSION,
            "reservations": [
                {
                    "claim": {"namespace": r.claim.namespace, "name": r.claim.name, "uid": r.claim.uid},
                    "devices": list(r.devices),
                    "owner": r.owner,
                }
                for r in reservations
            ],
        },
        separators=(",", ":"),
    ).encode()


def _text(entry: dict[str, object], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        raise InvalidReservationTable(f"{where}.{key}: expected a string")
    return value


def _reservation(entry: object, where: str) -> Reservation:
    if not isinstance(entry, dict):
        raise InvalidReservationTable(f"{where}: expected an object")
    claim = entry.get("claim")
    if not isinstance(claim, dict):
        raise InvalidReservationTable(f"{where}.claim: expected an object")
    devices = entry.get("devices")
    if not isinstance(devices, list) or not all(isinstance(device, str) for device in devices):
        raise InvalidReservationTable(f"{where}.devices: expected a list of strings")
    try:
        ref = claim_ref(
            _text(claim, "namespace", f"{where}.claim"),
            _text(claim, "name", f"{where}.claim"),
            _text(claim, "uid", f"{where}.claim"),
        )
    except InvalidClaimIdentity as error:
        raise InvalidReservationTable(f"{where}.claim: {error}") from error
    return Reservation(claim=ref, devices=tuple(devices), owner=_text(entry, "owner", where))


def decode_table(data: bytes) -> dict[str, Reservation]:
    """The reservations by claim UID; an empty table (a lock file never written) has none."""
    if not data:
        return {}
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidReservationTable(f"not JSON: {error}") from error
    if not isinstance(document, dict):
        raise InvalidReservationTable("expected an object")
    if document.get("version") != TABLE_VERSION:
        raise InvalidReservationTable(f"version: expected {TABLE_VERSION}, got {document.get('version')!r}")
    entries = document.get("reservations")
    if not isinstance(entries, list):
        raise InvalidReservationTable("reservations: expected a list")
    table = {}
    for position, entry in enumerate(entries):
        reservation = _reservation(entry, f"reservations[{position}]")
        table[reservation.claim.uid] = reservation
    return table
