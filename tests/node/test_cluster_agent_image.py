"""The local cluster's agent image (tests/cluster/agent_image.py), unpacked and entered: without
containerd or a cluster, its one layer is chrooted into and the agent's CLI run with the image's
own Python and exactly the image's environment, as the DaemonSet's container starts it.

The image comes from the cache (built there on first use: minutes), so this proves what the
cluster imports, not a fresh build of it."""

import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.agent_image import IMAGE_REPOSITORY, PYTHON_VERSION, build_agent_image
from tests.cluster.oci import CONTAINERD_NAME_ANNOTATION
from tests.support.image import IMAGE_ENVIRONMENT

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"
SITE_PACKAGES = f"/usr/local/lib/python{PYTHON_VERSION}/dist-packages"


@dataclass(frozen=True)
class UnpackedImage:
    tar: Path
    name: str
    config: dict[str, Any]
    root: Path

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """`argv` in the rootfs with the image's Env and nothing of the host's, as the runtime
        starts the entrypoint (found on the image's PATH)."""
        return subprocess.run(
            ["chroot", str(self.root), "/usr/bin/env", "-i", *self.config["config"]["Env"], *argv],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


@pytest.fixture(scope="module")
def image() -> Iterator[UnpackedImage]:
    if os.geteuid() != 0:
        pytest.skip("debootstrap and chroot need root")
    tar, name = build_agent_image()
    root = Path(tempfile.mkdtemp(prefix="agent-rootfs-"))
    try:
        with tarfile.open(tar) as layout:
            [descriptor] = _json(layout, "index.json")["manifests"]
            assert descriptor["annotations"][CONTAINERD_NAME_ANNOTATION] == name
            manifest = _json(layout, _blob(descriptor["digest"]))
            [layer] = manifest["layers"]
            config = _json(layout, _blob(manifest["config"]["digest"]))
            _unpack(layout, _blob(layer["digest"]), root)
        yield UnpackedImage(tar, name, config, root)
    finally:
        shutil.rmtree(root)


def _blob(digest: str) -> str:
    return "blobs/" + digest.replace(":", "/", 1)


def _json(layout: tarfile.TarFile, member: str) -> Any:
    file = layout.extractfile(member)
    assert file is not None, member
    return json.load(file)


def _unpack(layout: tarfile.TarFile, member: str, root: Path) -> None:
    """By GNU tar, as root: owners, modes and links as the runtime's snapshotter lays them out."""
    layer = layout.extractfile(member)
    assert layer is not None, member
    with subprocess.Popen(["tar", "-x", "-p", "-f", "-", "-C", str(root)], stdin=subprocess.PIPE) as process:
        assert process.stdin is not None
        shutil.copyfileobj(layer, process.stdin)
        process.stdin.close()
    assert process.returncode == 0


def _dockerfile_instruction(word: str) -> Any:
    line = next(line for line in DOCKERFILE.read_text().splitlines() if line.startswith(f"{word} "))
    return json.loads(line.split(maxsplit=1)[1])


def test_the_image_starts_the_agent_as_the_dockerfile_does(image: UnpackedImage) -> None:
    config = image.config["config"]
    assert config["Entrypoint"] == _dockerfile_instruction("ENTRYPOINT")
    assert config["Cmd"] == _dockerfile_instruction("CMD")
    assert {f"{name}={value}" for name, value in IMAGE_ENVIRONMENT.items()} <= set(config["Env"])
    assert re.fullmatch(f"{re.escape(IMAGE_REPOSITORY)}:e2e-[0-9a-f]{{12}}", image.name)


def test_the_agents_cli_runs_in_the_rootfs(image: UnpackedImage) -> None:
    config = image.config["config"]
    top = image.run(*config["Entrypoint"], "--help")
    assert top.returncode == 0, top.stderr
    assert "run the node agent" in top.stdout
    node = image.run(*config["Entrypoint"], *config["Cmd"], "--help")
    assert node.returncode == 0, node.stderr
    assert node.stdout.startswith("usage: dra-driver node")


def test_the_rootfs_python_imports_the_agent_and_nothing_of_the_test_extra(image: UnpackedImage) -> None:
    script = (
        "import importlib.util, json, sys; import pynvml, grpc, uvloop, msgspec, dra_driver; "
        "print(json.dumps({'version': sys.version_info[:2], 'optimize': sys.flags.optimize, "
        "'agent': dra_driver.__file__, 'python': sys.executable, "
        "'test extra': [name for name in ('pytest', 'hypothesis', 'matplotlib', 'mypy') "
        "if importlib.util.find_spec(name)]}))"
    )
    result = image.run("python3", "-c", script)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["version"] == [int(part) for part in PYTHON_VERSION.split(".")]
    assert seen["optimize"] == int(IMAGE_ENVIRONMENT["PYTHONOPTIMIZE"])
    assert seen["agent"] == f"{SITE_PACKAGES}/dra_driver/__init__.py"
    assert seen["python"] == "/usr/bin/python3"
    assert seen["test extra"] == []


def test_the_bytecode_is_compiled_at_the_images_level(image: UnpackedImage) -> None:
    cache = image.root / SITE_PACKAGES.lstrip("/") / "dra_driver" / "__pycache__"
    level = IMAGE_ENVIRONMENT["PYTHONOPTIMIZE"]
    assert (cache / f"cli.cpython-{PYTHON_VERSION.replace('.', '')}.opt-{level}.pyc").is_file()


def test_the_programs_the_agent_runs_are_there(image: UnpackedImage) -> None:
    """sh, mount and unshare: the MPS daemon's private /dev/shm (claims/sharing/mps.py)."""
    result = image.run("sh", "-c", "command -v unshare mount sh && unshare --version")
    assert result.returncode == 0, result.stderr
    assert "util-linux" in result.stdout


def test_the_layer_leaves_the_runtime_its_mount_points_and_no_build_leftovers(image: UnpackedImage) -> None:
    for mount_point in ("dev", "proc", "sys"):
        assert (image.root / mount_point).is_dir()
        assert list((image.root / mount_point).iterdir()) == []
    for stripped in ("var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale", "tmp"):
        assert list((image.root / stripped).iterdir()) == [], stripped
    assert not (image.root / "var/cache/apt/archives").exists()


def test_an_unchanged_tree_builds_nothing(image: UnpackedImage) -> None:
    written = image.tar.stat().st_mtime_ns
    assert build_agent_image() == (image.tar, image.name)
    assert image.tar.stat().st_mtime_ns == written
