"""Locks shared by every agent process on the node, for rolling updates.

During a rolling update the old and the new agent pod run side by side on one state directory,
and kubelet may send a claim's prepare to one and its unprepare to the other. Three locks keep
them correct together without serialising unrelated claims:

- `ClaimLocks`: one lock per claim UID, so two processes never work on the same claim at once
  (a byte-range lock of one shared file, also dying with its process);
- `SharedStateLock`: a short node-wide turn for reading and changing who holds which device,
  with a change counter that tells a process when a peer changed the records since its last turn,
  and a small table (the reservations of prepares under way) kept in the lock file itself;
- `try_exclusive`: the one-owner lock that decides which agent publishes the ResourceSlices.

All of them die with their process, so a crashed peer never leaves one held. Waiting polls with
non-blocking attempts instead of blocking a thread: a thread blocked on a lock cannot be
cancelled and would take the lock after its caller gave up, holding it for good.
"""

import asyncio
import fcntl
import hashlib
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import msgspec

from dra_driver.base.backoff import Backoff
from dra_driver.base.errors import OperatorFault
from dra_driver.state.keyed_locks import KeyedLocks, KeyHold

_FIRST_POLL_SECONDS = 0.001
_LONGEST_POLL_SECONDS = 0.02
_COUNTER_BYTES = 8
# The shared table has two slots; a change writes the one the new counter picks, then the counter,
# so a process killed half-way through writing leaves the slot the old counter picks whole.
_TABLE_SLOTS = (4096, 4096 + 4 * 1024 * 1024)
_TABLE_HEADER = struct.Struct("<II")  # payload length, CRC-32 of the payload
MAX_TABLE_BYTES = _TABLE_SLOTS[1] - _TABLE_SLOTS[0] - _TABLE_HEADER.size


class InvalidSharedTable(OperatorFault, ValueError):
    """A table slot of the state lock file that is not what this code writes."""


def open_lock_file(path: Path) -> int:
    """A descriptor to lock, its directory made if missing: the file is only ever a lock (the
    state lock's also holds its counter and table), never replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def try_exclusive(fd: int) -> bool:
    """Takes the lock on `fd` if nobody else holds it; never waits."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


async def exclusive(fd: int, longest_poll: float = _LONGEST_POLL_SECONDS) -> None:
    """Takes the lock on `fd`, waiting as long as it takes; `longest_poll` bounds how late a
    waiter notices that the holder let go."""
    await _wait_for(lambda: try_exclusive(fd), longest_poll)


async def _wait_for(take: Callable[[], bool], longest_poll: float = _LONGEST_POLL_SECONDS) -> None:
    if take():
        return
    # Built only by a waiter: an uncontended lock (every prepare's usual case) costs nothing more.
    polls = Backoff(first=min(_FIRST_POLL_SECONDS, longest_poll), cap=longest_poll)
    failures = 1
    while True:
        await asyncio.sleep(polls.delay(failures))
        if take():
            return
        failures += 1


class StateTurn(msgspec.Struct):
    """One holder's turn: `stale` says a peer changed the records since this process last looked;
    `changed(table)` tells peers that this turn did, and leaves them `table` (which every change
    writes whole, so a turn that changed only records passes the table it read or kept)."""

    stale: bool
    _read_table: Callable[[], bytes]
    _new_table: bytes | None = None

    def table(self) -> bytes:
        """The shared table as the last change left it (empty if none was ever written)."""
        return self._read_table()

    def changed(self, table: bytes) -> None:
        if len(table) > MAX_TABLE_BYTES:
            raise ValueError(f"the shared table would take {len(table)} bytes; at most {MAX_TABLE_BYTES} fit")
        self._new_table = table


class SharedStateLock:
    """The node-wide turn, held only for in-memory checks and small non-durable writes.

    The change counter and the table live in the lock file itself and are only read and written
    under the lock; they need no fsync, because after a reboot every process starts from the
    records anyway, and a crash short of one loses nothing written to the page cache.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = open_lock_file(path)
        # flock does not exclude two coroutines of one process (they share the descriptor).
        self._turns = asyncio.Lock()
        self._seen: int | None = None

    def _counter(self) -> int:
        return int.from_bytes(os.pread(self._fd, _COUNTER_BYTES, 0).ljust(_COUNTER_BYTES, b"\0"), "little")

    def hold(self) -> "StateHold":
        """`async with` a turn (see StateHold)."""
        return StateHold(self)

    async def _begin(self) -> tuple[StateTurn, int]:
        await self._turns.acquire()
        try:
            await exclusive(self._fd)
            try:
                counter = self._counter()
            except BaseException:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                raise
        except BaseException:
            self._turns.release()
            raise
        turn = StateTurn(stale=counter != self._seen, _read_table=lambda: self._table(counter))
        self._seen = None  # unless the turn ends well: a half-refreshed view is looked at again
        return turn, counter

    def _end(self, turn: StateTurn, counter: int, ended_well: bool) -> None:
        try:
            if turn._new_table is not None:
                counter += 1
                self._write_table(counter, turn._new_table)
                os.pwrite(self._fd, counter.to_bytes(_COUNTER_BYTES, "little"), 0)
            if ended_well:
                self._seen = counter
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._turns.release()

    def _table(self, counter: int) -> bytes:
        offset = _TABLE_SLOTS[counter % 2]
        header = os.pread(self._fd, _TABLE_HEADER.size, offset)
        if len(header) < _TABLE_HEADER.size or header == bytes(_TABLE_HEADER.size):
            return b""  # never written: a new lock file, or one from before the table
        length, checksum = _TABLE_HEADER.unpack(header)
        where = f"{self._path}: table slot at byte {offset}"
        if length > MAX_TABLE_BYTES:
            raise InvalidSharedTable(f"{where}: length {length} exceeds {MAX_TABLE_BYTES}")
        payload = os.pread(self._fd, length, offset + _TABLE_HEADER.size)
        if len(payload) != length or zlib.crc32(payload) != checksum:
            raise InvalidSharedTable(f"{where}: the payload does not match its length and checksum")
        return payload

    def _write_table(self, counter: int, table: bytes) -> None:
        header = _TABLE_HEADER.pack(len(table), zlib.crc32(table))
        os.pwrite(self._fd, header + table, _TABLE_SLOTS[counter % 2])

    def close(self) -> None:
        os.close(self._fd)


class ClaimLocks:
    """One lock per claim UID, across this process's coroutines and every agent process.

    All claims share one lock file: each claim locks one byte of it, at an offset hashed from its
    UID, with an open-file-description lock (fcntl F_OFD_SETLK). Like flock, such a lock belongs to
    this descriptor and dies with the process; unlike a lock file per claim it costs no file
    creation and removal on the state directory's disk, two system calls instead of five. Two
    UIDs that hash to the same byte (48 bits: about one pair in 10^14) only wait on each other.
    """

    def __init__(self, path: Path) -> None:
        self._fd = open_lock_file(path)
        # Locks of one open file description never exclude each other: coroutines queue here.
        self._local = KeyedLocks()

    def hold(self, claim_uid: str) -> "ClaimHold":
        return ClaimHold(self._fd, self._local.hold(offset := _offset_of(claim_uid)), offset)

    def held_elsewhere(self, claim_uid: str) -> bool:
        """Whether another process holds the claim's lock now (this process's own never count:
        locks of one open file description do not conflict)."""
        query = _one_byte(fcntl.F_WRLCK, _offset_of(claim_uid))
        lock_type: int = _FLOCK.unpack(fcntl.fcntl(self._fd, fcntl.F_OFD_GETLK, query))[0]
        return lock_type != fcntl.F_UNLCK

    def close(self) -> None:
        os.close(self._fd)

    def __len__(self) -> int:
        return len(self._local)


class StateHold:
    """One turn of the node-wide lock: this process's coroutines queue on an asyncio lock, then
    the file is locked against other processes; a turn that changed the table writes it, and
    its new counter, before letting go. A class rather than an async generator, as KeyHold is
    (twice per prepare and unprepare)."""

    __slots__ = ("_counter", "_lock", "_turn")

    def __init__(self, lock: SharedStateLock) -> None:
        self._lock = lock
        self._turn: StateTurn | None = None
        self._counter = 0

    async def __aenter__(self) -> StateTurn:
        self._turn, self._counter = await self._lock._begin()
        return self._turn

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        assert self._turn is not None
        self._lock._end(self._turn, self._counter, ended_well=kind is None)


class ClaimHold:
    """`async with` a claim's lock: this process's coroutines queue on the key's asyncio lock,
    then the byte is locked against other processes. A class rather than an async generator, as
    KeyHold is (twice per prepare and unprepare)."""

    __slots__ = ("_fd", "_local", "_offset")

    def __init__(self, fd: int, local: KeyHold, offset: int) -> None:
        self._fd = fd
        self._local = local
        self._offset = offset

    async def __aenter__(self) -> None:
        await self._local.__aenter__()
        try:
            await _wait_for(lambda: _try_lock_byte(self._fd, self._offset))
        except BaseException:
            await self._local.__aexit__(None, None, None)
            raise

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            _unlock_byte(self._fd, self._offset)
        finally:
            await self._local.__aexit__(kind, error, trace)


# struct flock as Linux lays it out on 64-bit machines: l_type, l_whence, l_start, l_len, l_pid.
_FLOCK = struct.Struct("hhqqi4x")


def _offset_of(claim_uid: str) -> int:
    return int.from_bytes(hashlib.blake2b(claim_uid.encode(), digest_size=6).digest(), "little")


def _one_byte(lock_type: int, offset: int) -> bytes:
    """A struct flock for the byte at `offset` (l_pid 0, as OFD locks require)."""
    return _FLOCK.pack(lock_type, os.SEEK_SET, offset, 1, 0)


def _try_lock_byte(fd: int, offset: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _one_byte(fcntl.F_WRLCK, offset))
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: another holder
        return False
    return True


def _unlock_byte(fd: int, offset: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _one_byte(fcntl.F_UNLCK, offset))
