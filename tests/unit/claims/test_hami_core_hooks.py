"""Which HAMi-core builds can enforce vGPU limits: real gcc-built stand-ins for the Debug build
(hooks exported), the Release build (the same source with hidden visibility) and a partial one."""

from pathlib import Path

import pytest

from dra_driver.claims.edits.hami_core_hooks import hami_core_library_problem
from tests.support.elf_libraries import gcc, hooks_library

HIDDEN = (
    "exports none of cuMemAlloc_v2, cuMemGetInfo_v2, cuLaunchKernel: HAMi-core was built with hidden "
    "symbols (CMake Release); build it with CMAKE_BUILD_TYPE=Debug (see docs/install.md)"
)


def test_a_library_that_exports_every_hook_has_no_problem(tmp_path: Path) -> None:
    assert hami_core_library_problem(hooks_library(tmp_path, "libvgpu.so").read_bytes()) is None


def test_a_library_built_with_hidden_visibility_is_told_how_to_build_it(tmp_path: Path) -> None:
    library = hooks_library(tmp_path, "libvgpu.so", "-fvisibility=hidden")

    assert hami_core_library_problem(library.read_bytes()) == HIDDEN


def test_a_library_that_lacks_some_hooks_names_those(tmp_path: Path) -> None:
    source = "int cuMemAlloc_v2(void) { return 0; }\n"
    library = gcc(tmp_path, "libpartial.so", source, "-shared", "-fPIC")

    assert hami_core_library_problem(library.read_bytes()) == (
        "does not export cuMemGetInfo_v2, cuLaunchKernel, which HAMi-core needs to enforce vGPU limits"
    )


@pytest.mark.parametrize(
    ("image", "problem"), [(b"", "is not an ELF file"), (b"\x7fELF\x02\x01", "is truncated")]
)
def test_a_file_that_is_no_library_says_what_it_is(image: bytes, problem: str) -> None:
    assert (hami_core_library_problem(image) or "").startswith(problem)
