"""DurableWriter: every write flushed before its caller hears "done", whole even when the caller
gave up, never overtaken by a later write of the same file."""

import asyncio
import os
import stat
import threading
from pathlib import Path

import pytest

from dra_driver.state import durable_files
from dra_driver.state.durable_writes import DurableWriter


def temporaries(directory: Path) -> list[Path]:
    return list(directory.glob(".*.tmp"))


def content(path: Path) -> bytes | None:
    """The file's bytes, None where there is no file."""
    return path.read_bytes() if path.exists() else None


@pytest.fixture
def existing(tmp_path: Path) -> Path:
    """A file with the content b"old", alone in tmp_path."""
    path = tmp_path / "a.json"
    path.write_bytes(b"old")
    return path


class Flushes:
    """Records each fsync of a file (by the name it has then) and of a directory, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str]] = []
        real_fsync, real_directory = os.fsync, durable_files.fsync_directory

        def fsync(fd: int) -> None:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):  # a directory's is recorded below
                self.events.append(("file", str(Path(f"/proc/self/fd/{fd}").readlink())))
            real_fsync(fd)

        def fsync_directory(directory: durable_files.StrPath) -> None:
            self.events.append(("directory", os.fspath(directory)))
            real_directory(directory)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(durable_files, "fsync_directory", fsync_directory)


async def test_a_creation_is_flushed_file_first_then_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes = Flushes(monkeypatch)
    path = tmp_path / "a.json"
    await DurableWriter().create(path, b"new", mode=0o640)
    assert content(path) == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    [(kind, name), directory] = flushes.events
    assert kind == "file" and Path(name).name.startswith(".a.json.") and name.endswith(".tmp")
    assert directory == ("directory", str(tmp_path))
    assert temporaries(tmp_path) == []


async def test_a_creation_refuses_a_name_that_exists_and_leaves_it(existing: Path) -> None:
    with pytest.raises(FileExistsError):
        await DurableWriter().create(existing, b"new")
    assert content(existing) == b"old"
    assert temporaries(existing.parent) == []


async def test_a_replacement_is_flushed_and_replaces_the_content(
    existing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes = Flushes(monkeypatch)
    await DurableWriter().replace(existing, b"new")
    assert content(existing) == b"new"
    assert [kind for kind, _ in flushes.events] == ["file", "directory"]
    assert temporaries(existing.parent) == []


async def test_a_replacement_whose_flush_fails_leaves_the_old_content(
    existing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        await DurableWriter().replace(existing, b"new")
    assert content(existing) == b"old"
    assert temporaries(existing.parent) == []


async def test_a_removal_flushes_the_directory_and_a_missing_file_is_fine(
    existing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushes = Flushes(monkeypatch)
    writer = DurableWriter()
    await writer.remove(existing)
    await writer.remove(existing)
    assert content(existing) is None
    assert flushes.events == [("directory", str(existing.parent))]  # nothing changed the second time


async def test_a_cancelled_callers_write_completes_whole_and_the_next_one_waits_for_it(
    existing: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = existing
    in_flush, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        in_flush.set()
        assert release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    writer = DurableWriter()
    caller = asyncio.create_task(writer.replace(path, b"new"))
    assert await asyncio.to_thread(in_flush.wait, 10)  # the loop runs on while the thread flushes
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert content(path) == b"old"
    monkeypatch.setattr(os, "fsync", real_fsync)
    removal = asyncio.create_task(writer.remove(path))
    await asyncio.sleep(0.05)
    assert content(path) == b"old" and not removal.done()  # not before the replacement it follows
    release.set()
    await removal
    assert content(path) is None  # replaced whole, then removed
    assert temporaries(path.parent) == []
    assert writer._last == {}  # settled paths are forgotten


async def test_writes_of_different_files_run_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    both_in_flush = threading.Barrier(2, timeout=10)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        both_in_flush.wait()  # breaks, raising, unless the other write flushes meanwhile
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    writer = DurableWriter()
    await asyncio.gather(writer.create(tmp_path / "a.json", b"a"), writer.create(tmp_path / "b.json", b"b"))
    assert content(tmp_path / "a.json") == b"a"
    assert content(tmp_path / "b.json") == b"b"


async def test_an_error_reaches_its_caller_alone(tmp_path: Path) -> None:
    writer = DurableWriter()
    missing = tmp_path / "no-such-directory" / "a.json"
    results = await asyncio.gather(
        writer.replace(missing, b"x"), writer.replace(tmp_path / "b.json", b"b"), return_exceptions=True
    )
    assert isinstance(results[0], FileNotFoundError)
    assert results[1] is None
    assert content(tmp_path / "b.json") == b"b"
