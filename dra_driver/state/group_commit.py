"""Group commit: one filesystem flush makes many concurrent file changes durable.

Kubelet prepares and unprepares claims in overlapping calls, and with `--flush-records` each
claim's record must be on stable storage before kubelet hears "done" (without it records are
left to the page cache: claims/record_store.py). Done per file (durable_files.atomic_write), that is an
fsync of the file and another of its directory for every claim: with tens of claims in flight the
writes queue behind each other's flushes. Here operations submitted while a flush is running wait
for the next batch, and a batch costs one data flush plus, where it replaces or removes files,
one fsync per directory it touched, however many files it holds. Durability is not weakened: a
caller hears "done" only after its data, and the name that exposes it, are on stable storage.

Three operations: `create` (a file that must not exist yet: a new claim's record), `replace`
and `remove`. A batch runs in four steps, in a worker thread so the event loop never blocks:

1. the data of every creation and replacement goes to a temporary sibling (`.{name}.{random}.tmp`,
   the naming durable_files uses and ClaimRecordStore.load_all sweeps after a crash), not flushed;
2. each creation's temporary is linked to its name (refused if the name exists);
3. one `syncfs(2)` per filesystem (normally exactly one) flushes the data and, with the journal
   commit it ends with, the names created in step 2;
4. replacements' temporaries are renamed over their targets and removals unlinked, and each
   directory they changed is fsynced once, which makes those renames and unlinks durable.

So a batch of creations costs one journal commit, where replacing files costs two: a rename (or
an unlink) must wait for the flush, because a failed flush must leave the old content in place.
A creation a failed flush leaves is unlinked again, which restores what was there: nothing. A
batch holds at most one operation per path, so operations on one path take effect in submission
order.

Why syncfs: it is the only call that makes many files' data durable at once; fsync covers one
file. Its cost is that it flushes everything dirty on that filesystem, not only our files: cheap
and bounded for a node's state directory, whose other writers are our own, but a state directory
that shares a filesystem with busy container layers or logs pays for their dirty pages too.
Kernels before 5.8 also do not report writeback errors through syncfs, where fsync would. Where
libc has no syncfs the batch falls back to one fsync per temporary file plus one per directory
that changed, which still never blocks a writer behind another writer's flush.
"""

import asyncio
import ctypes
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from functools import cache
from typing import Literal

import msgspec

from dra_driver.state.durable_files import (
    StrPath,
    fsync_directory,
    parent_directory,
    unlink_if_present,
    write_temporary,
)

SyncFs = Callable[[int], None]


def load_syncfs() -> SyncFs | None:
    """libc's syncfs as a function raising OSError, or None where libc does not have it."""
    try:
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        if function(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    return syncfs


def _flush(fds: Sequence[int], syncfs: SyncFs | None) -> None:
    """Makes the data behind every descriptor durable: one syncfs per filesystem, else fsync each."""
    if syncfs is None:
        for fd in fds:
            os.fsync(fd)
        return
    one_per_filesystem = {os.fstat(fd).st_dev: fd for fd in fds}
    for fd in one_per_filesystem.values():
        syncfs(fd)


def _flush_filesystem(directory: StrPath, syncfs: SyncFs) -> None:
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            syncfs(fd)
        finally:
            os.close(fd)


Kind = Literal["create", "replace", "remove"]


class _Change(msgspec.Struct):
    """One operation as the worker thread sees it."""

    kind: Kind
    path: StrPath
    data: bytes = b""
    mode: int = 0o600
    temporary: str | None = None
    fd: int | None = None
    error: BaseException | None = None


def _flush_failed(cause: OSError) -> OSError:
    # Each caller gets its own exception: one instance raised in many tasks would collect all
    # their tracebacks.
    error = OSError(cause.errno, f"flushing the batch failed: {cause.strerror}")
    error.__cause__ = cause
    return error


def _write_data(changes: Sequence[_Change]) -> None:
    for change in changes:
        if change.kind != "remove":
            try:
                change.temporary, change.fd = write_temporary(change.path, change.data, change.mode)
            except Exception as error:  # e.g. ENOSPC, EACCES, a path with a NUL byte: this caller's alone
                change.error = error


def _link_creation(change: _Change) -> bool:
    """Gives a creation its name; returns whether it got it."""
    assert change.temporary is not None and change.fd is not None
    try:
        os.link(change.temporary, change.path)  # unlike a rename, refuses a name that exists
    except OSError as error:
        change.error = error
        os.close(change.fd)
        change.fd = None
    # Linked or refused, the temporary name is done with (one left by a failed unlink is swept
    # at the next start, like any crash's).
    with suppress(OSError):
        os.unlink(change.temporary)
    change.temporary = None
    return change.error is None


def _apply_after_flush(change: _Change) -> bool:
    """Renames a replacement over its target or unlinks a removal; returns whether the directory
    changed."""
    try:
        if change.kind == "remove":
            return unlink_if_present(change.path)  # removing what is not there changes nothing
        assert change.temporary is not None
        os.replace(change.temporary, change.path)
        return True
    except OSError as error:
        if change.temporary is not None:
            unlink_if_present(change.temporary)
        change.error = error
        return False


def _commit(changes: Sequence[_Change], syncfs: SyncFs | None) -> bool:
    """Applies one batch, leaving each change's error (None: durable); returns whether it flushed."""
    _write_data(changes)
    created: dict[str, list[_Change]] = {}
    for change in changes:
        if change.kind == "create" and change.error is None and _link_creation(change):
            created.setdefault(parent_directory(change.path), []).append(change)
    fds = [change.fd for change in changes if change.fd is not None]
    try:
        if fds:
            _flush(fds, syncfs)
    except OSError as error:
        for change in changes:
            if change.temporary is not None:
                unlink_if_present(change.temporary)
            elif change.kind == "create" and change.error is None:
                unlink_if_present(change.path)  # back to what was there: nothing
            change.error = change.error or _flush_failed(error)
        return True
    finally:
        for fd in fds:
            os.close(fd)

    # syncfs ends with a journal commit, which made the created names durable; the fallback's
    # fsyncs leave their directories to be fsynced.
    changed_directories = created if syncfs is None else {}
    for change in changes:
        if change.error is None and change.kind != "create" and _apply_after_flush(change):
            changed_directories.setdefault(parent_directory(change.path), []).append(change)
    for directory, in_directory in changed_directories.items():
        try:
            fsync_directory(directory)
        except OSError as error:
            # The names changed but may not survive a crash: nothing in this directory is durable.
            for change in in_directory:
                change.error = _flush_failed(error)
    return bool(fds)


class _Operation(msgspec.Struct):
    change: _Change
    done: asyncio.Future[None]


class GroupCommitter:
    """Batches durable file creations, replacements and removals in one directory tree (one
    filesystem).

    One batch of at most `max_batch` operations, none of them on the same path, is in a worker
    thread at a time; operations submitted meanwhile join the next batch, which the end of the
    one before starts. Operations on the same path take effect in submission order. A submission
    that finds the committer idle starts a batch in the next loop turn, so that the others of the
    same turn (the claims of one kubelet call) join it. There is no flusher task: callbacks hand
    the batches to the thread, and the thread calls back once per batch, which saves a task's
    creation and steps and an asyncio future's loop turn per batch.

    A caller cancelled while its operation waits for a batch withdraws it (it is never applied);
    once its batch has started, the operation completes whole and only the caller stops waiting.
    Either way the target holds the old content or the new, never part of either.
    """

    def __init__(self, *, max_batch: int = 64) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self._max_batch = max_batch
        self._syncfs = load_syncfs()
        self._pending: list[_Operation] = []
        self._busy = False  # a batch is running, or about to start
        self._running: list[_Operation] = []  # the batch in the worker thread
        self._drained: asyncio.Event | None = None  # set when nothing is running or pending
        self._closed = False
        # For tests and benchmarks: batches that flushed data, or tried to (one syncfs, or the
        # fallback's fsyncs), and operations that went into a batch (withdrawn ones are not counted).
        self.flushes = 0
        self.operations = 0

    async def create(self, path: StrPath, data: bytes, mode: int = 0o600) -> None:
        """Durably creates path with data; raises FileExistsError, changing nothing, if it exists.
        One journal commit instead of a replacement's two: for files nobody else creates meanwhile."""
        await self._submit(_Change("create", path, data, mode))

    async def replace(self, path: StrPath, data: bytes, mode: int = 0o600) -> None:
        """Durably and atomically replaces path's content with data (mode applies to a new file)."""
        await self._submit(_Change("replace", path, data, mode))

    async def remove(self, path: StrPath) -> None:
        """Durably removes path; one that is already missing is fine."""
        await self._submit(_Change("remove", path))

    def flush_ahead(self, directory: StrPath) -> None:
        """Starts flushing the filesystem that holds `directory`, in a worker thread, and returns
        at once. A syncfs flushes every dirty page of its filesystem, not only the batch's: the
        first batch after start would pay for everything written before it (start-up's files,
        and whatever else the node wrote there), which made the first prepare after a start
        tens to hundreds of milliseconds slower than the next. Best effort: a failure here is
        the first batch's to report. Without syncfs (fsync per file) there is nothing to gain."""
        if self._syncfs is not None:
            _flush_workers().submit(_flush_filesystem, directory, self._syncfs)

    async def close(self) -> None:
        """Refuses new operations and waits until every submitted one is settled."""
        self._closed = True
        if self._busy:
            if self._drained is None:
                self._drained = asyncio.Event()
            await self._drained.wait()

    async def _submit(self, change: _Change) -> None:
        if self._closed:
            raise RuntimeError("GroupCommitter is closed")
        operation = _Operation(change, asyncio.get_running_loop().create_future())
        self._pending.append(operation)
        if not self._busy:
            self._busy = True
            asyncio.get_running_loop().call_soon(self._start_batch)
        await operation.done

    def _start_batch(self) -> None:
        # A cancelled caller's future is done: its operation is dropped before it is applied.
        self._pending = [operation for operation in self._pending if not operation.done.done()]
        if not self._pending:
            self._go_idle()
            return
        batch = self._running = _next_batch(self._pending, self._max_batch)
        del self._pending[: len(batch)]
        self.operations += len(batch)
        changes = [operation.change for operation in batch]
        try:
            _flush_workers().submit(self._commit_and_report, asyncio.get_running_loop(), changes)
        except RuntimeError as error:  # the interpreter is shutting down: no thread will run it
            self._stop(error)

    def _commit_and_report(self, loop: asyncio.AbstractEventLoop, changes: list[_Change]) -> None:
        """In the worker thread: the batch, then one call back into the loop (no asyncio future
        chained to the thread's, which would cost a loop turn of its own per batch)."""
        try:
            flushed, failure = _commit(changes, self._syncfs), None
        except BaseException as error:  # a bug: reported to the batch's callers below
            flushed, failure = False, error
        with suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            loop.call_soon_threadsafe(self._batch_done, flushed, failure)

    def _stop(self, cause: BaseException) -> None:
        """Fails every operation not yet settled; none of them was applied."""
        for operation in self._running + self._pending:
            if not operation.done.done():
                operation.done.set_exception(RuntimeError(f"group commit stopped: {cause!r}"))
        self._pending = []
        self._go_idle()

    def _go_idle(self) -> None:
        self._busy = False
        self._running = []
        if self._drained is not None:
            self._drained.set()  # close() may return

    def _batch_done(self, flushed: bool, failure: BaseException | None) -> None:
        batch = self._running
        if flushed:
            self.flushes += 1
        for operation in batch:
            if operation.done.done():
                continue
            if failure is not None:
                # A bug: the batch may or may not have finished, so nothing waiting can be told
                # it is durable.
                operation.done.set_exception(RuntimeError(f"group commit stopped: {failure!r}"))
            elif operation.change.error is None:
                operation.done.set_result(None)
            else:
                operation.done.set_exception(operation.change.error)
        self._start_batch()


@cache
def _flush_workers() -> ThreadPoolExecutor:
    """The threads batches run in, shared by every committer of the process (one batch at a time
    each), so the event loop's default executor stays free for other blocking work."""
    return ThreadPoolExecutor(thread_name_prefix="group-commit")


def _next_batch(pending: Sequence[_Operation], max_batch: int) -> list[_Operation]:
    """The oldest operations, up to max_batch, stopping before the first on a path already in."""
    paths: set[str] = set()
    batch = []
    for operation in pending[:max_batch]:
        path = os.fspath(operation.change.path)
        if path in paths:
            break
        paths.add(path)
        batch.append(operation)
    return batch
