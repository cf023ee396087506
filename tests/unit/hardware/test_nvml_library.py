"""Where libnvidia-ml.so.1 is looked for under a driver root, and the wait's back-off schedule.

Loading itself is tested in processes of their own (test_nvml_backend, tests/contract): once a
process has loaded any libnvidia-ml.so.1, the loader hands it out by name for good.
"""

import itertools
from pathlib import Path

from dra_driver.hardware.loader_cache import USUAL_LIBRARY_DIRS
from dra_driver.hardware.nvml_library import LIBRARY, cached_library_paths, candidate_paths
from dra_driver.hardware.nvml_wait import retry_delays


def test_the_back_off_doubles_from_one_second_up_to_a_minute() -> None:
    assert list(itertools.islice(retry_delays(), 9)) == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_the_loader_cache_entries_come_first_then_the_usual_directories(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    # The new layout's header, an entry's worth of binary, then the string table.
    cache = (
        b"glibc-ld.so.cache1.1"
        + bytes(28)
        + b"libnvidia-ml.so.1\0/opt/driver/lib/libnvidia-ml.so.1\0"
        + b"libc.so.6\0/lib/x86_64-linux-gnu/libc.so.6\0/usr/lib64/libnvidia-ml.so.1\0"
    )
    (tmp_path / "etc" / "ld.so.cache").write_bytes(cache)

    candidates = candidate_paths(tmp_path)

    assert candidates[:2] == [f"/opt/driver/lib/{LIBRARY}", f"/usr/lib64/{LIBRARY}"]
    assert candidates[2:] == [f"{d}/{LIBRARY}" for d in USUAL_LIBRARY_DIRS if d != "/usr/lib64"]


def test_a_root_without_a_loader_cache_has_the_usual_directories(tmp_path: Path) -> None:
    assert candidate_paths(tmp_path) == [f"{d}/{LIBRARY}" for d in USUAL_LIBRARY_DIRS]
    assert "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1" in candidate_paths(tmp_path)


def test_the_old_cache_layout_is_read_and_other_files_are_not() -> None:
    old = b"ld.so-1.7.0" + bytes(13) + b"/usr/lib/libnvidia-ml.so.1\0"
    assert cached_library_paths(old) == ["/usr/lib/libnvidia-ml.so.1"]
    assert cached_library_paths(b"\x7fELF/usr/lib/libnvidia-ml.so.1\0") == []
    # Another library whose name merely starts the same is not the one asked for.
    assert cached_library_paths(b"glibc-ld.so.cache1.1/usr/lib/libnvidia-ml.so.1.bak\0") == []
