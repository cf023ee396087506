"""Named node config directories as kubelet writes a mounted ConfigMap, and what a published
pool offers per GPU."""

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def write_configmap(directory: Path, files: Mapping[str, str]) -> None:
    """Replaces the directory's files the way kubelet's atomic writer updates a ConfigMap volume:
    the data goes into a new hidden directory, `..data` is swapped to it by a rename, and each
    visible file is a symlink through `..data`."""
    directory.mkdir(parents=True, exist_ok=True)
    version = directory / f"..{time.monotonic_ns()}"
    version.mkdir()
    for name, text in files.items():
        (version / name).write_text(text)
    staged = directory / "..data_tmp"
    staged.symlink_to(version.name)
    staged.rename(directory / "..data")
    for name in files:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(Path("..data") / name)
    for entry in directory.iterdir():
        if entry.is_symlink() and entry.name not in files and not entry.name.startswith(".."):
            entry.unlink()  # a key removed from the ConfigMap
    os.sync()


def kinds_by_gpu(slice_specs: Iterable[Mapping[str, Any]]) -> dict[int, set[str]]:
    """GPU index -> the types of the devices published for it (gpu, mig, vgpu)."""
    kinds: dict[int, set[str]] = {}
    for spec in slice_specs:
        for device in spec.get("devices") or []:
            attributes = device["attributes"]
            index = attributes.get("parentIndex", attributes.get("index"))["int"]
            kinds.setdefault(index, set()).add(attributes["type"]["string"])
    return kinds
