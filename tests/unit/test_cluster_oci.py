"""The test cluster's OCI layout writer (tests/cluster/oci.py): containerd imports what it writes
only if every digest names its blob's bytes and the index names the image, and the image cache
trusts it only if the same root filesystem always gives the same bytes."""

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import oci

NAME = "docker.io/library/busybox:1.37"


def lay_out_tree(root: Path) -> Path:
    """A small rootfs with every kind of entry a layer keeps: files, an executable, nested and
    sticky directories, and a symlink."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "busybox").write_bytes(b"\x7fELF stand-in")
    (root / "bin" / "busybox").chmod(0o755)
    (root / "bin" / "sh").symlink_to("busybox")
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "passwd").chmod(0o644)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    (root / "usr" / "share" / "doc").mkdir(parents=True)
    return root


def members(tar_path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(tar_path) as tar:
        return tar.getmembers()


def layout_files(image: Path) -> dict[str, bytes]:
    """Every regular file of an OCI layout tar, by its path inside it."""
    files = {}
    with tarfile.open(image) as tar:
        for member in tar.getmembers():
            if member.isreg():
                extracted = tar.extractfile(member)
                assert extracted is not None
                files[member.name] = extracted.read()
    return files


def blob(files: dict[str, bytes], digest: str) -> bytes:
    algorithm, hexdigest = digest.split(":")
    assert algorithm == "sha256"
    return files[f"blobs/sha256/{hexdigest}"]


def json_blob(files: dict[str, bytes], descriptor: dict[str, Any]) -> Any:
    content = blob(files, descriptor["digest"])
    assert len(content) == descriptor["size"]
    return json.loads(content)


@pytest.fixture
def layer(tmp_path: Path) -> Path:
    out = tmp_path / "layer.tar"
    oci.layer_from_directory(lay_out_tree(tmp_path / "rootfs"), out)
    return out


def test_the_layer_holds_the_tree_sorted_owned_by_root_at_mtime_zero(layer: Path) -> None:
    entries = members(layer)

    names = [entry.name for entry in entries]
    assert names == [
        "bin",
        "bin/busybox",
        "bin/sh",
        "etc",
        "etc/passwd",
        "tmp",
        "usr",
        "usr/share",
        "usr/share/doc",
    ]
    assert all(entry.uid == entry.gid == 0 and entry.mtime == 0 for entry in entries)
    by_name = {entry.name: entry for entry in entries}
    assert by_name["bin/sh"].issym()
    assert by_name["bin/sh"].linkname == "busybox"
    assert by_name["bin/busybox"].mode == 0o755
    assert by_name["etc/passwd"].mode == 0o644
    assert by_name["tmp"].mode == 0o1777


def test_the_same_tree_gives_the_same_layer_bytes_whenever_and_however_it_was_laid_out(
    tmp_path: Path, layer: Path
) -> None:
    """Laid out again later, with other mtimes and files created in another order."""
    again = tmp_path / "again"
    (again / "usr" / "share" / "doc").mkdir(parents=True)
    (again / "tmp").mkdir()
    (again / "tmp").chmod(0o1777)
    (again / "etc").mkdir()
    (again / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (again / "etc" / "passwd").chmod(0o644)
    (again / "bin").mkdir()
    (again / "bin" / "sh").symlink_to("busybox")
    (again / "bin" / "busybox").write_bytes(b"\x7fELF stand-in")
    (again / "bin" / "busybox").chmod(0o755)
    os.utime(again / "etc" / "passwd", (1_700_000_000, 1_700_000_000))
    out = tmp_path / "again.tar"

    oci.layer_from_directory(again, out)

    assert out.read_bytes() == layer.read_bytes()


def test_a_changed_file_changes_the_layer(tmp_path: Path, layer: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/ash\n")
    out = tmp_path / "changed.tar"

    oci.layer_from_directory(root, out)

    assert out.read_bytes() != layer.read_bytes()


def test_a_fifo_in_the_tree_is_refused_by_name(tmp_path: Path) -> None:
    root = lay_out_tree(tmp_path / "rootfs")
    os.mkfifo(root / "etc" / "initctl")
    out = tmp_path / "layer.tar"

    with pytest.raises(ValueError, match="etc/initctl"):
        oci.layer_from_directory(root, out)
    assert not out.exists()
    assert list(tmp_path.glob(".layer.tar.*")) == []


def test_a_missing_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError, match="nowhere"):
        oci.layer_from_directory(tmp_path / "nowhere", tmp_path / "layer.tar")


def test_the_index_names_the_image_for_containerd_and_by_tag(tmp_path: Path, layer: Path) -> None:
    image = tmp_path / "image.tar"

    digest = oci.write_image(image, NAME, layer, entrypoint=[], cmd=["sh"])

    files = layout_files(image)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    assert index["schemaVersion"] == 2
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    [descriptor] = index["manifests"]
    assert descriptor["digest"] == digest
    assert descriptor["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert descriptor["annotations"] == {
        "io.containerd.image.name": NAME,
        "org.opencontainers.image.ref.name": "1.37",
    }
    assert descriptor["platform"] == {"architecture": "amd64", "os": "linux"}


def test_every_digest_is_the_hash_of_its_blob(tmp_path: Path, layer: Path) -> None:
    image = tmp_path / "image.tar"

    digest = oci.write_image(image, NAME, layer, entrypoint=["/pause"])

    files = layout_files(image)
    for name, content in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(content).hexdigest() == name.removeprefix("blobs/sha256/")
    [descriptor] = json.loads(files["index.json"])["manifests"]
    manifest = json_blob(files, descriptor)
    assert f"sha256:{hashlib.sha256(blob(files, digest)).hexdigest()}" == digest
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    [layer_descriptor] = manifest["layers"]
    assert layer_descriptor["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
    assert layer_descriptor["size"] == layer.stat().st_size
    assert blob(files, layer_descriptor["digest"]) == layer.read_bytes()
    config = json_blob(files, manifest["config"])
    # Uncompressed, the layer's digest is its diff ID.
    assert config["rootfs"] == {"type": "layers", "diff_ids": [layer_descriptor["digest"]]}


def test_the_config_carries_the_platform_and_what_the_container_runs(tmp_path: Path, layer: Path) -> None:
    image = tmp_path / "image.tar"

    oci.write_image(
        image, NAME, layer, entrypoint=["/bin/sh", "-c"], cmd=["true"], env=["PATH=/bin"], working_dir="/tmp"
    )

    config = image_config(image)
    assert config["architecture"] == "amd64"
    assert config["os"] == "linux"
    assert config["config"] == {
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": ["true"],
        "Env": ["PATH=/bin"],
        "WorkingDir": "/tmp",
    }


def test_an_empty_entrypoint_and_unset_fields_are_left_out(tmp_path: Path, layer: Path) -> None:
    """So that a pod's `command` replaces Cmd alone, as with Docker Hub's busybox."""
    image = tmp_path / "image.tar"

    oci.write_image(image, NAME, layer, entrypoint=[], cmd=["sh"])

    assert image_config(image)["config"] == {"Cmd": ["sh"]}


def image_config(image: Path) -> Any:
    files = layout_files(image)
    [descriptor] = json.loads(files["index.json"])["manifests"]
    return json_blob(files, json_blob(files, descriptor)["config"])


def test_the_same_input_gives_the_same_image_bytes(tmp_path: Path, layer: Path) -> None:
    first, second = tmp_path / "first.tar", tmp_path / "second.tar"

    digests = {
        oci.write_image(out, NAME, layer, entrypoint=[], cmd=["sh"], env=["PATH=/bin"])
        for out in (first, second)
    }

    assert len(digests) == 1
    assert first.read_bytes() == second.read_bytes()
    assert all(entry.mtime == 0 and entry.uid == entry.gid == 0 for entry in members(first))


def test_the_manifest_digest_follows_the_content_not_the_name(tmp_path: Path, layer: Path) -> None:
    """The name lives in the index only: the digest identifies what runs."""
    same = oci.write_image(tmp_path / "a.tar", NAME, layer, entrypoint=[])
    renamed = oci.write_image(
        tmp_path / "b.tar", "registry.example:5000/tools/busybox:v2", layer, entrypoint=[]
    )
    other_cmd = oci.write_image(tmp_path / "c.tar", NAME, layer, entrypoint=[], cmd=["ash"])

    assert same == renamed
    assert other_cmd != same


@pytest.mark.parametrize(
    ("name", "tag"),
    [
        ("docker.io/library/busybox:1.37", "1.37"),
        ("registry.k8s.io/pause:3.10.2", "3.10.2"),
        ("localhost:5000/tools/busybox:v2", "v2"),
        ("busybox:latest", "latest"),
    ],
)
def test_the_tag_is_what_follows_the_last_colon_after_the_last_slash(name: str, tag: str) -> None:
    assert oci.image_tag(name) == tag


@pytest.mark.parametrize(
    "name",
    ["busybox", "localhost:5000/busybox", "busybox:", ":1.37", "busybox@sha256:abcd", "busy box:1", ""],
)
def test_a_name_without_a_tag_is_refused_and_nothing_is_written(
    tmp_path: Path, layer: Path, name: str
) -> None:
    image = tmp_path / "image.tar"

    with pytest.raises(ValueError, match="not a reference with a tag"):
        oci.write_image(image, name, layer, entrypoint=[])
    assert not image.exists()


@pytest.mark.parametrize(
    ("env", "working_dir", "problem"),
    [(["PATH"], None, "not NAME=value"), (["=x"], None, "not NAME=value"), (None, "tmp", "not absolute")],
)
def test_a_malformed_runtime_config_is_refused(
    tmp_path: Path, layer: Path, env: list[str] | None, working_dir: str | None, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        oci.write_image(tmp_path / "image.tar", NAME, layer, entrypoint=[], env=env, working_dir=working_dir)


def test_a_missing_layer_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-layer.tar"

    with pytest.raises(FileNotFoundError, match=r"no-layer\.tar"):
        oci.write_image(tmp_path / "image.tar", NAME, missing, entrypoint=[])


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "image.tar"
    out.write_bytes(b"the complete earlier image")

    with pytest.raises(RuntimeError, match="midway"), oci.atomic_file(out) as file:
        file.write(b"half an ima")
        raise RuntimeError("midway")

    assert out.read_bytes() == b"the complete earlier image"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["image.tar"]


def test_a_finished_write_replaces_the_file_readable_by_all(tmp_path: Path) -> None:
    out = tmp_path / "images" / "image.tar"

    with oci.atomic_file(out) as file:
        file.write(b"new")

    assert out.read_bytes() == b"new"
    assert out.stat().st_mode & 0o777 == 0o644
    assert sorted(path.name for path in out.parent.iterdir()) == ["image.tar"]


def test_a_layer_larger_than_a_read_chunk_is_copied_whole(tmp_path: Path) -> None:
    """The layer is streamed into the layout, never read in one piece."""
    root = tmp_path / "rootfs"
    root.mkdir()
    payload = os.urandom(3 * (1 << 20) + 17)
    (root / "blob").write_bytes(payload)
    layer = tmp_path / "layer.tar"
    oci.layer_from_directory(root, layer)
    image = tmp_path / "image.tar"

    oci.write_image(image, NAME, layer, entrypoint=[])

    files = layout_files(image)
    [descriptor] = json.loads(files["index.json"])["manifests"]
    [layer_descriptor] = json_blob(files, descriptor)["layers"]
    with tarfile.open(fileobj=io.BytesIO(blob(files, layer_descriptor["digest"]))) as tar:
        extracted = tar.extractfile("blob")
        assert extracted is not None
        assert extracted.read() == payload
