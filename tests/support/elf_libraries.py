"""Shared libraries for the ELF symbol checks: real ones built with gcc, and hand-laid ones for
the byte orders and classes this machine's gcc cannot produce (big-endian), read back by
`readelf` so that the tests do not trust the same understanding of ELF twice.
"""

import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

# The three hooks the agent requires, as HAMi-core defines them (bodies do not matter here).
HOOKS_SOURCE = """
int cuMemAlloc_v2(void **dptr, unsigned long bytesize) { (void)dptr; (void)bytesize; return 0; }
int cuMemGetInfo_v2(unsigned long *free, unsigned long *total) { (void)free; (void)total; return 0; }
int cuLaunchKernel(void) { return 0; }
"""


def gcc(directory: Path, name: str, source: str, *flags: str) -> Path:
    """Compiles `source` into `directory/name` with `flags` after gcc's own."""
    source_file = directory / f"{name}.c"
    source_file.write_text(source)
    output = directory / name
    result = subprocess.run(
        ["gcc", *flags, "-o", str(output), str(source_file)], check=False, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"gcc {' '.join(flags)} {name} failed:\n{result.stderr}")
    return output


def hooks_library(directory: Path, name: str, *flags: str) -> Path:
    return gcc(directory, name, HOOKS_SOURCE, "-shared", "-fPIC", *flags)


def readelf_symbols(path: Path) -> tuple[frozenset[str], frozenset[str]]:
    """binutils' answer: every name in the dynamic symbol table, and those exported (defined,
    GLOBAL or WEAK, DEFAULT or PROTECTED); version suffixes dropped."""
    result = subprocess.run(
        ["readelf", "--dyn-syms", "--wide", str(path)], check=True, capture_output=True, text=True
    )
    every, exported = set(), set()
    for line in result.stdout.splitlines():
        # Num: Value Size Type Bind Vis Ndx Name
        fields = line.split()
        if len(fields) >= 8 and fields[0].endswith(":") and fields[0][:-1].isdigit():
            bind, visibility, index, name = fields[4], fields[5], fields[6], fields[7].split("@")[0]
            every.add(name)
            if index != "UND" and bind in ("GLOBAL", "WEAK") and visibility in ("DEFAULT", "PROTECTED"):
                exported.add(name)
    return frozenset(every), frozenset(exported)


@dataclass(frozen=True)
class Symbol:
    name: str
    # STB_* and STV_* values; `defined` puts it in section 1 (else SHN_UNDEF).
    binding: int = 1
    visibility: int = 0
    defined: bool = True


def laid_out_library(symbols: list[Symbol], *, bits: int, order: str, e_type: int = 3) -> bytes:
    """A shared object with nothing but a dynamic symbol table, its string table and the section
    name table: header | .dynstr | .dynsym | .shstrtab | section headers."""
    wide = bits == 64
    header_size, section_size, symbol_size = (64, 64, 24) if wide else (52, 40, 16)
    dynstr = b"\0" + b"".join(symbol.name.encode() + b"\0" for symbol in symbols)
    name_offsets, at = [], 1
    for symbol in symbols:
        name_offsets.append(at)
        at += len(symbol.name) + 1
    table = [b"\0" * symbol_size]
    for symbol, name in zip(symbols, name_offsets, strict=True):
        info, other, index = (symbol.binding << 4) | 2, symbol.visibility, 1 if symbol.defined else 0
        if wide:
            table.append(struct.pack(order + "IBBHQQ", name, info, other, index, 0x1000, 8))
        else:
            table.append(struct.pack(order + "IIIBBH", name, 0x1000, 8, info, other, index))
    dynsym = b"".join(table)
    shstrtab = b"\0.dynsym\0.dynstr\0.shstrtab\0"
    dynstr_at = header_size
    dynsym_at = dynstr_at + len(dynstr)
    shstrtab_at = dynsym_at + len(dynsym)
    sections_at = shstrtab_at + len(shstrtab)
    # name, type, flags, address, offset, size, link, info, alignment, entry size
    sections = [
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        (1, 11, 2, dynsym_at, dynsym_at, len(dynsym), 2, 1, 8, symbol_size),
        (9, 3, 2, dynstr_at, dynstr_at, len(dynstr), 0, 0, 1, 0),
        (17, 3, 0, 0, shstrtab_at, len(shstrtab), 0, 0, 1, 0),
    ]
    section_format = order + ("IIQQQQIIQQ" if wide else "IIIIIIIIII")
    machine = 43 if wide else 20  # SPARC V9, PowerPC: big-endian machines readelf knows
    ident = b"\x7fELF" + bytes([2 if wide else 1, 1 if order == "<" else 2, 1]) + b"\0" * 9
    header = struct.pack(
        order + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH"),
        *(e_type, machine, 1, 0, 0, sections_at, 0, header_size, 0, 0, section_size, len(sections), 3),
    )
    body = dynstr + dynsym + shstrtab
    return ident + header + body + b"".join(struct.pack(section_format, *row) for row in sections)
