"""Where built components and images are kept between runs: outside the work tree, so a fresh
clone reuses them and `git clean` never costs a half-hour rebuild."""

import os
from pathlib import Path


def cache_root() -> Path:
    """DRA_DRIVER_CLUSTER_CACHE, else ~/.cache/dra-driver/cluster (XDG_CACHE_HOME respected)."""
    explicit = os.environ.get("DRA_DRIVER_CLUSTER_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dra-driver" / "cluster"
