"""The symbols a shared library exports, read from its ELF file without loading it (pure).

Loading a library to ask it (`ctypes.CDLL`) runs its constructors in the agent: HAMi-core's
would start initialising CUDA hooks in a process that has no business with them. The dynamic
symbol table says the same thing from the bytes alone.

The table is found through the section headers (the `SHT_DYNSYM` section and the string table
its `sh_link` names). A library stripped of its section headers (`sstrip`) still has the table,
reachable only through its `PT_DYNAMIC` segment; no toolchain that builds HAMi-core does that,
so such a file gets an error that says so rather than a second parser.

Every offset and count comes from the file, so each is checked against the bytes at hand before
it is used, and the only exception that leaves this module is `ElfError`. The caller says which
names it asks about rather than getting every name: the names of a hostile table can overlap
(each symbol's name starting one byte after the last, with no NUL for megabytes), so listing them
all costs the square of the table's size, while matching against known names reads at most the
longest of them per symbol.
"""

import struct
from collections.abc import Iterable

import msgspec

from dra_driver.base.errors import OperatorFault

MAGIC = b"\x7fELF"
# e_ident: EI_CLASS at 4 (1: 32-bit, 2: 64-bit), EI_DATA at 5 (1: little, 2: big endian).
IDENT_SIZE = 16
ET_DYN = 3
FILE_TYPES = {0: "ET_NONE", 1: "ET_REL (an object file)", 2: "ET_EXEC (an executable)", 4: "ET_CORE"}
SHT_STRTAB = 3
SHT_DYNSYM = 11
SHN_UNDEF = 0
STB_GLOBAL = 1
STB_WEAK = 2
STV_DEFAULT = 0
STV_PROTECTED = 3


class ElfError(OperatorFault, ValueError):
    """What is wrong with the file, as words that follow its path (`<path>: <message>`)."""


class _Layout(msgspec.Struct, frozen=True):
    """The struct formats of one ELF class; the byte order is prefixed at use."""

    header: str
    section: str
    symbol: str
    # Where st_name, st_info, st_other and st_shndx are in an unpacked symbol.
    symbol_fields: tuple[int, int, int, int]


_LAYOUTS = {
    # e_type e_machine e_version e_entry e_phoff e_shoff e_flags e_ehsize e_phentsize e_phnum
    # e_shentsize e_shnum e_shstrndx; sh_name sh_type sh_flags sh_addr sh_offset sh_size sh_link
    # sh_info sh_addralign sh_entsize; ELF32 symbols put st_value and st_size before st_info.
    1: _Layout("HHIIIIIHHHHHH", "IIIIIIIIII", "IIIBBH", (0, 3, 4, 5)),
    2: _Layout("HHIQQQIHHHHHH", "IIQQQQIIQQ", "IBBHQQ", (0, 1, 2, 3)),
}


class _Section(msgspec.Struct, frozen=True):
    type: int
    offset: int
    size: int
    link: int
    entsize: int


def exported_symbols(image: bytes, among: Iterable[str]) -> frozenset[str]:
    """Which of the names `among` another object can bind to in this library: defined (not
    `SHN_UNDEF`), global or weak binding, default or protected visibility. A hidden symbol can
    still sit in the table, so visibility is checked, not just presence."""
    if image[:4] != MAGIC:
        raise ElfError("is not an ELF file")
    _unpack(image, f"{IDENT_SIZE}s", 0, "the ELF identification")
    layout = _LAYOUTS.get(image[4])
    if layout is None:
        raise ElfError(f"has ELF class {image[4]}, neither 32-bit (1) nor 64-bit (2)")
    order = {1: "<", 2: ">"}.get(image[5])
    if order is None:
        raise ElfError(f"has ELF data encoding {image[5]}, neither little (1) nor big endian (2)")
    header = _unpack(image, order + layout.header, IDENT_SIZE, "the ELF header")
    e_type, shoff, shentsize, shnum = header[0], header[5], header[10], header[11]
    if e_type != ET_DYN:
        kind = FILE_TYPES.get(e_type, e_type)
        raise ElfError(f"is an ELF file of type {kind}, not a shared object (ET_DYN)")
    sections = _sections(image, order + layout.section, shoff, shentsize, shnum)
    dynsym = next((section for section in sections if section.type == SHT_DYNSYM), None)
    if dynsym is None:
        return frozenset()
    if dynsym.link >= len(sections) or sections[dynsym.link].type != SHT_STRTAB:
        raise ElfError(f"has a dynamic symbol table whose string table (section {dynsym.link}) is not one")
    names = _contents(image, sections[dynsym.link], "its dynamic string table")
    symbols = _contents(image, dynsym, "its dynamic symbol table")
    wanted = {name.encode(): name for name in among}
    offsets = _exported(symbols, order + layout.symbol, dynsym.entsize, layout.symbol_fields)
    return frozenset(wanted[name] for name in _names(names, offsets, wanted) if name in wanted)


def _sections(image: bytes, fmt: str, offset: int, entsize: int, count: int) -> list[_Section]:
    if offset == 0:
        raise ElfError(
            "has no section headers (stripped with sstrip?), so its dynamic symbols cannot be listed"
        )
    if entsize < struct.calcsize(fmt):
        raise ElfError(f"has section headers of {entsize} bytes, fewer than {struct.calcsize(fmt)}")
    if count == 0:
        # Extended numbering (65280 sections or more): the count is section 0's sh_size.
        count = _section(image, fmt, offset).size
    if offset + count * entsize > len(image):
        raise ElfError(f"is truncated: {count} section headers at byte {offset} do not fit in it")
    return [_section(image, fmt, offset + index * entsize) for index in range(count)]


def _section(image: bytes, fmt: str, offset: int) -> _Section:
    _, type_, _, _, sh_offset, size, link, _, _, entsize = _unpack(image, fmt, offset, "a section header")
    return _Section(type_, sh_offset, size, link, entsize)


def _contents(image: bytes, section: _Section, what: str) -> bytes:
    if section.offset + section.size > len(image):
        raise ElfError(
            f"is truncated: {what} ({section.size} bytes at byte {section.offset}) is past its end"
        )
    return image[section.offset : section.offset + section.size]


def _exported(table: bytes, fmt: str, entsize: int, fields: tuple[int, int, int, int]) -> list[int]:
    """Where the exported symbols' names start in the string table."""
    if entsize < struct.calcsize(fmt):
        raise ElfError(f"has dynamic symbols of {entsize} bytes, fewer than {struct.calcsize(fmt)}")
    name_at, info_at, other_at, shndx_at = fields
    exported = []
    for offset in range(0, len(table) - entsize + 1, entsize):
        symbol = struct.unpack_from(fmt, table, offset)
        binding, visibility = symbol[info_at] >> 4, symbol[other_at] & 0x3
        if (
            symbol[shndx_at] != SHN_UNDEF
            and binding in (STB_GLOBAL, STB_WEAK)
            and visibility in (STV_DEFAULT, STV_PROTECTED)
        ):
            exported.append(symbol[name_at])
    return exported


def _names(table: bytes, offsets: list[int], wanted: Iterable[bytes]) -> list[bytes]:
    """The names at `offsets`, each read no further than the longest wanted name and its NUL: a
    longer one is none of them and is left out."""
    window = max(map(len, wanted), default=0) + 1
    names = []
    for offset in offsets:
        if offset >= len(table):
            raise ElfError(f"has a symbol name at byte {offset} of its string table, which is not in it")
        name, nul, _ = table[offset : offset + window].partition(b"\0")
        if nul:
            names.append(name)
        elif offset + window >= len(table):
            raise ElfError(f"has a symbol name at byte {offset} of its string table that never ends")
    return names


def _unpack(image: bytes, fmt: str, offset: int, what: str) -> tuple[int, ...]:
    if offset + struct.calcsize(fmt) > len(image):
        raise ElfError(f"is truncated: {what} at byte {offset} is past its end ({len(image)} bytes)")
    return struct.unpack_from(fmt, image, offset)
