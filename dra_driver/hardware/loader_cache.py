"""The library paths a root's own loader cache (`<root>/etc/ld.so.cache`) names.

A driver root's loader cache says where its own programs get their libraries, including
directories no distribution uses by default (/usr/local/nvidia/lib64 on GPU cloud images, named
by a file in /etc/ld.so.conf.d). The cache's string table holds every library's full path, and
that is all the driver's lookups need, so the binary entries (whose layout differs between glibc
versions) are not decoded. The table is ordered for the loader's binary search, not by priority:
where two directories hold the same library the choice is the caller's.
"""

import re
from pathlib import PurePosixPath

LOADER_CACHE = "/etc/ld.so.cache"
# Where distributions put 64-bit libraries when the loader cache does not say (Debian/Ubuntu
# multiarch first, then the RPM world's lib64, then the plain directories): the one list that
# loading NVML and discovering the driver's files both search after the cache.
USUAL_LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
)
# Both layouts glibc has written: the old one (which newer glibc still prefixes in compat mode)
# and the new one. Either way the file ends in a table of NUL-terminated strings.
_CACHE_MAGICS = (b"ld.so-1.7.0", b"glibc-ld.so.cache")


def cached_paths(cache: bytes) -> list[str]:
    """Every absolute path the cache names, in the cache's order, each once; nothing for a file
    that is not a loader cache."""
    if not cache.startswith(_CACHE_MAGICS):
        return []
    paths: dict[str, None] = {}
    for raw in cache.split(b"\0"):
        text = raw.decode("utf-8", "replace")
        if text.startswith("/"):
            paths[text] = None
    return list(paths)


def cached_directories(cache: bytes, names: re.Pattern[str]) -> list[str]:
    """The directories, in the cache's order, of the cached libraries whose file name matches
    `names` (ldconfig names a library by its SONAME link, libcuda.so.1, which is not necessarily
    the file that link points to)."""
    directories: dict[str, None] = {}
    for path in cached_paths(cache):
        pure = PurePosixPath(path)
        if names.fullmatch(pure.name):
            directories[str(pure.parent)] = None
    return list(directories)
