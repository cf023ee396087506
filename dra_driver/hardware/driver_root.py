"""The NVIDIA user-space driver under a driver root: what is there, and where its device nodes are.

The driver root is `/` on a plain host, `/run/nvidia/driver` where the GPU operator's driver
container holds the driver, or a test tree. It is another system's `/`: its absolute symlinks
mean paths inside it, so every path is resolved within the root, and a symlink whose `..` climbs
out of it is refused. Following it would bind-mount some host file that is not the driver's into
every GPU container. claims/edits/driver_edits.py turns what discovery found into CDI edits.

Libraries are looked for the way the root's own loader finds them: first in the directories its
loader cache names for the driver's libraries, then in the usual directories. GPU cloud images
keep the driver in /usr/local/nvidia/lib64 (named by a file in /etc/ld.so.conf.d), GKE in
/home/kubernetes/bin/nvidia/lib64, where no list of usual directories would look. The cache names
a library by its SONAME link (libcuda.so.1), so its directory is taken and the versioned file
looked for there. Programs are looked for in the `bin` directory next to each of those library
directories (/usr/local/nvidia/bin), then in the usual ones. The cache's order is not the
loader's priority (see hardware/loader_cache.py); the one choice that matters, the 64-bit library
over the 32-bit copy an installer puts beside it in /usr/lib, is made by the file's ELF class.
"""

import re
import stat
from pathlib import Path, PurePosixPath

import msgspec
from msgspec.structs import replace

from dra_driver.base.errors import OperatorFault
from dra_driver.hardware.loader_cache import LOADER_CACHE, USUAL_LIBRARY_DIRS, cached_directories

UNKNOWN_VERSION = "unknown"

BINARY_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin")
FIRMWARE_DIR = "/lib/firmware/nvidia"
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# Only present where the display driver's modeset module is loaded.
OPTIONAL_DEVICE_NODES = ("/dev/nvidia-modeset",)
READ_ONLY_BIND = ("ro", "nosuid", "nodev", "bind")

_VERSION = r"\d+\.\d+(?:\.\d+)?"
_MAX_SYMLINKS = 40  # what Linux allows in one path lookup before ELOOP
# The ELF magic and class byte of a 32-bit object: a compatibility copy, never what a node loads.
_ELF_32_BIT = b"\x7fELF\x01"


class DriverLibrary(msgspec.Struct, frozen=True):
    """One library of the driver, shipped as lib<name>.so.<driver version>.

    `soname_suffix` is what follows `.so.` in its SONAME (libcuda.so.1), or None where the
    SONAME is the versioned file name itself. `expected` libraries are reported when missing;
    the others exist only in some driver builds.
    """

    name: str
    soname_suffix: str | None
    expected: bool = True

    def file_name(self, version: str) -> str:
        return f"lib{self.name}.so.{version}"


LIBRARIES = (
    DriverLibrary("nvidia-ml", "1"),
    DriverLibrary("cuda", "1"),
    DriverLibrary("cudadebugger", "1"),
    DriverLibrary("nvidia-ptxjitcompiler", "1"),
    DriverLibrary("nvidia-nvvm", "4"),
    DriverLibrary("nvidia-gpucomp", None),
    DriverLibrary("nvidia-allocator", "1"),
    DriverLibrary("nvidia-cfg", "1"),
    DriverLibrary("nvidia-opencl", "1"),
    DriverLibrary("nvidia-pkcs11", None, expected=False),
    DriverLibrary("nvidia-pkcs11-openssl3", None, expected=False),
)
_NAMES = "|".join(re.escape(library.name) for library in LIBRARIES)
_VERSIONED_LIBRARY = re.compile(rf"lib(?:{_NAMES})\.so\.(?P<version>{_VERSION})")
# Any name the loader cache may list a driver library under: its SONAME, or the versioned name.
_CACHED_LIBRARY = re.compile(rf"lib(?:{_NAMES})\.so\.\d+(?:\.\d+)*")


class DriverFile(msgspec.Struct, frozen=True):
    """A file of the driver. `path` is where it was found in the driver root; `resolved` is where
    it really lies in the root, every symlink followed. `soname` (libraries whose SONAME is not
    their file name) is the second name containers see it by. Where containers see it is
    claims/edits/driver_edits.py's choice."""

    path: str
    resolved: str
    soname: str = ""


class UnusablePath(msgspec.Struct, frozen=True):
    """A path in the driver root that was not followed, and why (for the node's log)."""

    path: str
    reason: str


class DriverDiscovery(msgspec.Struct, frozen=True):
    root: Path
    version: str  # as asked for, or the version found when asked for "unknown"
    libraries: tuple[DriverFile, ...]
    binaries: tuple[DriverFile, ...]
    firmware: tuple[DriverFile, ...]
    missing: tuple[str, ...]  # expected files not found (or found but unusable)
    unusable: tuple[UnusablePath, ...]
    # Where libraries and programs were looked for, in order (for messages naming them).
    library_dirs: tuple[str, ...]
    binary_dirs: tuple[str, ...]


class UnusablePathError(OperatorFault):
    def __init__(self, problem: UnusablePath) -> None:
        super().__init__(f"{problem.path}: {problem.reason}")
        self.problem = problem


def resolve_in_root(root: Path, path: str) -> PurePosixPath | None:
    """Where `path` (absolute, as seen inside the root) really lies in the root, or None if
    nothing is there.

    Symlinks are followed the way the kernel would follow them with `root` as `/`, except that
    `..` above the root is refused rather than clamped. Raises UnusablePathError, naming the
    offending symlink, for a symlink that escapes the root, one whose target does not exist in
    the root, and a symlink loop.
    """
    # Each pending component remembers the symlink whose target it came from (None: from `path`),
    # so a dead end is blamed on that link rather than reported as a plain absence.
    pending: list[tuple[str, str | None]] = [(part, None) for part in PurePosixPath(path).parts[1:]]
    resolved: list[str] = []
    followed = 0
    while pending:
        part, origin = pending.pop(0)
        if part == "..":
            if not resolved:
                raise UnusablePathError(UnusablePath(origin or path, "symlink climbs out of the driver root"))
            resolved.pop()
            continue
        if part == ".":
            continue
        here = root.joinpath(*resolved, part)
        try:
            mode = here.lstat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            if origin is None:
                return None
            raise UnusablePathError(
                UnusablePath(origin, "symlink target does not exist inside the driver root")
            ) from None
        if not stat.S_ISLNK(mode):
            resolved.append(part)
            continue
        followed += 1
        if followed > _MAX_SYMLINKS:
            raise UnusablePathError(UnusablePath(path, "too many levels of symlinks"))
        link = str(PurePosixPath("/", *resolved, part))
        target = PurePosixPath(here.readlink())
        if target.is_absolute():
            resolved = []
        target_parts = target.parts[1:] if target.is_absolute() else target.parts
        pending[:0] = [(target_part, link) for target_part in target_parts]
    return PurePosixPath("/", *resolved)


class _Finder:
    """Collects what a discovery found and what it could not use, without repeating a report."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.unusable: dict[UnusablePath, None] = {}

    def find_file(self, path: str) -> DriverFile | None:
        try:
            resolved = resolve_in_root(self.root, path)
        except UnusablePathError as error:
            self.unusable[error.problem] = None
            return None
        if resolved is None:
            return None
        if not self.root.joinpath(resolved.relative_to("/")).is_file():
            self.unusable[UnusablePath(path, "not a regular file")] = None
            return None
        return DriverFile(path=path, resolved=str(resolved))

    def first_file(self, directories: tuple[str, ...], name: str) -> DriverFile | None:
        for directory in directories:
            if (found := self.find_file(f"{directory}/{name}")) is not None:
                return found
        return None

    def first_library(self, directories: tuple[str, ...], name: str) -> DriverFile | None:
        """The first file named `name` in `directories` that is not a 32-bit ELF object."""
        for directory in directories:
            found = self.find_file(f"{directory}/{name}")
            if found is not None and not self._read(found, len(_ELF_32_BIT)).startswith(_ELF_32_BIT):
                return found
        return None

    def read_bytes(self, path: str) -> bytes:
        """A regular file of the root, resolved inside it; empty where it is missing or unusable."""
        found = self.find_file(path)
        return b"" if found is None else self._read(found, -1)

    def _read(self, file: DriverFile, size: int) -> bytes:
        try:
            with self.root.joinpath(file.resolved[1:]).open("rb") as opened:
                return opened.read(size)
        except OSError as error:
            self.unusable[UnusablePath(file.path, f"cannot be read: {error.strerror}")] = None
            return b""

    def names_in(self, directory: str) -> list[str]:
        """The entry names of a directory of the root; none where it is missing or unusable."""
        try:
            resolved = resolve_in_root(self.root, directory)
        except UnusablePathError as error:
            self.unusable[error.problem] = None
            return []
        host = None if resolved is None else self.root.joinpath(resolved.relative_to("/"))
        if host is None or not host.is_dir():
            return []
        return sorted(entry.name for entry in host.iterdir())


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(number) for number in version.split("."))


def _unique(paths: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(paths))


def _found_version(finder: _Finder, library_dirs: tuple[str, ...]) -> str | None:
    """The newest driver version any known library is shipped with; files of an older driver
    left behind by an upgrade are then ignored like any other version mismatch."""
    versions = {
        match["version"]
        for directory in library_dirs
        for name in finder.names_in(directory)
        if (match := _VERSIONED_LIBRARY.fullmatch(name))
    }
    return max(versions, key=_version_key, default=None)


def _libraries(
    finder: _Finder, version: str, library_dirs: tuple[str, ...]
) -> tuple[list[DriverFile], list[str]]:
    found, missing = [], []
    for library in LIBRARIES:
        file_name = library.file_name(version)
        file = finder.first_library(library_dirs, file_name)
        if file is None:
            if library.expected:
                missing.append(file_name)
        elif library.soname_suffix is None:
            found.append(file)
        else:
            found.append(replace(file, soname=f"lib{library.name}.so.{library.soname_suffix}"))
    return found, missing


def _firmware(finder: _Finder, version: str) -> list[DriverFile]:
    directory = f"{FIRMWARE_DIR}/{version}"
    files = [
        finder.find_file(f"{directory}/{name}")
        for name in finder.names_in(directory)
        if name.startswith("gsp") and name.endswith(".bin")
    ]
    return [file for file in files if file is not None]


def discover_driver(root: Path, version: str) -> DriverDiscovery:
    """The files of driver `version` (e.g. "580.95.05") under `root`.

    With version "unknown" the newest version any known library is found with is used. Files of
    other versions are ignored: mixing libraries of two drivers breaks CUDA in subtle ways.
    """
    root = root.absolute()
    finder = _Finder(root)
    cached = cached_directories(finder.read_bytes(LOADER_CACHE), _CACHED_LIBRARY)
    # After the cache, the first directory that holds a library wins (a 32-bit copy excepted).
    library_dirs = _unique([*cached, *USUAL_LIBRARY_DIRS])
    beside = [str(PurePosixPath(directory).parent / "bin") for directory in cached]
    binary_dirs = _unique([*beside, *BINARY_DIRS])
    wanted = _found_version(finder, library_dirs) if version == UNKNOWN_VERSION else version
    libraries: list[DriverFile] = []
    firmware: list[DriverFile] = []
    if wanted is None:
        missing = [library.file_name("*") for library in LIBRARIES if library.expected]
        missing.append(f"{FIRMWARE_DIR}/*/gsp*.bin")
    else:
        libraries, missing = _libraries(finder, wanted, library_dirs)
        firmware = _firmware(finder, wanted)
        if not firmware:
            missing.append(f"{FIRMWARE_DIR}/{wanted}/gsp*.bin")
    binaries = []
    for name in BINARIES:
        file = finder.first_file(binary_dirs, name)
        if file is None:
            missing.append(name)
        else:
            binaries.append(file)
    return DriverDiscovery(
        root=root,
        version=wanted or UNKNOWN_VERSION,
        libraries=tuple(libraries),
        binaries=tuple(binaries),
        firmware=tuple(firmware),
        missing=tuple(missing),
        unusable=tuple(finder.unusable),
        library_dirs=library_dirs,
        binary_dirs=binary_dirs,
    )


class DeviceRoot(msgspec.Struct, frozen=True):
    """The directory whose dev/ holds the NVIDIA device nodes: `seen` as the agent sees it,
    `host` as the host (and so the container runtime, which resolves CDI host paths) sees it."""

    seen: Path
    host: Path


def device_root(driver_root: Path, host_driver_root: Path) -> DeviceRoot:
    """The driver root where it has a dev/ directory, else the host's own /.

    The GPU operator's driver container makes the device nodes in its own /dev, which the host
    sees under /run/nvidia/driver/dev; a driver installed on the host makes them in /dev. A
    driver root without dev/ (a tree of libraries only) leaves the nodes to the host's /dev.
    This is the rule NVIDIA's own tools apply to their driver root.
    """
    if driver_root.joinpath("dev").is_dir():
        return DeviceRoot(driver_root, host_driver_root)
    return DeviceRoot(Path("/"), Path("/"))
