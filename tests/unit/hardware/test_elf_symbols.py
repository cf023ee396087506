"""Exported symbols read from real gcc-built libraries and hand-laid ones, with readelf as the
judge, and damaged or hostile bytes that must end in `ElfError` and nothing else."""

import contextlib
import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_driver.hardware.elf_symbols import ElfError, exported_symbols
from tests.support.elf_libraries import (
    HOOKS_SOURCE,
    Symbol,
    gcc,
    hooks_library,
    laid_out_library,
    readelf_symbols,
)

HOOKS = {"cuMemAlloc_v2", "cuMemGetInfo_v2", "cuLaunchKernel"}
# Every way a symbol can be in the dynamic table and not be something another object binds to.
MIXED_SOURCE = """
extern int imported(void);
int global_function(void) { return imported(); }
__attribute__((weak)) int weak_function(void) { return 0; }
__attribute__((visibility("protected"))) int protected_function(void) { return 0; }
__attribute__((visibility("hidden"))) int hidden_function(void) { return 0; }
static int local_function(void) { return 0; }
int global_data = 1;
int (*keep)(void) = local_function;
"""
LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("elf")
    return {
        "visible": hooks_library(directory, "visible.so"),
        "hidden": hooks_library(directory, "hidden.so", "-fvisibility=hidden"),
        "elf32": hooks_library(directory, "elf32.so", "-m32", "-nostdlib"),
        "mixed": gcc(directory, "mixed.so", MIXED_SOURCE, "-shared", "-fPIC"),
        "executable": gcc(directory, "executable", "int main(void) { return 0; }\n", "-no-pie"),
        "object": gcc(directory, "object.o", HOOKS_SOURCE, "-c", "-fPIC"),
    }


def agrees_with_readelf(path: Path) -> frozenset[str]:
    """What the parser says `path` exports among every name readelf lists, once checked equal to
    what readelf says it exports."""
    every, exported = readelf_symbols(path)
    found = exported_symbols(path.read_bytes(), among=every | {"not_in_the_table"})
    assert found == exported
    return found


def test_a_library_built_with_default_visibility_exports_its_functions(built: dict[str, Path]) -> None:
    assert agrees_with_readelf(built["visible"]) >= HOOKS


def test_the_same_source_built_with_hidden_visibility_exports_none_of_them(built: dict[str, Path]) -> None:
    assert not agrees_with_readelf(built["hidden"]) & HOOKS
    assert not exported_symbols(built["hidden"].read_bytes(), among=HOOKS)


def test_a_32_bit_library_is_read_with_its_own_layout(built: dict[str, Path]) -> None:
    assert built["elf32"].read_bytes()[4] == 1  # ELFCLASS32
    assert agrees_with_readelf(built["elf32"]) == HOOKS


def test_weak_and_protected_count_hidden_local_and_undefined_do_not(built: dict[str, Path]) -> None:
    exported = agrees_with_readelf(built["mixed"])

    assert {"global_function", "weak_function", "protected_function", "global_data"} <= exported
    assert not {"hidden_function", "local_function", "imported"} & exported


@pytest.mark.skipif(not LIBC.is_file(), reason="no glibc at the Debian path")
def test_glibc_with_its_versioned_symbols_agrees_with_readelf() -> None:
    assert "malloc" in agrees_with_readelf(LIBC)


LAID_OUT = [
    Symbol("cuMemAlloc_v2"),
    Symbol("cuLaunchKernel", binding=2),
    Symbol("cuMemGetInfo_v2", visibility=3),
    Symbol("hidden_hook", visibility=2),
    Symbol("local_hook", binding=0),
    Symbol("imported_hook", defined=False),
]


@pytest.mark.parametrize(("bits", "order"), [(64, "<"), (64, ">"), (32, "<"), (32, ">")])
def test_each_class_and_byte_order_is_read_as_the_header_says(bits: int, order: str, tmp_path: Path) -> None:
    (tmp_path / "laid-out.so").write_bytes(laid_out_library(LAID_OUT, bits=bits, order=order))

    assert agrees_with_readelf(tmp_path / "laid-out.so") == HOOKS


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("executable", "is an ELF file of type ET_EXEC (an executable), not a shared object (ET_DYN)"),
        ("object", "is an ELF file of type ET_REL (an object file), not a shared object (ET_DYN)"),
    ],
)
def test_an_elf_file_that_is_not_a_shared_object_is_refused(
    built: dict[str, Path], kind: str, message: str
) -> None:
    with pytest.raises(ElfError) as error:
        exported_symbols(built[kind].read_bytes(), among=HOOKS)
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (b"", "is not an ELF file"),
        (b"#!/bin/sh\nexit 0\n", "is not an ELF file"),
        (b"\x7fELF\x03\x01" + bytes(58), "has ELF class 3, neither 32-bit (1) nor 64-bit (2)"),
        (b"\x7fELF\x02\x07" + bytes(58), "has ELF data encoding 7, neither little (1) nor big endian (2)"),
        (
            b"\x7fELF\x02\x01\x01" + bytes(20),
            "is truncated: the ELF header at byte 16 is past its end (27 bytes)",
        ),
    ],
)
def test_bytes_that_are_no_elf_file_are_named_for_what_they_are(image: bytes, message: str) -> None:
    with pytest.raises(ElfError) as error:
        exported_symbols(image, among=HOOKS)
    assert str(error.value) == message


def test_a_library_cut_short_anywhere_is_truncated(built: dict[str, Path]) -> None:
    image = built["visible"].read_bytes()
    for length in (20, 63, 64, len(image) // 2, len(image) - 64, len(image) - 1):
        with pytest.raises(ElfError, match="is truncated"):
            exported_symbols(image[:length], among=HOOKS)


def test_a_library_without_section_headers_says_it_cannot_be_listed() -> None:
    image = bytearray(laid_out_library(LAID_OUT, bits=64, order="<"))
    struct.pack_into("<QHHHHHH", image, 0x28, 0, 64, 0, 0, 0, 0, 0)  # e_shoff .. e_shstrndx

    with pytest.raises(ElfError, match="has no section headers"):
        exported_symbols(bytes(image), among=HOOKS)


def test_a_section_count_beyond_the_file_is_refused_without_being_walked() -> None:
    image = bytearray(laid_out_library(LAID_OUT, bits=64, order="<"))
    struct.pack_into("<H", image, 0x3C, 0xFFFF)  # e_shnum

    with pytest.raises(ElfError, match="65535 section headers"):
        exported_symbols(bytes(image), among=HOOKS)


def test_a_symbol_table_larger_than_the_file_is_refused() -> None:
    image = bytearray(laid_out_library(LAID_OUT, bits=64, order="<"))
    sections_at = struct.unpack_from("<Q", image, 0x28)[0]
    struct.pack_into("<Q", image, sections_at + 64 + 0x20, 2**62)  # .dynsym's sh_size

    with pytest.raises(ElfError, match=r"dynamic symbol table \(.*\) is past its end"):
        exported_symbols(bytes(image), among=HOOKS)


def test_a_symbol_name_outside_the_string_table_is_refused() -> None:
    image = bytearray(laid_out_library(LAID_OUT, bits=64, order="<"))
    sections_at = struct.unpack_from("<Q", image, 0x28)[0]
    dynsym_at = struct.unpack_from("<Q", image, sections_at + 64 + 0x18)[0]
    struct.pack_into("<I", image, dynsym_at + 24, 0xFFFF)  # the first symbol's st_name

    with pytest.raises(ElfError, match="symbol name at byte 65535 of its string table"):
        exported_symbols(bytes(image), among=HOOKS)


def test_a_name_longer_than_any_asked_about_is_none_of_them() -> None:
    image = laid_out_library([*LAID_OUT, Symbol("cuMemAlloc_v2_but_longer")], bits=64, order="<")

    assert exported_symbols(image, among={"cuMemAlloc_v2", "cuLaunchKernel"}) == {
        "cuMemAlloc_v2",
        "cuLaunchKernel",
    }


def test_a_name_that_runs_off_the_end_of_its_string_table_is_refused() -> None:
    image = laid_out_library([Symbol("cuMemAlloc_v2")], bits=64, order="<")
    # The string table is b"\0cuMemAlloc_v2\0", right after the 64-byte header: drop its last NUL.
    unterminated = image[:78] + b"2" + image[79:]

    with pytest.raises(ElfError, match="symbol name at byte 1 of its string table that never ends"):
        exported_symbols(unterminated, among=HOOKS)


def test_overlapping_names_cost_the_longest_name_asked_about_not_the_table() -> None:
    """40,000 symbols whose names run into each other for 4 MB: reading each to its NUL would
    scan and copy about 80 GB."""
    symbols = [Symbol(f"{index:0100d}") for index in range(40_000)]
    image = laid_out_library(symbols, bits=64, order="<")
    strings_end = 64 + 1 + 101 * len(symbols)
    image = image[:65] + image[65 : strings_end - 1].replace(b"\0", b"x") + image[strings_end - 1 :]

    started = time.perf_counter()
    assert exported_symbols(image, among=HOOKS) == frozenset()
    assert time.perf_counter() - started < 5


def only_elf_error(image: bytes) -> None:
    """The property: an answer or `ElfError`, never struct.error, IndexError, MemoryError..."""
    with contextlib.suppress(ElfError):
        exported_symbols(image, among=HOOKS)


@settings(max_examples=300)
@given(st.binary(max_size=512))
def test_random_bytes_raise_nothing_but_elf_error(image: bytes) -> None:
    only_elf_error(image)


@settings(max_examples=300)
@given(st.sampled_from([(64, "<"), (64, ">"), (32, "<"), (32, ">")]), st.data())
def test_a_laid_out_library_with_any_bytes_changed_raises_nothing_but_elf_error(
    layout: tuple[int, str], data: st.DataObject
) -> None:
    image = bytearray(laid_out_library(LAID_OUT, bits=layout[0], order=layout[1]))
    changes = data.draw(st.lists(st.tuples(st.integers(4, len(image) - 1), st.integers(0, 255)), max_size=8))
    for at, value in changes:
        image[at] = value
    only_elf_error(bytes(image[: data.draw(st.integers(0, len(image)))]))


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_gcc_built_library_with_any_bytes_changed_raises_nothing_but_elf_error(
    built: dict[str, Path], data: st.DataObject
) -> None:
    image = bytearray(built["visible"].read_bytes())
    # The ELF header and the section header table hold every offset and count the parser follows.
    sections_at = struct.unpack_from("<Q", image, 0x28)[0]
    where = st.one_of(st.integers(4, 63), st.integers(sections_at, len(image) - 1))
    for at, value in data.draw(st.lists(st.tuples(where, st.integers(0, 255)), min_size=1, max_size=6)):
        image[at] = value
    only_elf_error(bytes(image))
