"""durable_files.read_whole: the record store's read, with plain descriptor calls."""

import os
from pathlib import Path

import pytest

from dra_driver.state import durable_files


def open_descriptors() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


@pytest.mark.parametrize("size", [0, 1, 900, 64 * 1024, 200 * 1024 + 7])
def test_reads_every_byte_whatever_the_size(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "record.json"
    path.write_bytes(data)
    before = open_descriptors()
    assert durable_files.read_whole(path) == data
    assert durable_files.read_whole(str(path)) == data
    assert open_descriptors() == before


def test_a_missing_file_raises_and_leaves_no_descriptor_open(tmp_path: Path) -> None:
    before = open_descriptors()
    with pytest.raises(FileNotFoundError):
        durable_files.read_whole(tmp_path / "absent.json")
    with pytest.raises(IsADirectoryError):
        durable_files.read_whole(tmp_path)
    assert open_descriptors() == before
