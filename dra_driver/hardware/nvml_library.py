"""Finding libnvidia-ml.so.1 under the driver root and handing it to nvidia-ml-py.

nvidia-ml-py loads the library by its SONAME only (`CDLL("libnvidia-ml.so.1")`), which searches
the agent's own container, where there is no driver: the driver lives under the driver root (`/`
on a plain host, `/run/nvidia/driver` with the GPU Operator). So the library is looked up in the
root's own loader cache and usual library directories, and loaded from there first. The dynamic
loader matches an already loaded library by its SONAME, so nvidia-ml-py's own `CDLL` then gets
this very library, through its own loading code and bindings. Where the root has none, the
default search path (LD_LIBRARY_PATH, the container's ld.so.cache) still gets its turn.
"""

import ctypes
from pathlib import Path, PurePosixPath

import msgspec

from dra_driver.hardware.driver_root import UnusablePathError, resolve_in_root
from dra_driver.hardware.loader_cache import LOADER_CACHE, USUAL_LIBRARY_DIRS, cached_paths
from dra_driver.hardware.model import HardwareError, HardwareErrorReason

LIBRARY = "libnvidia-ml.so.1"
DEFAULT_SEARCH = f"the default library search path ({LIBRARY} by name)"


class Attempt(msgspec.Struct, frozen=True):
    """One place the library was looked for, and what was there."""

    where: str
    outcome: str

    def __str__(self) -> str:
        return f"{self.where} ({self.outcome})"


class NvmlLibraryNotFound(HardwareError):
    """No libnvidia-ml.so.1 could be loaded; `attempts` says where it was looked for."""

    def __init__(self, driver_root: Path, attempts: tuple[Attempt, ...]) -> None:
        tried = "; ".join(map(str, attempts))
        super().__init__(
            f"{LIBRARY} not found under driver root {driver_root} (--driver-root, DRA_DRIVER_ROOT); "
            f"tried: {tried}",
            HardwareErrorReason.LIBRARY_NOT_FOUND,
        )
        self.driver_root = driver_root
        self.attempts = attempts


def cached_library_paths(cache: bytes) -> list[str]:
    """The paths of libnvidia-ml.so.1 that an ld.so.cache names, in the cache's order (each tried
    in turn: one that does not load, a 32-bit copy, gives way to the next)."""
    return [path for path in cached_paths(cache) if PurePosixPath(path).name == LIBRARY]


def candidate_paths(driver_root: Path) -> list[str]:
    """Where the library may be, as paths inside the root: its loader cache's entries first (what
    the root's own programs would load), then the usual directories."""
    cache_file = driver_root / LOADER_CACHE.lstrip("/")
    try:
        cached = cached_library_paths(cache_file.read_bytes())
    except OSError:
        cached = []
    usual = [f"{directory}/{LIBRARY}" for directory in USUAL_LIBRARY_DIRS]
    return [*cached, *(path for path in usual if path not in cached)]


def _load_from_root(driver_root: Path, path: str) -> tuple[Path | None, Attempt]:
    try:
        resolved = resolve_in_root(driver_root, path)
    except UnusablePathError as error:
        return None, Attempt(str(driver_root / path.lstrip("/")), str(error.problem.reason))
    host_path = driver_root / path.lstrip("/")
    if resolved is None:
        return None, Attempt(str(host_path), "absent")
    real = driver_root / str(resolved).lstrip("/")
    try:
        ctypes.CDLL(str(real))
    except OSError as error:
        return None, Attempt(str(host_path), f"cannot be loaded: {error}")
    return real, Attempt(str(host_path), "loaded")


def load_nvml_library(driver_root: Path) -> str:
    """Loads libnvidia-ml.so.1, from the driver root if it has one; returns where it came from.

    Loading twice is harmless (the loader counts references), so callers need not remember.
    Raises NvmlLibraryNotFound listing every place tried.
    """
    attempts: list[Attempt] = []
    for path in candidate_paths(driver_root):
        loaded, attempt = _load_from_root(driver_root, path)
        attempts.append(attempt)
        if loaded is not None:
            return str(loaded)
    try:
        ctypes.CDLL(LIBRARY)
    except OSError as error:
        attempts.append(Attempt(DEFAULT_SEARCH, f"cannot be loaded: {error}"))
        raise NvmlLibraryNotFound(driver_root, tuple(attempts)) from None
    return DEFAULT_SEARCH
