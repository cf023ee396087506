"""Which claim holds which exclusive device, agreed with every agent process on the node.

Another agent may share the state directory (the old and the new pod of a rolling update), so
this process's view is only a cache of two things on disk: the claim records, and the table of
reservations kept inside the node-wide state lock file (a prepare under way has no prepared
record yet, only its reservation). Ownership is checked and taken in one short turn of that lock,
without yielding to the event loop in between, and the turn first catches up with whatever a
peer changed since this process last looked.

A reservation counts while the claim lock of its prepare is held: a peer that died part-way lets
go of the lock with its life, and its reservation stops counting at once (its "preparing" record,
if it wrote one, still holds the devices until someone rolls it back).
"""

import secrets

import structlog

from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.record_store import ClaimRecordStore
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.reservations import Reservation, ReservationTable, decode_table
from dra_driver.state.shared_locks import ClaimLocks, SharedStateLock, StateTurn

log = structlog.get_logger("dra_driver.claims")


class DeviceOwnership:
    """The one mutable view of who holds what; the engine asks it before any side effect."""

    def __init__(self, records: ClaimRecordStore, claim_locks: ClaimLocks) -> None:
        self._records = records
        self._claim_locks = claim_locks
        self._state_lock = SharedStateLock(records.state_dir / "state.lock")
        # The records on disk and the reservations of the shared table as of this process's last
        # turn (a reservation as a "preparing" record): claims prepared or being prepared, by this
        # process or a peer.
        self._records_seen: dict[str, ClaimRecord] = {}
        self._owner_of_device: dict[str, ClaimRef] = {}
        # The shared table as this process last read or wrote it, less its own finished entries.
        self._reservations = ReservationTable()
        # Claims whose devices this process has reserved and whose prepare is still under way.
        self._reserving: set[str] = set()
        self._owner_token = secrets.token_hex(8)

    def close(self) -> None:
        self._state_lock.close()

    @property
    def prepared_claims(self) -> dict[str, ClaimRecord]:
        """Claims prepared on this node, by this process or a peer, as of the last turn."""
        return {uid: record for uid, record in self._records_seen.items() if record.state == "prepared"}

    def seen(self, claim_uid: str) -> ClaimRecord | None:
        """The claim's record (or reservation) as of the last turn; re-read it under the claim's
        lock before acting on its absence."""
        return self._records_seen.get(claim_uid)

    async def catch_up(self) -> None:
        """Reads everything afresh in a turn of its own (at start, after recovery)."""
        async with self._state_lock.hold() as turn:
            self._refresh_view(turn)

    async def reserve(self, ref: ClaimRef, keys: tuple[str, ...]) -> None:
        """Checks and takes ownership in one node-wide turn, with a reservation in the shared table
        that shows every agent process on the node the devices taken. Call it under the claim's
        lock: that lock is what keeps the reservation alive for peers."""
        if not keys:
            return
        async with self._state_lock.hold() as turn:
            if turn.stale:
                self._refresh_view(turn)
            holder = self._other_holder(ref, keys)
            if holder is not None and not turn.stale and self._is_peer_reservation(holder[1]):
                # The peer's prepare may have ended since this process last looked: look again
                # (a view refreshed in this very turn is as fresh as a second look would be).
                self._refresh_view(turn)
                holder = self._other_holder(ref, keys)
            if holder is not None:
                key, other = holder
                raise ClaimRejected(
                    f"claim {ref}: device {key} is already prepared for claim {other}; "
                    "it is exclusive and can serve one claim at a time"
                )
            reservation = Reservation(claim=ref, devices=keys, owner=self._owner_token)
            self._reservations.add(reservation)
            self._reserving.add(ref.uid)
            turn.changed(self._reservations.encoded())
            self._records_seen[ref.uid] = _reservation_record(reservation)
            for key in keys:
                self._owner_of_device[key] = ref

    def fulfilled(self, record: ClaimRecord) -> None:
        """The claim's prepared record, now on disk, holds its devices. Its reservation leaves this
        process's table now and the shared one with the next change written; until then peers see
        it ended (the claim lock is free) and go by the record. So only this process's view
        changes, and no turn is taken for it on the pod-startup path."""
        claim_uid = record.claim.uid
        self._records_seen[claim_uid] = record
        self._reserving.discard(claim_uid)
        self._reservations.discard(claim_uid)

    async def release(self, claim: ClaimRef) -> None:
        """Gives up the claim's devices, after its record is gone from disk."""
        async with self._state_lock.hold() as turn:
            self._reserving.discard(claim.uid)
            if turn.stale:
                self._refresh_view(turn)
            else:
                self._records_seen.pop(claim.uid, None)
                for key in [key for key, holder in self._owner_of_device.items() if holder == claim]:
                    del self._owner_of_device[key]
            self._reservations.discard(claim.uid)
            turn.changed(self._reservations.encoded())

    def _refresh_view(self, turn: StateTurn) -> None:
        """Catches up with the records on disk and the shared table, which a peer process may have
        changed. Reservations are judged before the records are read: one whose prepare finished
        meanwhile is then found by its record."""
        self._reservations = ReservationTable(filter(self._under_way, self._shared_table(turn)))
        self._records_seen = self._records.read_all()
        for reservation in self._reservations:
            self._records_seen.setdefault(reservation.claim.uid, _reservation_record(reservation))
        self._owner_of_device = {}
        for record in self._records_seen.values():
            self._take_devices(record)

    def _shared_table(self, turn: StateTurn) -> ReservationTable:
        try:
            return decode_table(turn.table())
        except ValueError as error:
            # Only a foreign write can do this; the records on disk still hold every prepared claim.
            log.error("the state lock file's reservation table is unreadable; ignoring it", reason=str(error))
            return ReservationTable()

    def _under_way(self, reservation: Reservation) -> bool:
        """Whether the prepare that made `reservation` still runs (its claim lock is held)."""
        if reservation.owner == self._owner_token:
            return reservation.claim.uid in self._reserving
        return self._claim_locks.held_elsewhere(reservation.claim.uid)

    def _take_devices(self, record: ClaimRecord) -> None:
        for key in record.exclusive_keys:
            holder = self._owner_of_device.setdefault(key, record.claim)
            if holder != record.claim:
                log.error(
                    "two prepared claims hold one device",
                    device=key,
                    claim_namespace=record.claim.namespace,
                    claim_name=record.claim.name,
                    claim_uid=record.claim.uid,
                    other_claim=str(holder),
                )

    def _other_holder(self, ref: ClaimRef, keys: tuple[str, ...]) -> tuple[str, ClaimRef] | None:
        for key in keys:
            holder = self._owner_of_device.get(key)
            if holder is not None and holder != ref:
                return key, holder
        return None

    def _is_peer_reservation(self, claim: ClaimRef) -> bool:
        reservation = self._reservations.get(claim.uid)
        return reservation is not None and reservation.owner != self._owner_token


def _reservation_record(reservation: Reservation) -> ClaimRecord:
    """A reservation as the view holds it: the record its prepare will replace."""
    return ClaimRecord(claim=reservation.claim, devices=(), state="preparing", reserved=reservation.devices)
