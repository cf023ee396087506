"""OCI image layouts written as tar files, for `ctr -n k8s.io images import`: the node has no
registry to pull from, so its images are made here from a root filesystem, one uncompressed layer
each. Every byte is a function of the input (no timestamps, owners or directory order), so the
same rootfs gives the same manifest digest and the cache can be checked by content."""

import contextlib
import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
# containerd's importer names the image after this annotation; without it, ctr would fall back to
# the bare tag in the OCI one and the kubelet would never find the image under its full name.
CONTAINERD_NAME_ANNOTATION = "io.containerd.image.name"
OCI_REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"
PLATFORM = {"architecture": "amd64", "os": "linux"}

_CHUNK = 1 << 20


def write_image(
    out: Path,
    name: str,
    layer: Path,
    *,
    entrypoint: list[str],
    cmd: list[str] | None = None,
    env: list[str] | None = None,
    working_dir: str | None = None,
) -> str:
    """Writes the one-layer image `name` as an OCI layout tar at `out` and returns its manifest
    digest. An empty `entrypoint` is left out of the config, as Docker Hub's busybox does, so
    that a pod's `command` replaces `cmd` alone."""
    tag = image_tag(name)
    if not layer.is_file():
        raise FileNotFoundError(f"OCI image {name}: the layer tar {layer} is not a file")
    layer_digest, layer_size = _file_digest(layer)
    config = _canonical_json(
        {
            "architecture": PLATFORM["architecture"],
            "os": PLATFORM["os"],
            "config": _runtime_config(entrypoint, cmd, env, working_dir),
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
    )
    manifest = _canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": _descriptor(CONFIG_MEDIA_TYPE, _digest(config), len(config)),
            "layers": [_descriptor(LAYER_MEDIA_TYPE, layer_digest, layer_size)],
        }
    )
    manifest_digest = _digest(manifest)
    manifest_descriptor = _descriptor(MANIFEST_MEDIA_TYPE, manifest_digest, len(manifest))
    manifest_descriptor["annotations"] = {CONTAINERD_NAME_ANNOTATION: name, OCI_REF_NAME_ANNOTATION: tag}
    manifest_descriptor["platform"] = dict(PLATFORM)
    index = _canonical_json(
        {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [manifest_descriptor]}
    )
    with atomic_file(out) as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_directory(tar, "blobs")
        _add_directory(tar, "blobs/sha256")
        blobs = sorted([(config, _digest(config)), (manifest, manifest_digest)], key=lambda blob: blob[1])
        for content, digest in blobs:
            _add_bytes(tar, _blob_path(digest), content)
        with layer.open("rb") as layer_file:
            tar.addfile(_regular_entry(_blob_path(layer_digest), layer_size), layer_file)
        _add_bytes(tar, "index.json", index)
        _add_bytes(tar, "oci-layout", _canonical_json({"imageLayoutVersion": "1.0.0"}))
    return manifest_digest


def image_tag(name: str) -> str:
    """The tag of a full reference (`docker.io/library/busybox:1.37` -> `1.37`): a colon after
    the last slash, since a registry's port (`localhost:5000/x`) is one too."""
    repository, colon, tag = name.rpartition(":")
    if (
        not colon
        or not repository
        or not tag
        or "/" in tag
        or "@" in name
        or any(character.isspace() for character in name)
    ):
        raise ValueError(f"OCI image name {name!r} is not a reference with a tag (registry/path:tag)")
    return tag


def layer_from_directory(root: Path, out: Path) -> None:
    """Tars the tree under `root` into the layer `out`: entries sorted by path, owned by root,
    mtime 0, symlinks kept as links, so an unchanged tree gives an identical layer digest no matter
    when or by whom it was laid out. Modes are kept (a rootfs needs /tmp's sticky bit)."""
    if not root.is_dir():
        raise NotADirectoryError(f"layer root {root} is not a directory")
    with atomic_file(out) as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _sorted_tree(root):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            if info is None or not (info.isreg() or info.isdir() or info.issym() or info.islnk()):
                raise ValueError(f"layer root {root}: {path} is neither a file, a directory nor a symlink")
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isreg():
                with path.open("rb") as content:
                    tar.addfile(info, content)
            else:
                tar.addfile(info)


@contextlib.contextmanager
def atomic_file(out: Path) -> Iterator[IO[bytes]]:
    """A file that appears at `out` complete or not at all: a cache that finds `out` may trust it
    even after a crash mid-write (temp file in the same directory, fsync, rename, fsync of the
    directory so the rename itself survives)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        Path(temporary).chmod(0o644)
        Path(temporary).replace(out)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(out.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _sorted_tree(root: Path) -> Iterator[Path]:
    """Every path under `root`, parents before children, siblings by name; symlinked directories
    are entries, not descended into."""
    for child in sorted(root.iterdir(), key=lambda path: path.name):
        yield child
        if stat.S_ISDIR(child.lstat().st_mode):
            yield from _sorted_tree(child)


def _runtime_config(
    entrypoint: list[str], cmd: list[str] | None, env: list[str] | None, working_dir: str | None
) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if entrypoint:
        config["Entrypoint"] = list(entrypoint)
    if cmd is not None:
        config["Cmd"] = list(cmd)
    if env is not None:
        malformed = [entry for entry in env if "=" not in entry or entry.startswith("=")]
        if malformed:
            raise ValueError(f"OCI image env entries {malformed} are not NAME=value")
        config["Env"] = list(env)
    if working_dir is not None:
        if not working_dir.startswith("/"):
            raise ValueError(f"OCI image working directory {working_dir!r} is not absolute")
        config["WorkingDir"] = working_dir
    return config


def _canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _digest(content: bytes) -> str:
    return f"sha256:{hashlib.sha256(content).hexdigest()}"


def _file_digest(path: Path) -> tuple[str, int]:
    """Streamed: a layer may be larger than is comfortable to hold in memory."""
    hasher = hashlib.sha256()
    size = 0
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return f"sha256:{hasher.hexdigest()}", size


def _descriptor(media_type: str, digest: str, size: int) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest, "size": size}


def _blob_path(digest: str) -> str:
    return "blobs/" + digest.replace(":", "/", 1)


def _regular_entry(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.uname = info.gname = "root"
    return info


def _add_bytes(tar: tarfile.TarFile, name: str, content: bytes) -> None:
    tar.addfile(_regular_entry(name, len(content)), io.BytesIO(content))


def _add_directory(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.uname = info.gname = "root"
    tar.addfile(info)
