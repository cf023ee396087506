"""GroupCommitter: fewer flushes than writes, without telling anyone "done" before it is durable."""

import asyncio
import errno
import os
import random
import re
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dra_driver.state import durable_files, group_commit
from dra_driver.state.group_commit import GroupCommitter, SyncFs


def temporaries(directory: Path) -> list[Path]:
    return sorted(directory.rglob(".*.tmp"))


async def settle(calls: Sequence[Awaitable[None]]) -> list[BaseException | None]:
    """Runs calls concurrently, submitted in order; the exception of each, or None."""
    return list(await asyncio.gather(*calls, return_exceptions=True))


def counted_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every descriptor os.fsync is called with from now on (each still fsynced)."""
    fsynced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        fsynced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    return fsynced


async def test_concurrent_replacements_share_flushes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fsynced = counted_fsyncs(monkeypatch)
    synced: list[int] = []
    real_syncfs = group_commit.load_syncfs()
    assert real_syncfs is not None  # Linux with glibc or musl

    def counting_syncfs(fd: int) -> None:
        synced.append(fd)
        real_syncfs(fd)

    monkeypatch.setattr(group_commit, "load_syncfs", lambda: counting_syncfs)
    committer = GroupCommitter()
    paths = [tmp_path / f"claim-{n}.json" for n in range(64)]

    async def scenario() -> list[BaseException | None]:
        outcomes = await settle(
            [committer.replace(path, f"record {n}".encode()) for n, path in enumerate(paths)]
        )
        await committer.close()
        return outcomes

    assert await scenario() == [None] * 64
    assert committer.operations == 64
    assert 1 <= committer.flushes <= 8
    assert [path.read_text() for path in paths] == [f"record {n}" for n in range(64)]
    assert all(path.stat().st_mode & 0o777 == 0o600 for path in paths)
    # One syncfs covers a batch's data; the only fsyncs left are one per directory per batch.
    assert len(synced) == committer.flushes
    assert len(fsynced) == committer.flushes
    assert temporaries(tmp_path) == []


async def test_batches_are_bounded_and_follow_each_other(tmp_path: Path) -> None:
    committer = GroupCommitter(max_batch=4)

    async def scenario() -> list[BaseException | None]:
        return await settle([committer.replace(tmp_path / f"f{n}", b"x") for n in range(10)])

    assert await scenario() == [None] * 10
    assert (committer.flushes, committer.operations) == (3, 10)


async def test_nobody_hears_done_before_data_rename_and_directory_are_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events: W(rite temporary) F(lush) R(ename) D(irectory fsync), and each caller's return."""
    events: list[tuple[str, str]] = []
    real_write = durable_files.write_temporary
    real_flush = group_commit._flush
    real_replace = os.replace
    real_fsync_directory = durable_files.fsync_directory

    def write_temporary(path: str | os.PathLike[str], data: bytes, mode: int) -> tuple[str, int]:
        events.append(("W", str(path)))
        return real_write(path, data, mode)

    def flush(fds: Sequence[int], syncfs: SyncFs | None) -> None:
        real_flush(fds, syncfs)
        events.append(("F", ""))

    def replace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        real_replace(source, target)
        events.append(("R", str(target)))

    def fsync_directory(directory: str) -> None:
        real_fsync_directory(directory)
        events.append(("D", str(directory)))

    monkeypatch.setattr(group_commit, "write_temporary", write_temporary)
    monkeypatch.setattr(group_commit, "_flush", flush)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(group_commit, "fsync_directory", fsync_directory)
    directories = [tmp_path / "a", tmp_path / "b"]
    for directory in directories:
        directory.mkdir()
    paths = [directories[n % 2] / f"claim-{n}" for n in range(24)]
    committer = GroupCommitter(max_batch=5)

    async def put(path: Path) -> None:
        await committer.replace(path, b"data")
        events.append(("done", str(path)))

    # Half at once, half trickling in while batches are being flushed.
    first = [asyncio.create_task(put(path)) for path in paths[:12]]
    rest = []
    for path in paths[12:]:
        await asyncio.sleep(0.001)
        rest.append(asyncio.create_task(put(path)))
    await asyncio.gather(*first, *rest)

    assert committer.flushes > 1
    worker = "".join(kind for kind, _ in events if kind != "done")
    assert re.fullmatch(r"(W+FR+D+)+", worker), worker  # batches never overlap, phases in order
    kinds = [kind for kind, _ in events]
    for path in paths:
        at_write = events.index(("W", str(path)))
        at_flush = kinds.index("F", at_write)
        at_rename = events.index(("R", str(path)))
        at_directory = events.index(("D", str(path.parent)), at_rename)
        at_done = events.index(("done", str(path)))
        assert at_write < at_flush < at_rename < at_directory < at_done, path


async def test_same_path_follows_submission_order(tmp_path: Path) -> None:
    replaced, removed, recreated = tmp_path / "replaced", tmp_path / "removed", tmp_path / "recreated"
    recreated.write_bytes(b"old")
    committer = GroupCommitter()

    async def scenario() -> list[BaseException | None]:
        return await settle(
            [
                committer.replace(replaced, b"A"),
                committer.replace(removed, b"A"),
                committer.remove(recreated),
                committer.replace(replaced, b"B"),
                committer.remove(removed),
                committer.replace(recreated, b"C"),
            ]
        )

    assert await scenario() == [None] * 6
    # The second operation on `replaced` starts the next batch, and the rest join it.
    assert (committer.operations, committer.flushes) == (6, 2)
    assert replaced.read_bytes() == b"B"
    assert not removed.exists()
    assert recreated.read_bytes() == b"C"
    assert temporaries(tmp_path) == []


async def test_removing_a_missing_file_is_fine(tmp_path: Path) -> None:
    committer = GroupCommitter()
    await committer.remove(tmp_path / "never-written")
    assert committer.flushes == 0


async def test_a_failing_write_fails_only_its_caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write

    def write(fd: int, data: bytes | memoryview) -> int:
        if bytes(data) == b"poison":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    committer = GroupCommitter()
    good = [tmp_path / f"good-{n}" for n in range(4)]

    async def scenario() -> list[BaseException | None]:
        return await settle(
            [
                committer.replace(good[0], b"0"),
                committer.replace(tmp_path / "no-such-directory" / "claim", b"lost"),
                committer.replace(good[1], b"1"),
                committer.replace(tmp_path / "full", b"poison"),
                committer.replace(good[2], b"2"),
                committer.remove(good[3]),
            ]
        )

    outcomes = await scenario()
    assert committer.flushes == 1
    assert outcomes[0] is None and outcomes[2] is None and outcomes[4] is None and outcomes[5] is None
    assert isinstance(outcomes[1], FileNotFoundError)
    assert isinstance(outcomes[3], OSError) and outcomes[3].errno == errno.ENOSPC
    assert [path.read_bytes() for path in good[:3]] == [b"0", b"1", b"2"]
    assert not (tmp_path / "full").exists()
    assert temporaries(tmp_path) == []


async def test_a_failing_flush_fails_the_whole_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failures = [OSError(errno.EIO, os.strerror(errno.EIO))]

    def syncfs(fd: int) -> None:
        if failures:
            raise failures.pop()
        os.fsync(fd)

    monkeypatch.setattr(group_commit, "load_syncfs", lambda: syncfs)
    existing, doomed = tmp_path / "existing", tmp_path / "doomed"
    existing.write_bytes(b"old")
    doomed.write_bytes(b"still here")
    committer = GroupCommitter()

    async def scenario() -> list[BaseException | None]:
        return await settle(
            [
                committer.replace(existing, b"new"),
                committer.replace(tmp_path / "fresh", b"new"),
                committer.remove(doomed),
                committer.create(tmp_path / "created", b"new"),
            ]
        )

    outcomes = await scenario()
    assert all(isinstance(outcome, OSError) and outcome.errno == errno.EIO for outcome in outcomes)
    assert len({id(outcome) for outcome in outcomes}) == 4  # each caller raises its own exception
    assert existing.read_bytes() == b"old"
    assert not (tmp_path / "fresh").exists()
    assert not (tmp_path / "created").exists(), "a creation is taken back"
    assert doomed.read_bytes() == b"still here"  # nothing of a failed batch is applied
    assert temporaries(tmp_path) == []
    # The committer itself is fine: the next batch flushes and lands.
    await committer.replace(existing, b"new")
    assert existing.read_bytes() == b"new"


async def test_a_failing_directory_fsync_reports_its_directory_not_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad, good = tmp_path / "bad", tmp_path / "good"
    bad.mkdir()
    good.mkdir()
    real_fsync_directory = durable_files.fsync_directory

    def fsync_directory(directory: str) -> None:
        if directory == str(bad):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync_directory(directory)

    monkeypatch.setattr(group_commit, "fsync_directory", fsync_directory)
    committer = GroupCommitter()

    async def scenario() -> list[BaseException | None]:
        return await settle([committer.replace(bad / "x", b"x"), committer.replace(good / "y", b"y")])

    outcomes = await scenario()
    assert isinstance(outcomes[0], OSError) and outcomes[0].errno == errno.EIO
    assert outcomes[1] is None


async def test_without_syncfs_each_temporary_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsynced = counted_fsyncs(monkeypatch)
    monkeypatch.setattr(group_commit, "load_syncfs", lambda: None)
    committer = GroupCommitter()
    paths = [tmp_path / f"claim-{n}" for n in range(16)]

    async def scenario() -> list[BaseException | None]:
        return await settle([committer.replace(path, path.name.encode()) for path in paths])

    assert await scenario() == [None] * 16
    assert committer.flushes == 1
    assert len(fsynced) == 16 + 1  # every temporary, then the directory once
    assert [path.read_bytes() for path in paths] == [path.name.encode() for path in paths]
    assert temporaries(tmp_path) == []


async def test_creations_are_durable_with_one_flush_and_no_directory_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """syncfs ends with a journal commit, which carries the new names: one commit per batch."""
    events: list[str] = []
    real_syncfs = group_commit.load_syncfs()
    assert real_syncfs is not None
    real_link, real_fsync = os.link, os.fsync

    def syncfs(fd: int) -> None:
        events.append("F")
        real_syncfs(fd)

    def link(source: str, target: str) -> None:
        events.append("L")
        real_link(source, target)

    def fsync(fd: int) -> None:
        events.append("D")
        real_fsync(fd)

    monkeypatch.setattr(group_commit, "load_syncfs", lambda: syncfs)
    monkeypatch.setattr(os, "link", link)
    monkeypatch.setattr(os, "fsync", fsync)
    paths = [tmp_path / f"claim-{n}.json" for n in range(8)]
    committer = GroupCommitter()

    async def scenario() -> list[BaseException | None]:
        return await settle([committer.create(path, path.name.encode()) for path in paths])

    assert await scenario() == [None] * 8
    assert committer.flushes == 1 and "".join(events) == "L" * 8 + "F", events
    assert [path.read_bytes() for path in paths] == [path.name.encode() for path in paths]
    assert all(path.stat().st_mode & 0o777 == 0o600 and path.stat().st_nlink == 1 for path in paths)
    assert temporaries(tmp_path) == []


async def test_creating_a_file_that_exists_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    existing = tmp_path / "claim.json"
    existing.write_bytes(b"old")
    committer = GroupCommitter()

    async def scenario() -> list[BaseException | None]:
        return await settle([committer.create(existing, b"new"), committer.create(tmp_path / "new", b"new")])

    refused, created = await scenario()
    assert isinstance(refused, FileExistsError) and created is None
    assert existing.read_bytes() == b"old" and (tmp_path / "new").read_bytes() == b"new"
    assert temporaries(tmp_path) == []


async def test_without_syncfs_a_creation_fsyncs_its_file_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsynced = counted_fsyncs(monkeypatch)
    monkeypatch.setattr(group_commit, "load_syncfs", lambda: None)
    committer = GroupCommitter()
    await committer.create(tmp_path / "claim", b"data")
    assert len(fsynced) == 2  # the file, then its directory
    assert (tmp_path / "claim").read_bytes() == b"data"


class BlockedFlush:
    """Holds the worker inside the flush until released, so a test can act while a batch is in flight."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        real_flush = group_commit._flush

        def flush(fds: Sequence[int], syncfs: SyncFs | None) -> None:
            self.entered.set()
            assert self.release.wait(timeout=10)
            real_flush(fds, syncfs)

        monkeypatch.setattr(group_commit, "_flush", flush)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 10)


async def cancelled(task: asyncio.Task[None]) -> bool:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


async def test_a_caller_cancelled_while_waiting_for_a_batch_withdraws_its_operation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = BlockedFlush(monkeypatch)
    target = tmp_path / "claim"
    target.write_bytes(b"old")
    committer = GroupCommitter()

    in_flight = asyncio.create_task(committer.replace(tmp_path / "other", b"other"))
    await blocked.wait_entered()
    waiting = asyncio.create_task(committer.replace(target, b"new"))
    await asyncio.sleep(0)  # submitted, queued behind the batch in flight
    assert await cancelled(waiting)
    blocked.release.set()
    await in_flight
    await committer.close()

    assert target.read_bytes() == b"old"
    assert committer.operations == 1
    assert temporaries(tmp_path) == []


async def test_a_caller_cancelled_during_its_batch_still_gets_a_whole_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = BlockedFlush(monkeypatch)
    target = tmp_path / "claim"
    target.write_bytes(b"old")
    committer = GroupCommitter()

    caller = asyncio.create_task(committer.replace(target, b"new"))
    await blocked.wait_entered()
    assert await cancelled(caller)
    blocked.release.set()
    await committer.close()

    assert target.read_bytes() == b"new"
    assert temporaries(tmp_path) == []


async def test_cancelling_at_any_moment_leaves_old_or_new_content(tmp_path: Path) -> None:
    chooser = random.Random(7)
    versions = [b"old" * 1000]  # large enough that a torn write would show
    targets = [tmp_path / f"claim-{n}" for n in range(8)]
    for target in targets:
        target.write_bytes(versions[0])
    committer = GroupCommitter()

    for round_ in range(40):
        versions.append(b"new %d" % round_ * 1000)
        callers = [asyncio.create_task(committer.replace(target, versions[-1])) for target in targets]
        for _ in range(chooser.randrange(6)):
            await asyncio.sleep(0)
        for caller in chooser.sample(callers, 4):
            caller.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        assert all(target.read_bytes() in versions for target in targets)
    await committer.close()

    assert temporaries(tmp_path) == []


async def test_a_closed_committer_refuses_work(tmp_path: Path) -> None:
    committer = GroupCommitter()

    async def scenario(call: Callable[[], Awaitable[None]]) -> None:
        await committer.close()
        await call()

    with pytest.raises(RuntimeError, match="closed"):
        await scenario(lambda: committer.replace(tmp_path / "late", b"x"))
    assert not (tmp_path / "late").exists()


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        GroupCommitter(max_batch=0)


async def test_operations_fail_clearly_when_no_worker_thread_can_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = ThreadPoolExecutor()
    gone.shutdown()  # as at interpreter shutdown: submit raises RuntimeError
    monkeypatch.setattr(group_commit, "_flush_workers", lambda: gone)
    committer = GroupCommitter()

    async def scenario() -> list[BaseException | None]:
        calls = [committer.create(tmp_path / "a", b"x"), committer.remove(tmp_path / "b")]
        outcomes = await asyncio.wait_for(settle(calls), 5)  # never left waiting for nothing
        await committer.close()  # nothing left running: returns at once
        return outcomes

    outcomes = await scenario()
    assert all(isinstance(outcome, RuntimeError) for outcome in outcomes), outcomes
    assert all("group commit stopped" in str(outcome) for outcome in outcomes), outcomes
    assert not (tmp_path / "a").exists()


async def test_a_batch_that_raises_fails_its_callers_and_the_next_batch_still_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_commit = group_commit._commit
    calls = 0

    def commit_failing_once(changes: Sequence[group_commit._Change], syncfs: SyncFs | None) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ZeroDivisionError("a bug")
        return real_commit(changes, syncfs)

    monkeypatch.setattr(group_commit, "_commit", commit_failing_once)
    committer = GroupCommitter()

    async def scenario() -> tuple[BaseException | None, BaseException | None]:
        first = await asyncio.wait_for(settle([committer.replace(tmp_path / "a", b"1")]), 5)
        second = await asyncio.wait_for(settle([committer.replace(tmp_path / "b", b"2")]), 5)
        return first[0], second[0]

    first, second = await scenario()
    assert isinstance(first, RuntimeError) and "ZeroDivisionError" in str(first), first
    assert second is None
    assert (tmp_path / "b").read_bytes() == b"2"


def test_flush_ahead_syncs_the_directory_s_filesystem_in_a_worker_and_returns_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At start, so the first batch's syncfs does not also flush everything written before it."""
    release, synced = threading.Event(), threading.Event()
    seen: list[tuple[int, str]] = []
    real_syncfs = group_commit.load_syncfs()
    assert real_syncfs is not None

    def syncfs(fd: int) -> None:
        release.wait(10)
        seen.append((os.fstat(fd).st_ino, threading.current_thread().name))
        real_syncfs(fd)
        synced.set()

    monkeypatch.setattr(group_commit, "load_syncfs", lambda: syncfs)
    committer = GroupCommitter()

    committer.flush_ahead(tmp_path)  # returns while its syncfs is held back

    assert seen == []
    release.set()
    assert synced.wait(10)
    assert seen == [(tmp_path.stat().st_ino, seen[0][1])]
    assert seen[0][1].startswith("group-commit")
    assert committer.flushes == 0  # not a batch


async def test_a_failing_flush_ahead_is_left_to_the_first_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried = threading.Event()

    def syncfs(fd: int) -> None:
        tried.set()
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(group_commit, "load_syncfs", lambda: syncfs)
    committer = GroupCommitter()
    committer.flush_ahead(tmp_path / "not-there")  # cannot even be opened: nothing happens
    committer.flush_ahead(tmp_path)
    assert tried.wait(10)

    outcome = await settle([committer.create(tmp_path / "record", b"new")])
    assert isinstance(outcome[0], OSError) and outcome[0].errno == errno.EIO
