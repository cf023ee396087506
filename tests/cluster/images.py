"""The two images the test cluster's node runs, made on this machine because it has no registry
to pull from: the examples' workload image (busybox from Debian's busybox-static) and the pod
sandbox's pause image (tests/cluster/pause.c). Each tar is named by a hash of what went into it,
so a second run, or a fresh clone sharing the cache, finds it and builds nothing.

    python -m tests.cluster.images    # prints the tars, for `ctr -n k8s.io images import`
"""

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import oci
from tests.cluster.cache import cache_root

# The examples' `image: busybox:1.37`, as containerd normalizes it; the binary is Debian's
# (bookworm ships 1.35), which runs the examples' `sh -c` lines just the same.
BUSYBOX_IMAGE = "docker.io/library/busybox:1.37"
# The sandbox image the kubelet and containerd are configured with; never pulled.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"

BUSYBOX_PACKAGE = "busybox-static"
# Docker Hub's busybox sets this PATH; without Env in the config a pod's environment has none.
BUSYBOX_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
BUSYBOX_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
BUSYBOX_GROUP = "root:x:0:\nnobody:x:65534:\n"
# The runtime mounts over /dev, /proc and /sys but wants them there; /tmp is everyone's.
ROOTFS_DIRECTORIES = {
    "bin": 0o755,
    "dev": 0o755,
    "etc": 0o755,
    "proc": 0o555,
    "root": 0o700,
    "sys": 0o555,
    "tmp": 0o1777,
}

PAUSE_SOURCE = Path(__file__).with_name("pause.c")
PAUSE_FLAGS = ("-static", "-O2", "-Wall", "-Werror")

# Each tool the builds run, and the Debian packages that bring it (a static link needs libc.a).
TOOL_PACKAGES = {
    "apt-get": ("apt",),
    "apt-cache": ("apt",),
    "dpkg-deb": ("dpkg",),
    "gcc": ("gcc", "libc6-dev"),
}

# The builders' own code is an input too: a change to how a rootfs is laid out must rebuild.
BUILDER_SOURCES = (Path(__file__), Path(oci.__file__))


class ImageBuildError(RuntimeError):
    """A tool the builds need is missing or failed; the message names it."""


@dataclass(frozen=True)
class AptPackage:
    name: str
    version: str
    sha256: str


def build_images() -> list[Path]:
    """The busybox and pause image tars, built where the cache lacks them."""
    require_tools()
    directory = cache_root() / "images"
    return [busybox_image(directory), pause_image(directory)]


def require_tools() -> None:
    """Checks every tool before building anything, so that one line names all there is to
    install rather than one per run."""
    missing = [tool for tool in TOOL_PACKAGES if shutil.which(tool) is None]
    if missing:
        packages = sorted({package for tool in missing for package in TOOL_PACKAGES[tool]})
        raise ImageBuildError(
            f"building the node's images needs {', '.join(missing)} (not on PATH): "
            f"apt-get install -y --no-install-recommends {' '.join(packages)}"
        )


def busybox_image(directory: Path) -> Path:
    """Keyed by the package's hash in apt's lists, so a cached image is found without a download
    and a new Debian release of the package rebuilds it."""
    package = apt_candidate(BUSYBOX_PACKAGE)
    key = cache_key(BUSYBOX_IMAGE, package.name, package.version, package.sha256)
    return cached(directory, BUSYBOX_IMAGE, key, lambda out, scratch: build_busybox(out, scratch, package))


def pause_image(directory: Path) -> Path:
    """Keyed by the source, the flags, the compiler and the libc linked in statically."""
    compiler = run(["gcc", "--version"]).splitlines()[0]
    libc = Path(run(["gcc", "-print-file-name=libc.a"]).strip())
    if not libc.is_file():
        raise ImageBuildError(
            "gcc finds no static libc (libc.a) for -static: "
            "apt-get install -y --no-install-recommends libc6-dev"
        )
    key = cache_key(
        PAUSE_IMAGE,
        PAUSE_SOURCE.read_bytes(),
        " ".join(PAUSE_FLAGS),
        compiler,
        hashlib.sha256(libc.read_bytes()).hexdigest(),
    )
    return cached(directory, PAUSE_IMAGE, key, build_pause)


def cached(directory: Path, name: str, key: str, build: Callable[[Path, Path], None]) -> Path:
    """The tar for `key`, built by `build(out, scratch)` if absent; tars of the image's earlier
    keys are removed, so the cache holds one per image. A tar that exists is complete: oci writes
    it atomically."""
    stem = name.rpartition("/")[2].replace(":", "-")
    target = directory / f"{stem}-{key[:16]}.tar"
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{stem}-image-") as scratch:
        build(target, Path(scratch))
    for earlier in directory.glob(f"{stem}-*.tar"):
        if earlier != target:
            earlier.unlink(missing_ok=True)
    return target


def cache_key(*parts: str | bytes) -> str:
    """A hash of the parts, each length-prefixed so that no two lists of parts collide, and of
    the builders' code."""
    hasher = hashlib.sha256()
    for part in (*parts, *(source.read_bytes() for source in BUILDER_SOURCES)):
        data = part.encode() if isinstance(part, str) else part
        hasher.update(len(data).to_bytes(8, "big"))
        hasher.update(data)
    return hasher.hexdigest()


def apt_candidate(name: str) -> AptPackage:
    """The version apt would download, from its lists; the lists are fetched only when they do
    not know the package (a fresh machine, or one whose lists were cleaned)."""
    stanza = apt_show(name)
    if stanza is None:
        run(["apt-get", "update"])
        stanza = apt_show(name)
        if stanza is None:
            raise ImageBuildError(f"apt knows no package {name}, even after apt-get update")
    fields = dict(
        line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" ")
    )
    if "Version" not in fields or "SHA256" not in fields:
        raise ImageBuildError(f"apt-cache show {name} gave no Version and SHA256 fields")
    return AptPackage(name, fields["Version"], fields["SHA256"])


def apt_show(name: str) -> str | None:
    result = subprocess.run(
        ["apt-cache", "show", "--no-all-versions", name], capture_output=True, text=True, check=False
    )
    stanza = result.stdout.split("\n\n", 1)[0]
    return stanza if result.returncode == 0 and stanza.strip() else None


def build_busybox(out: Path, scratch: Path, package: AptPackage) -> None:
    """Docker Hub's busybox, near enough for the examples: every applet a link in /bin, root in
    /etc/passwd, a sticky /tmp and the mount points the runtime expects."""
    downloads = scratch / "download"
    downloads.mkdir()
    run(["apt-get", "download", f"{package.name}={package.version}"], cwd=downloads)
    debs = list(downloads.glob("*.deb"))
    if len(debs) != 1:
        raise ImageBuildError(f"apt-get download {package.name} left {len(debs)} .deb files, not one")
    extracted = scratch / "extracted"
    run(["dpkg-deb", "-x", str(debs[0]), str(extracted)])
    binary = next(
        (path for path in (extracted / "bin/busybox", extracted / "usr/bin/busybox") if path.is_file()), None
    )
    if binary is None:
        raise ImageBuildError(f"{debs[0].name} holds no bin/busybox or usr/bin/busybox")
    applets = applet_names(run([str(binary), "--list"]))

    rootfs = scratch / "rootfs"
    make_directory(rootfs, 0o755)
    for directory, mode in ROOTFS_DIRECTORIES.items():
        make_directory(rootfs / directory, mode)
    shutil.copyfile(binary, rootfs / "bin/busybox")
    (rootfs / "bin/busybox").chmod(0o755)
    for applet in applets:
        (rootfs / "bin" / applet).symlink_to("busybox")
    for file, content in (("etc/passwd", BUSYBOX_PASSWD), ("etc/group", BUSYBOX_GROUP)):
        (rootfs / file).write_text(content)
        (rootfs / file).chmod(0o644)

    layer = scratch / "layer.tar"
    oci.layer_from_directory(rootfs, layer)
    oci.write_image(out, BUSYBOX_IMAGE, layer, entrypoint=[], cmd=["sh"], env=BUSYBOX_ENV)


def applet_names(listing: str) -> list[str]:
    """`busybox --list`'s names, refused if one could escape /bin or replace the binary."""
    names = sorted({line.strip() for line in listing.splitlines() if line.strip()} - {"busybox"})
    bad = [name for name in names if "/" in name or name in (".", "..")]
    if bad or "sh" not in names:
        raise ImageBuildError(f"busybox --list gave unusable applet names {bad} or no sh")
    return names


def build_pause(out: Path, scratch: Path) -> None:
    rootfs = scratch / "rootfs"
    make_directory(rootfs, 0o755)
    binary = rootfs / "pause"
    run(["gcc", *PAUSE_FLAGS, "-o", str(binary), str(PAUSE_SOURCE)])
    binary.chmod(0o755)
    layer = scratch / "layer.tar"
    oci.layer_from_directory(rootfs, layer)
    oci.write_image(out, PAUSE_IMAGE, layer, entrypoint=["/pause"])


def make_directory(path: Path, mode: int) -> None:
    """mkdir's mode passes through the umask; the layer keeps what is on disk, so it is set
    after."""
    path.mkdir(exist_ok=True)
    path.chmod(mode)


def run(command: list[str], cwd: Path | None = None) -> str:
    """The command's output; a failure raises with the command and its last words."""
    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as error:
        raise ImageBuildError(f"{command[0]} could not be run: {error}") from error
    if result.returncode != 0:
        last_words = " | ".join(result.stderr.strip().splitlines()[-5:])
        raise ImageBuildError(f"{' '.join(command)} failed (exit {result.returncode}): {last_words}")
    return result.stdout


def main() -> int:
    try:
        paths = build_images()
    except ImageBuildError as error:
        print(f"tests.cluster.images: {error}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
