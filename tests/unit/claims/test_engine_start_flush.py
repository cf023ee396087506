"""The first prepare after a start does not flush what start-up wrote (GroupCommitter.flush_ahead)."""

import os
import threading
from pathlib import Path

import pytest

from dra_driver.state import group_commit
from dra_driver.state.group_commit import GroupCommitter
from tests.support.engines import simulated_engine


class NoClaims:
    async def get(self, namespace: str, name: str) -> object:
        raise AssertionError("no claim is read at start")


async def test_loading_the_state_flushes_the_records_filesystem_before_any_prepare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushed = threading.Event()
    inodes: list[int] = []

    def syncfs(fd: int) -> None:
        inodes.append(os.fstat(fd).st_ino)
        flushed.set()

    monkeypatch.setattr(group_commit, "load_syncfs", lambda: syncfs)
    engine = simulated_engine(tmp_path, NoClaims(), committer=GroupCommitter())
    try:
        await engine.load_state()
    finally:
        engine.close()
    assert flushed.wait(10)
    assert inodes == [(tmp_path / "state" / "claims").stat().st_ino]
