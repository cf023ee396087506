"""Change counters shared by every agent process on the node: one small file per key.

A process that keeps a view of shared durable state in memory (the claims that use a GPU's MPS
daemon) must know when a peer process (the other pod of a rolling update) changed that state
behind its back. Whoever changes the state bumps the key's counter after the durable write, under
the lock that guards the key; whoever holds that lock and finds the counter other than the value
it last saw or wrote reads the durable state afresh. The counter only says "look again": it is
never the truth, so it needs no fsync (after a reboot every process starts from the records, and
a crashed process's writes are in the page cache), and a missing or short file reads as 0.
"""

import os
from pathlib import Path

_COUNTER_BYTES = 8


class ChangeCounters:
    """Counters under `directory`, one file per key; a key must be a valid file name."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    def read(self, key: str) -> int:
        try:
            fd = os.open(self._directory / key, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0
        try:
            return int.from_bytes(os.pread(fd, _COUNTER_BYTES, 0).ljust(_COUNTER_BYTES, b"\0"), "little")
        finally:
            os.close(fd)

    def bump(self, key: str) -> int:
        """The key's counter plus one, written; call it holding the key's lock."""
        self._directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._directory / key, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            counter = int.from_bytes(os.pread(fd, _COUNTER_BYTES, 0).ljust(_COUNTER_BYTES, b"\0"), "little")
            counter = (counter + 1) % (1 << (8 * _COUNTER_BYTES))
            os.pwrite(fd, counter.to_bytes(_COUNTER_BYTES, "little"), 0)
            return counter
        finally:
            os.close(fd)
