"""The test cluster's node images (tests/cluster/images.py), built for real into a fresh cache:
the busybox image must run the examples' commands and the pause image must be a static binary
that stops cleanly on SIGTERM, since the node has no registry to fetch better ones from."""

import json
import os
import signal
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import images

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLES = REPOSITORY / "deploy" / "examples"

PT_DYNAMIC = 2
PT_INTERP = 3
# Bits of /proc/PID/status's SigCgt: the signals the process has handlers for.
PAUSE_HANDLES = (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)


@dataclass(frozen=True)
class Built:
    cache: Path
    tars: dict[str, Path]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """One build into a cache of the module's own, kept set for the cache-hit test."""
    cache = tmp_path_factory.mktemp("cluster-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRA_DRIVER_CLUSTER_CACHE", str(cache))
        tars = images.build_images()
        yield Built(cache, {image_name(tar): tar for tar in tars})


def image_name(image: Path) -> str:
    [descriptor] = json.loads(layout_file(image, "index.json"))["manifests"]
    return str(descriptor["annotations"]["io.containerd.image.name"])


def layout_file(image: Path, name: str) -> bytes:
    with tarfile.open(image) as tar:
        member = tar.extractfile(name)
        assert member is not None, f"{image} has no {name}"
        return member.read()


def manifest(image: Path) -> Any:
    [descriptor] = json.loads(layout_file(image, "index.json"))["manifests"]
    return json.loads(layout_file(image, blob_path(descriptor["digest"])))


def blob_path(digest: str) -> str:
    return "blobs/sha256/" + digest.removeprefix("sha256:")


def image_config(image: Path) -> Any:
    return json.loads(layout_file(image, blob_path(manifest(image)["config"]["digest"])))


def unpack_layer(image: Path, into: Path) -> Path:
    [layer] = manifest(image)["layers"]
    with tarfile.open(image) as outer:
        content = outer.extractfile(blob_path(layer["digest"]))
        assert content is not None
        with tarfile.open(fileobj=content) as tar:
            # Our own output, sticky /tmp included (the "tar" filter would clear the bit).
            tar.extractall(into, filter="fully_trusted")
    return into


def test_the_build_gives_both_images_in_the_cache(built: Built) -> None:
    assert set(built.tars) == {images.BUSYBOX_IMAGE, images.PAUSE_IMAGE}
    assert all(tar.parent == built.cache / "images" for tar in built.tars.values())


def test_a_second_build_builds_nothing(built: Built) -> None:
    before = {path.name: path.stat().st_mtime_ns for path in (built.cache / "images").iterdir()}

    again = images.build_images()

    assert sorted(again) == sorted(built.tars.values())
    assert {path.name: path.stat().st_mtime_ns for path in (built.cache / "images").iterdir()} == before


def test_busybox_has_every_applet_in_bin_and_a_root_user(built: Built, tmp_path: Path) -> None:
    rootfs = unpack_layer(built.tars[images.BUSYBOX_IMAGE], tmp_path / "rootfs")

    assert (rootfs / "bin" / "busybox").is_file()
    assert os.access(rootfs / "bin" / "busybox", os.X_OK)
    for applet in ("sh", "env", "sort", "ls", "cat"):
        assert (rootfs / "bin" / applet).readlink() == Path("busybox"), applet
    assert (rootfs / "etc" / "passwd").read_text().startswith("root:x:0:0:")
    assert (rootfs / "tmp").stat().st_mode & 0o7777 == 0o1777
    assert all((rootfs / mount_point).is_dir() for mount_point in ("dev", "proc", "sys"))


def test_busybox_runs_a_pods_command_as_docker_hubs_does(built: Built) -> None:
    config = image_config(built.tars[images.BUSYBOX_IMAGE])["config"]

    assert "Entrypoint" not in config
    assert config["Cmd"] == ["sh"]
    assert any(entry.startswith("PATH=") and "/bin" in entry.split(":") for entry in config["Env"])


def example_commands() -> list[list[str]]:
    commands = []
    for example in sorted(EXAMPLES.glob("*.yaml")):
        for document in yaml.safe_load_all(example.read_text()):
            if document and document.get("kind") == "Pod":
                for container in document["spec"]["containers"]:
                    assert container["image"] == "busybox:1.37", example.name
                    commands.append(container["command"])
    return commands


def test_every_example_command_runs_on_the_images_applets_alone(built: Built, tmp_path: Path) -> None:
    """With the image's /bin as the whole PATH, a program the examples call that busybox lacks
    fails here rather than in a pod."""
    rootfs = unpack_layer(built.tars[images.BUSYBOX_IMAGE], tmp_path / "rootfs")
    commands = example_commands()
    assert commands, f"no pod commands in {EXAMPLES}"

    for program, *arguments in commands:
        result = subprocess.run(
            [str(rootfs / "bin" / program), *arguments],
            env={"PATH": str(rootfs / "bin"), "DRA_DEVICE_GPU_0": "GPU-example"},
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "DRA_DEVICE_GPU_0=GPU-example" in result.stdout


@pytest.fixture
def pause_binary(built: Built, tmp_path: Path) -> Path:
    image = built.tars[images.PAUSE_IMAGE]
    assert image_config(image)["config"]["Entrypoint"] == ["/pause"]
    return unpack_layer(image, tmp_path / "rootfs") / "pause"


def program_header_types(binary: bytes) -> list[int]:
    """The p_type of every program header of a 64-bit little-endian ELF executable."""
    assert binary[:4] == b"\x7fELF", "not an ELF file"
    assert binary[4:6] == b"\x02\x01", "not a 64-bit little-endian ELF file"
    (phoff,) = struct.unpack_from("<Q", binary, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", binary, 0x36)
    return [struct.unpack_from("<I", binary, phoff + index * phentsize)[0] for index in range(phnum)]


def test_pause_is_static(pause_binary: Path) -> None:
    """The image holds /pause alone: no loader, no libc to find one with."""
    types = program_header_types(pause_binary.read_bytes())

    assert types, "no program headers"
    assert PT_INTERP not in types
    assert PT_DYNAMIC not in types


def wait_until_handling(process: subprocess.Popen[bytes]) -> None:
    """Until pause has installed its handlers: a signal sent earlier would meet the default action
    and prove nothing."""
    wanted = sum(1 << (number - 1) for number in PAUSE_HANDLES)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert process.poll() is None, f"pause exited early with {process.returncode}"
        status = Path(f"/proc/{process.pid}/status").read_text()
        caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
        if caught & wanted == wanted:
            return
        time.sleep(0.01)
    raise AssertionError("pause did not install its SIGINT, SIGTERM and SIGCHLD handlers within 5 s")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_pause_blocks_until_told_to_stop_and_then_exits_zero(
    pause_binary: Path, stop: signal.Signals
) -> None:
    with subprocess.Popen([str(pause_binary)]) as process:
        try:
            wait_until_handling(process)
            time.sleep(0.2)
            assert process.poll() is None, "pause did not block"

            process.send_signal(stop)

            assert process.wait(timeout=1) == 0
        finally:
            process.kill()


def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (Z: a zombie no one has reaped), None once gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rpartition(")")[2].split()[0]


def test_pause_reaps_the_children_it_inherits(pause_binary: Path) -> None:
    """As the pod's PID 1 it inherits orphans; here a shell starts a child and becomes pause."""
    with subprocess.Popen(
        ["/bin/sh", "-c", f"sleep 0.3 & echo $!; exec {pause_binary}"], stdout=subprocess.PIPE
    ) as process:
        try:
            assert process.stdout is not None
            child = int(process.stdout.readline())
            wait_until_handling(process)
            deadline = time.monotonic() + 5
            while process_state(child) is not None and time.monotonic() < deadline:
                time.sleep(0.05)

            assert process_state(child) is None, f"child {child} left in state {process_state(child)}"
            assert process.poll() is None
        finally:
            process.kill()


def test_a_missing_tool_is_one_line_naming_what_to_install(tmp_path: Path) -> None:
    """Checked before anything is built: a machine without gcc learns it at once."""
    shims = tmp_path / "bin"
    shims.mkdir()
    for tool in ("apt-get", "apt-cache", "dpkg-deb"):
        (shims / tool).symlink_to(f"/usr/bin/{tool}")

    result = subprocess.run(
        [sys.executable, "-m", "tests.cluster.images"],
        cwd=REPOSITORY,
        env={"PATH": str(shims), "DRA_DRIVER_CLUSTER_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert "gcc" in line
    assert "apt-get install -y --no-install-recommends gcc libc6-dev" in line
    assert not (tmp_path / "cache").exists()
