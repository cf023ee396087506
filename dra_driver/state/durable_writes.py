"""Durable file writes off the event loop, each flushed on its own.

With `--flush-records` each claim's record must be on stable storage before kubelet hears
"done" (without it records are left to the page cache: claims/record_store.py). Durability: a
caller hears "done" only after its data, and the name that exposes it, are on stable storage.
Each operation is durable_files' durable form: the data goes to a temporary sibling
(`.{name}.{random}.tmp`, the naming ClaimRecordStore.load_all sweeps after a crash), which is
fsynced, then given its name, and the directory is fsynced; a removal fsyncs the directory.

Three operations: `create` (a file that must not exist yet: a new claim's record; linked, so a
name that exists is refused and left as it is), `replace` (renamed over the target) and
`remove`. Operations on one path take effect in submission order; operations on different
paths run concurrently (a journaled filesystem can serve concurrent fsyncs with one commit).

This replaced a group commit that batched concurrent operations and flushed each batch with one
`syncfs(2)` (issue 50, part 6). On a real kubelet it saved nothing a pod start shows, and syncfs
flushes every dirty page of the filesystem, other writers' (container layers, logs) too, which
made its slow stretches; an fsync pays for our own file alone.
"""

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache, partial

from dra_driver.state import durable_files
from dra_driver.state.durable_files import StrPath

# A kubelet call carries tens of claims at most, whose fsyncs end in the same few journal
# commits: more threads would only wait on those.
_WORKERS = 16


@cache
def _workers() -> ThreadPoolExecutor:
    """The threads the writes run in, rather than the event loop's default executor
    (`asyncio.to_thread`): that one also runs slow blocking work (an MPS daemon's launch waits
    for the daemon, sysfs binding, NVML loading), and has only CPUs + 4 threads, so a record
    write, which kubelet's answer waits for, could queue behind it. Shared by every writer of
    the process; the threads are named in a stack dump."""
    return ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="durable-writes")


class DurableWriter:
    """Creates, replaces and removes files durably, each operation in a worker thread so the
    event loop never blocks.

    Each operation runs as a task of its own, which its caller awaits shielded: a caller
    cancelled meanwhile only stops waiting, and the operation still completes whole (the steps
    are atomic: the file holds the old content or the new, never part of either). An operation
    starts when the one submitted before it on the same path has settled, even where that one's
    caller was cancelled, so a later write of a file never overtakes an earlier one.
    """

    def __init__(self) -> None:
        # Per path, the last operation submitted that has not settled. It holds the tasks too:
        # the event loop keeps only weak references to them.
        self._last: dict[str, asyncio.Task[None]] = {}

    async def create(self, path: StrPath, data: bytes, mode: int = 0o600) -> None:
        """Durably creates path with data; raises FileExistsError, changing nothing, if it exists."""
        await self._run(path, partial(durable_files.create_new, path, data, durable=True, mode=mode))

    async def replace(self, path: StrPath, data: bytes, mode: int = 0o600) -> None:
        """Durably and atomically replaces path's content with data (mode applies to a new file)."""
        await self._run(path, partial(durable_files.atomic_write, path, data, durable=True, mode=mode))

    async def remove(self, path: StrPath) -> None:
        """Durably removes path; one that is already missing is fine."""
        await self._run(path, partial(durable_files.remove, path, durable=True))

    async def _run(self, path: StrPath, work: Callable[[], object]) -> None:
        key = os.fspath(path)
        task = asyncio.create_task(_after(self._last.get(key), work))
        self._last[key] = task
        task.add_done_callback(partial(self._settled, key))
        await asyncio.shield(task)

    def _settled(self, key: str, task: asyncio.Task[None]) -> None:
        if self._last.get(key) is task:
            del self._last[key]


async def _after(previous: asyncio.Task[None] | None, work: Callable[[], object]) -> None:
    """`work` in a worker thread, once `previous` (the same path's) has settled; its outcome is
    its own caller's."""
    if previous is not None:
        await asyncio.wait([previous])
    await asyncio.get_running_loop().run_in_executor(_workers(), work)
