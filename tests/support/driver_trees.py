"""Driver roots as real installs leave them: gcc-built shared objects named and SONAMEd like the
driver's, its programs and firmware, and the root's loader cache written by the real ldconfig
(which also makes the SONAME links, as it does after an install)."""

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

VERSION = "580.95.05"
# Every library the driver ships, with the suffix of its SONAME (None: the versioned name itself).
SONAMES = {
    "nvidia-ml": "1",
    "cuda": "1",
    "cudadebugger": "1",
    "nvidia-ptxjitcompiler": "1",
    "nvidia-nvvm": "4",
    "nvidia-gpucomp": None,
    "nvidia-allocator": "1",
    "nvidia-cfg": "1",
    "nvidia-opencl": "1",
    "nvidia-pkcs11-openssl3": None,
}
PROGRAMS = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
# Each library says which file it is, so a program in a container can tell what it loaded.
_SOURCE = 'const char *dra_test_library(void) {{ return "{file_name}"; }}\n'


def soname(name: str) -> str:
    suffix = SONAMES[name]
    return f"lib{name}.so.{suffix if suffix else VERSION}"


def compile_c(source: str, output: Path, *flags: str) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    source_file = output.with_name(f"{output.name}.c")
    source_file.write_text(source)
    built = subprocess.run(
        ["gcc", *flags, "-o", str(output), str(source_file)], capture_output=True, text=True, check=False
    )
    source_file.unlink()
    assert built.returncode == 0, built.stderr
    return output


def build_libraries(directory: Path, bits: int = 64) -> Path:
    """Every driver library, compiled into `directory` under its versioned name; `bits=32` makes
    the 32-bit copies an installer puts beside them (no C library needed for those)."""
    for name in SONAMES:
        file_name = f"lib{name}.so.{VERSION}"
        flags = ("-m32", "-nostdlib") if bits == 32 else ()
        compile_c(
            _SOURCE.format(file_name=file_name),
            directory / file_name,
            *flags,
            "-shared",
            "-fPIC",
            f"-Wl,-soname,{soname(name)}",
        )
    return directory


@dataclass(frozen=True)
class Layout:
    """Where one kind of node keeps the driver, as paths inside the driver root."""

    library_dir: str
    binary_dir: str
    # What the root's /etc/ld.so.conf names (ldconfig adds its own built-in directories).
    loader_dirs: tuple[str, ...]


def install(root: Path, libraries: Path, layout: Layout) -> Path:
    """Copies the built libraries into `layout.library_dir`, writes the programs and the
    firmware, and runs `ldconfig -r root`."""
    library_dir = root / layout.library_dir.lstrip("/")
    library_dir.mkdir(parents=True, exist_ok=True)
    for built in libraries.iterdir():
        shutil.copy2(built, library_dir / built.name)
    binary_dir = root / layout.binary_dir.lstrip("/")
    binary_dir.mkdir(parents=True, exist_ok=True)
    for program in PROGRAMS:
        (binary_dir / program).write_text(f"#!/bin/sh\necho {program}\n")
        (binary_dir / program).chmod(0o755)
    firmware = root / "lib/firmware/nvidia" / VERSION
    firmware.mkdir(parents=True, exist_ok=True)
    (firmware / "gsp_ga10x.bin").write_bytes(b"firmware")
    write_loader_cache(root, layout.loader_dirs)
    return root


def write_loader_cache(root: Path, directories: tuple[str, ...]) -> None:
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "ld.so.conf").write_text("".join(f"{directory}\n" for directory in directories))
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    made = subprocess.run(
        [ldconfig, "-r", str(root)], capture_output=True, text=True, timeout=60, check=False
    )
    assert made.returncode == 0, made.stderr
