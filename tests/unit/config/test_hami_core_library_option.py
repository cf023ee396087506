"""--hami-core-library is read from the disk at start: what the agent refuses before it runs."""

from pathlib import Path

import pytest

from dra_driver.config.option_table import HAMI_CORE_LIBRARY
from dra_driver.config.option_values import LIBRARY_MAX_BYTES, SettingsError
from tests.support.elf_libraries import hooks_library

LABEL = "--hami-core-library (DRA_DRIVER_HAMI_CORE_LIBRARY)"


def refusal(value: str) -> str:
    with pytest.raises(SettingsError) as error:
        HAMI_CORE_LIBRARY.check(value)
    return str(error.value)


def test_a_library_that_exports_the_hooks_is_taken(tmp_path: Path) -> None:
    library = hooks_library(tmp_path, "libvgpu.so")

    assert HAMI_CORE_LIBRARY.check(str(library)) == library


def test_unset_needs_no_library() -> None:
    assert HAMI_CORE_LIBRARY.check(None) is None


def test_a_library_that_hooks_nothing_is_refused_naming_it_and_the_hooks(tmp_path: Path) -> None:
    library = hooks_library(tmp_path, "libvgpu.so", "-fvisibility=hidden")

    assert refusal(str(library)).startswith(
        f"{LABEL}: {library}: exports none of cuMemAlloc_v2, cuMemGetInfo_v2, cuLaunchKernel: "
    )


def test_a_file_larger_than_any_build_is_refused_unread(tmp_path: Path) -> None:
    huge = tmp_path / "libvgpu.so"
    with huge.open("wb") as file:  # sparse: no disk, and the cap stops the read early
        file.truncate(LIBRARY_MAX_BYTES + 1)

    assert refusal(str(huge)) == f"{LABEL}: {huge}: is larger than 64 MiB, not a HAMi-core build"


@pytest.mark.parametrize("value", ["libvgpu.so", "{tmp}", "{tmp}/absent.so"])
def test_a_path_that_is_no_absolute_file_is_refused_before_it_is_read(value: str, tmp_path: Path) -> None:
    assert refusal(value.replace("{tmp}", str(tmp_path))).startswith(LABEL)
