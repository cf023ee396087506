"""Records of prepared claims: one file per claim under <state-dir>/claims.

Everything needed to undo a prepare is written here before kubelet is told the claim is ready
(the two phases are on `ClaimRecord`). One file per claim keeps writes small and independent.

Every write is atomic (a temporary file renamed or linked into place), so no process, a peer
agent or this one after a crash, ever reads half a record. Whether a write is also flushed to
stable storage before kubelet hears "done" is the store's `flush` setting, off in the agent by
default: a record only has to outlive the agent process, which the page cache does, because
after a reboot, the one event that loses unflushed writes, every record is dropped unread
(`boot_changed`: the MIG instances, MPS daemons and CDI specs it describes are gone too). The
boot ID the records are compared with is itself written with a flush, at start, before any
record of this boot.
"""

import os
import time
from contextlib import suppress
from pathlib import Path

import msgspec

from dra_driver.claims.record_codec import record_bytes, record_from_json
from dra_driver.claims.records import ClaimRecord, CorruptRecord
from dra_driver.state import durable_files
from dra_driver.state.durable_writes import DurableWriter

BOOT_ID_FILE = "boot_id"
# A temporary record file this old was left by a crash, not by a write still under way.
ABANDONED_WRITE_SECONDS = 60.0

_SUFFIX = ".json"


class QuarantinedRecord(msgspec.Struct, frozen=True):
    path: Path
    problem: str


def _record_in(path: durable_files.StrPath) -> ClaimRecord:
    """The record in `path`; raises ValueError (CorruptRecord among them) or UnicodeDecodeError
    for a file that is not one this code writes, or not under its claim's name."""
    return _decoded(path, durable_files.read_whole(path))


def _decoded(path: durable_files.StrPath, data: bytes) -> ClaimRecord:
    record = record_from_json(msgspec.json.decode(data))
    if os.path.basename(path) != f"{record.claim.uid}{_SUFFIX}":
        raise CorruptRecord(f"file name does not match claim UID {record.claim.uid}")
    return record


def _encoded(record: ClaimRecord) -> bytes:
    return record_bytes(record)


class ClaimRecordStore:
    """Record files under <state-dir>/claims, named by claim UID (checked before it gets here)."""

    def __init__(self, state_dir: Path, *, flush: bool = True) -> None:
        """`flush`: every write is on stable storage when it returns, each flushed on its own
        in a worker thread (state/durable_writes.py); without it writes are made in place, on
        the event loop, and left to the page cache (see the module docstring)."""
        self.state_dir = state_dir
        self.directory = state_dir / "claims"
        self._flush = flush
        self._durable = DurableWriter()
        self._directory_prefix = f"{self.directory}{os.sep}"
        # Per claim UID, the bytes of its record as this process last wrote or read them, and
        # the record they decode to: a read that finds the same bytes on disk skips decoding
        # them again (every unprepare reads the record prepare wrote; issue 31). A peer's
        # change shows as other bytes, so the disk stays the truth.
        self._known: dict[str, tuple[bytes, ClaimRecord]] = {}

    @property
    def flushes(self) -> bool:
        """Whether a write waits for stable storage."""
        return self._flush

    def _path(self, claim_uid: str) -> str:
        # A string, not a Path: built on every prepare and unprepare.
        return f"{self._directory_prefix}{claim_uid}{_SUFFIX}"

    def load_all(self) -> tuple[dict[str, ClaimRecord], list[QuarantinedRecord]]:
        """Every readable record by UID; unreadable ones are renamed to *.corrupt and reported."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_abandoned_writes()
        records: dict[str, ClaimRecord] = {}
        quarantined = []
        for path in sorted(self.directory.glob(f"*{_SUFFIX}")):
            try:
                record = _record_in(path)
            except (ValueError, UnicodeDecodeError) as error:
                aside = path.with_name(path.name + ".corrupt")
                path.rename(aside)
                quarantined.append(QuarantinedRecord(path=aside, problem=str(error)))
                continue
            records[record.claim.uid] = record
        return records, quarantined

    def _remove_abandoned_writes(self) -> None:
        """Temporary files of writes cut short by a crash. Only old ones: a young one may be the
        write of another agent process (a rolling update) that is about to rename it."""
        cutoff = time.time() - ABANDONED_WRITE_SECONDS
        for leftover in self.directory.glob(".*.tmp"):
            with suppress(FileNotFoundError):
                if leftover.stat().st_mtime < cutoff:
                    leftover.unlink()

    def drop_all(self) -> int:
        """Removes every record and temporary record file, unread (after a reboot); returns how
        many records there were. Quarantined files stay for the operator."""
        dropped = 0
        if not self.directory.is_dir():
            return dropped
        for path in self.directory.iterdir():
            if path.name.endswith(_SUFFIX):
                dropped += durable_files.unlink_if_present(path)
            elif path.name.endswith(".tmp"):
                durable_files.unlink_if_present(path)
        if self._flush:
            durable_files.fsync_directory(self.directory)
        return dropped

    def read(self, claim_uid: str) -> ClaimRecord | None:
        """The claim's record as on disk now, which another agent process may have written."""
        path = self._path(claim_uid)
        try:
            data = durable_files.read_whole(path)
        except FileNotFoundError:
            self._known.pop(claim_uid, None)
            return None
        known = self._known.get(claim_uid)
        if known is not None and known[0] == data:
            return known[1]
        try:
            record = _decoded(path, data)
        except (ValueError, UnicodeDecodeError) as error:
            raise CorruptRecord(f"record of claim {claim_uid}: {error}") from error
        self._known[claim_uid] = (data, record)
        return record

    def read_all(self) -> dict[str, ClaimRecord]:
        """Every readable record, touching nothing: unreadable ones are set aside at start only."""
        records = {}
        for path in self.directory.glob(f"*{_SUFFIX}"):
            with suppress(FileNotFoundError, ValueError, UnicodeDecodeError):
                record = _record_in(path)
                records[record.claim.uid] = record
        return records

    def save(self, record: ClaimRecord) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        data = _encoded(record)
        durable_files.atomic_write(self._path(record.claim.uid), data, durable=self._flush, mode=0o600)
        self._known[record.claim.uid] = (data, record)

    def delete(self, claim_uid: str) -> None:
        self._known.pop(claim_uid, None)
        durable_files.remove(self._path(claim_uid), durable=self._flush)

    async def write(self, record: ClaimRecord) -> None:
        """`save`, flushed on return where the store flushes."""
        # The directory exists: load_all, which every start runs first, made it.
        data = _encoded(record)
        if self._flush:
            self._directory_made()
            await self._durable.replace(self._path(record.claim.uid), data, mode=0o600)
        else:
            durable_files.atomic_write(self._path(record.claim.uid), data, durable=False, mode=0o600)
        self._known[record.claim.uid] = (data, record)

    async def create(self, record: ClaimRecord) -> None:
        """`write` of a claim that has no record yet, which its caller checked under the claim's
        lock: it raises FileExistsError rather than replace a record that is there after all."""
        data = _encoded(record)
        if self._flush:
            self._directory_made()
            await self._durable.create(self._path(record.claim.uid), data, mode=0o600)
        else:
            durable_files.create_new(self._path(record.claim.uid), data, durable=False, mode=0o600)
        self._known[record.claim.uid] = (data, record)

    def _directory_made(self) -> None:
        """A flushed write costs a disk flush, beside which this check is nothing: an engine used
        before `load_all` (a test's, a tool's) still finds its directory, as `save` makes it."""
        self.directory.mkdir(parents=True, exist_ok=True)

    async def erase(self, claim_uid: str) -> None:
        """`delete`, flushed on return where the store flushes."""
        self._known.pop(claim_uid, None)
        if self._flush:
            await self._durable.remove(self._path(claim_uid))
        else:
            self.delete(claim_uid)

    def _recorded_boot_id(self) -> str | None:
        try:
            return (self.directory.parent / BOOT_ID_FILE).read_text().strip()
        except FileNotFoundError:
            return None

    def read_all_of_boot(self, boot_id: str) -> dict[str, ClaimRecord]:
        """`read_all`, or nothing where the records are of an earlier boot: start-up drops those
        unread (`boot_changed`), and what they describe is gone with the reboot."""
        previous = self._recorded_boot_id()
        return self.read_all() if previous in (None, boot_id) else {}

    def boot_changed(self, boot_id: str) -> bool:
        """Whether the node rebooted since the state was written (and remember this boot).

        MIG instances and the CDI directory (a tmpfs) do not survive a reboot, so records of an
        earlier boot describe side effects that no longer exist."""
        path = self.directory.parent / BOOT_ID_FILE
        previous = self._recorded_boot_id()
        if previous != boot_id:
            path.parent.mkdir(parents=True, exist_ok=True)
            durable_files.atomic_write(path, f"{boot_id}\n".encode(), durable=True, mode=0o600)
        return previous is not None and previous != boot_id
