"""The node agent's image for the local cluster, made without Docker: the Dockerfile's image (the
wheel and its dependencies on Python 3.11, util-linux for `unshare`, PYTHONOPTIMIZE=2 with its
bytecode compiled, `dra-driver node` as entrypoint and command) on a Debian bookworm made by
debootstrap instead of on python:3.11-slim, as an OCI layout tar for `ctr images import`.

What changed is all that is redone. The bare rootfs (minutes: debootstrap fetches and unpacks
every package) is a tar of its own, keyed by the suite and the package list; the dependencies'
wheels are kept per requirement list; the image is keyed by the wheel's contents, that rootfs and
this recipe. Unchanged code builds nothing, and a code change redoes only the pip install and the
layer (seconds).

    python -m tests.cluster.agent_image    # prints the OCI layout tar and the image name
"""

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.cluster import oci
from tests.cluster.build import BuildError
from tests.cluster.cache import cache_root
from tests.support.image import IMAGE_ENVIRONMENT, OPTIMIZATION_LEVEL

REPOSITORY = Path(__file__).resolve().parents[2]
# What the Dockerfile's wheel stage copies: the wheel never picks up whatever else lies in the
# work tree (a build/ directory's stale modules).
WHEEL_SOURCES = ("pyproject.toml", "README.md", "dra_driver")

SUITE = "bookworm"
VARIANT = "minbase"
MIRROR = "http://deb.debian.org/debian"
# python3: bookworm's is 3.11, the project's version. util-linux: `unshare`, for MPS daemons with
# a private /dev/shm. The other programs the agent runs, sh and mount, are in every minbase.
PACKAGES = ("python3", "util-linux")
# The wheels bookworm's Python can load: CPython 3.11 on glibc 2.36. pip matches platform tags
# literally, so every manylinux tag up to that glibc is named, the legacy aliases too.
PYTHON_VERSION = "3.11"
_GLIBC_MINOR = 36
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(_GLIBC_MINOR, 4, -1)]
PLATFORMS += [f"manylinux{alias}_x86_64" for alias in ("2014", "2010", "1")]
_PYTHON_TAG = "cp" + PYTHON_VERSION.replace(".", "")
_CACHE_TAG = "cpython-" + PYTHON_VERSION.replace(".", "")

# The familiar `dra-driver:e2e-...` as containerd's CRI stores and resolves it: the importer keeps
# the annotated name verbatim, and the kubelet asks for the normalized reference.
IMAGE_REPOSITORY = "docker.io/library/dra-driver"
ENTRYPOINT = ["dra-driver"]
CMD = ["node"]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# An image without PATH leaves the container none; LANG as python:3.11-slim sets it.
ENV = [
    f"PATH={SYSTEM_PATH}",
    "LANG=C.UTF-8",
    *(f"{name}={value}" for name, value in IMAGE_ENVIRONMENT.items()),
]
# What runs in the chroot gets only this: the host's PIP_* settings name host paths.
_CHROOT_ENV = {"PATH": SYSTEM_PATH, "HOME": "/root", "LANG": "C.UTF-8"}

# Removed from the bare rootfs, relative to it; nothing in the image reads them. apt's lists and
# the .debs debootstrap leaves behind; documentation and translations; the build's logs; the build
# host's hostname and resolver (the runtime mounts the pod's); /dev's nodes, which a layer cannot
# hold and the runtime makes anew.
STRIPPED = [
    "var/lib/apt/lists/*", "var/cache/apt/*",
    "usr/share/doc/*", "usr/share/man/*", "usr/share/info/*", "usr/share/locale/*", "usr/share/lintian/*",
    "var/log/*.log", "var/log/apt/*", "var/cache/debconf/*-old", "var/lib/dpkg/*-old",
    "etc/hostname", "etc/resolv.conf", "dev/*",
]  # fmt: skip
# Where the rootfs's Python imports from. Bytecode is compiled at the image's optimisation level;
# Debian's own (level 0) is never read under PYTHONOPTIMIZE=2 and goes.
PYTHON_DIRECTORIES = (
    f"/usr/lib/python{PYTHON_VERSION}",
    "/usr/lib/python3/dist-packages",
    f"/usr/local/lib/python{PYTHON_VERSION}/dist-packages",
)

_TICK_SECONDS = 30.0


def build_agent_image(
    overlay: Callable[[Path], None] | None = None, flavour: str = "e2e"
) -> tuple[Path, str]:
    """The OCI layout tar and the image's name, built where the cache lacks them. The wheel is
    built every time: its contents are the key. `overlay` edits the copy of the sources the wheel
    is built from (a benchmark's variant of the agent: tests/bench/pod_start); `flavour` names
    the image and keeps one tar of its own kind, so a variant does not evict the e2e image."""
    images = cache_root() / "images"
    images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dra-driver-wheel-") as scratch:
        with _step("wheel"):
            wheel = _build_wheel(Path(scratch), overlay)
        key = _key(
            _wheel_digest(wheel), _rootfs_key(), Path(__file__).read_bytes(), Path(oci.__file__).read_bytes()
        )
        name = f"{IMAGE_REPOSITORY}:{flavour}-{key[:12]}"
        target = images / f"dra-driver-{flavour}-{key[:12]}.tar"
        if target.is_file():
            _say(f"{name} is cached: {target}")
            return target, name
        with _locked(images):
            if not target.is_file():
                _build_image(images, wheel, name, target, flavour)
    return target, name


def _rootfs_key() -> str:
    """The bare rootfs's inputs. The mirror is not one: any mirror serves the suite's packages."""
    return _key(SUITE, VARIANT, repr(PACKAGES), *STRIPPED)


def _build_image(images: Path, wheel: Path, name: str, target: Path, flavour: str) -> None:
    if os.geteuid() != 0:
        raise BuildError("debootstrap and chroot need root: run as root")
    for killed in images.glob(".build-*"):  # scratch of killed builds: the lock says none runs
        _remove(killed)
    rootfs = _rootfs(images)
    dependencies = _dependencies(images, wheel)
    with _staging(images) as staging:
        root = staging / "rootfs"
        root.mkdir()
        with _step("pip"):
            _run("pip", ["tar", "--numeric-owner", "-xpf", str(rootfs), "-C", str(root)], staging)
            _install(root, wheel, dependencies, staging)
        with _step("layer"):
            layer = staging / "layer.tar"
            try:
                oci.layer_from_directory(root, layer)
                oci.write_image(target, name, layer, entrypoint=ENTRYPOINT, cmd=CMD, env=ENV)
            except (OSError, ValueError) as error:
                raise BuildError(f"layer: {error}") from error
    _keep_only(images, f"dra-driver-{flavour}-*.tar", target)
    _say(f"{name}: {target.stat().st_size / 2**20:.0f} MiB in {target}")


def _build_wheel(scratch: Path, overlay: Callable[[Path], None] | None) -> Path:
    source = scratch / "source"
    source.mkdir()
    for name in WHEEL_SOURCES:
        origin = REPOSITORY / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, source / name)
    if overlay is not None:
        overlay(source)
    out = scratch / "wheel"
    _run(
        "wheel",
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        scratch,
    )
    wheels = list(out.glob("dra_driver-*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"wheel: pip wheel left {len(wheels)} dra_driver wheels in {out}, not one")
    return wheels[0]


def _wheel_digest(wheel: Path) -> str:
    """Of the members' names and bytes, not of the zip file: its timestamps are the sources'
    mtimes, which a checkout changes and the code does not."""
    with zipfile.ZipFile(wheel) as archive:
        members = sorted(archive.infolist(), key=lambda member: member.filename)
        return _key(*(part for member in members for part in (member.filename, archive.read(member))))


def _requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    return sorted(line for line in lines if line.startswith("Requires-Dist:"))


def _rootfs(images: Path) -> Path:
    """debootstrap's tree, stripped, as a tar: extracting it is seconds, making it minutes."""
    tar = images / f"rootfs-{SUITE}-{_rootfs_key()[:16]}.tar"
    if tar.is_file():
        return tar
    with _staging(images) as staging, _step("debootstrap"):
        _require_debootstrap(staging)
        target = staging / "rootfs"
        argv = [
            "debootstrap",
            f"--variant={VARIANT}",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(target),
            MIRROR,
        ]
        _run("debootstrap", argv, staging, details=target / "debootstrap" / "debootstrap.log")
        _strip(target)
        partial = staging / "rootfs.tar"
        _run("debootstrap", ["tar", "--numeric-owner", "-cf", str(partial), "-C", str(target), "."], staging)
        partial.replace(tar)
    _keep_only(images, f"rootfs-{SUITE}-*.tar", tar)
    return tar


def _require_debootstrap(scratch: Path) -> None:
    if shutil.which("debootstrap") is not None:
        return
    _say("debootstrap is not installed: apt-get install -y debootstrap")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run("debootstrap", ["apt-get", "update"], scratch, env=env)
    _run("debootstrap", ["apt-get", "install", "-y", "debootstrap"], scratch, env=env)


def _strip(root: Path) -> None:
    for pattern in STRIPPED:
        for path in root.glob(pattern):
            # /dev's links point at the host's /proc: a link is removed, never followed.
            if path.is_symlink() or not path.is_dir():
                path.unlink()
            else:
                shutil.rmtree(path)


def _dependencies(images: Path, wheel: Path) -> Path:
    """The runtime dependencies' wheels (no extras: the test extra stays out) and pip's own,
    which runs from its wheel inside the rootfs: bookworm's Python has no pip."""
    directory = images / f"wheels-{_key(*_requirements(wheel), PYTHON_VERSION, *PLATFORMS)[:16]}"
    if directory.is_dir():
        return directory
    with _staging(images) as staging, _step("download"):
        wheels = staging / "wheels"
        argv = [
            sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
            "--implementation", "cp", "--python-version", PYTHON_VERSION, "--abi", _PYTHON_TAG,
            *(f"--platform={platform}" for platform in PLATFORMS),
            "--dest", str(wheels), str(wheel), "pip",
        ]  # fmt: skip
        _run("download", argv, staging)
        (wheels / wheel.name).unlink(missing_ok=True)
        wheels.rename(directory)
    _keep_only(images, "wheels-*", directory)
    return directory


def _install(root: Path, wheel: Path, dependencies: Path, scratch: Path) -> None:
    """pip install with the rootfs's own Python, as the Dockerfile's `pip install --no-index`
    does; then the bytecode the Dockerfile's compileall writes."""
    pip = next(dependencies.glob("pip-*.whl"), None)
    if pip is None:
        raise BuildError(f"pip: no pip wheel among the dependencies in {dependencies}")
    wheels = root / "tmp" / "wheels"
    wheels.mkdir()
    for file in (*dependencies.glob("*.whl"), wheel):
        shutil.copyfile(file, wheels / file.name)
    python = ["chroot", str(root), "/usr/bin/python3"]
    _run(
        "pip",
        [
            *python, f"/tmp/wheels/{pip.name}/pip", "install", "-q", "--no-index",
            "--find-links", "/tmp/wheels", "--no-compile", "--no-cache-dir",
            "--break-system-packages", "--root-user-action=ignore",
            "--disable-pip-version-check", f"/tmp/wheels/{wheel.name}",
        ],
        scratch,
        env=_CHROOT_ENV,
    )  # fmt: skip
    shutil.rmtree(wheels)
    # One process: compileall's workers would need a /dev/shm that the chroot does not have.
    compile_all = [*python, "-m", "compileall", "-q", "-o", str(OPTIMIZATION_LEVEL), *PYTHON_DIRECTORIES]
    _run("pip", compile_all, scratch, env=_CHROOT_ENV)
    for directory in PYTHON_DIRECTORIES:
        for unoptimized in (root / directory.lstrip("/")).rglob(f"*.{_CACHE_TAG}.pyc"):
            unoptimized.unlink()


def _run(
    step: str,
    argv: list[str],
    scratch: Path,
    *,
    env: dict[str, str] | None = None,
    details: Path | None = None,
) -> None:
    """Runs a step's tool with its output in a log, saying every 30 s how long it has run and what
    it last said. A failure raises one line: the step, the exit code and the tool's last words,
    with those of the log `details` when they point to it (debootstrap's own)."""
    program = shutil.which(argv[0])
    if program is None:
        raise BuildError(f"{step}: {argv[0]} is not installed (not on PATH)")
    log = scratch / f"{step}.log"
    started = time.monotonic()
    done = threading.Event()
    ticker = threading.Thread(target=_tick, args=(step, started, log, done), daemon=True)
    with log.open("wb") as output:
        ticker.start()
        try:
            completed = subprocess.run(
                [program, *argv[1:]], stdout=output, stderr=subprocess.STDOUT, env=env, check=False
            )
        finally:
            done.set()
    if completed.returncode != 0:
        words = _tail(log, 3)
        if details is not None and details.is_file() and details.name in words:
            words = f"{words} | {_tail(details, 3)}"
        raise BuildError(f"{step}: {argv[0]} exited {completed.returncode}: {words}")


def _tick(step: str, started: float, log: Path, done: threading.Event) -> None:
    while not done.wait(_TICK_SECONDS):
        _say(f"{step}: {time.monotonic() - started:.0f}s elapsed, last: {_tail(log, 1)}")


def _tail(log: Path, lines: int) -> str:
    """The log's last non-empty lines, on one line."""
    with log.open("rb") as file:
        file.seek(max(0, file.seek(0, os.SEEK_END) - 8192))
        said = [line.strip() for line in file.read().decode(errors="replace").splitlines() if line.strip()]
    return " | ".join(said[-lines:]) or "(no output)"


def _key(*parts: str | bytes) -> str:
    """Each part length-prefixed, so that no two lists of parts hash alike."""
    hasher = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        hasher.update(len(data).to_bytes(8, "big"))
        hasher.update(data)
    return hasher.hexdigest()


@contextlib.contextmanager
def _locked(images: Path) -> Iterator[None]:
    """One build per cache at a time: a second waits, then finds the first one's image."""
    with (images / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _staging(images: Path) -> Iterator[Path]:
    """A scratch directory beside the cache's entries, so that the finished one is renamed into
    place, never copied across file systems."""
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=images))
    try:
        yield staging
    finally:
        _remove(staging)


def _remove(directory: Path) -> None:
    """debootstrap mounts /proc and /sys in its target while it configures packages; a killed one
    leaves them mounted, and removing the tree would reach into them."""
    prefix = f"{directory.resolve()}/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for point in sorted((mount for mount in mounts if mount.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)
    shutil.rmtree(directory, ignore_errors=True)


def _keep_only(images: Path, pattern: str, keep: Path) -> None:
    """One entry of each kind: each is tens or hundreds of MiB, and an earlier one is seldom
    wanted again (a reverted change rebuilds it in seconds)."""
    for earlier in images.glob(pattern):
        if earlier != keep:
            if earlier.is_dir():
                _remove(earlier)
            else:
                earlier.unlink(missing_ok=True)


def _say(message: str) -> None:
    print(f"agent image: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _step(name: str) -> Iterator[None]:
    _say(f"{name} ...")
    started = time.monotonic()
    yield
    _say(f"{name}: {time.monotonic() - started:.1f}s")


def main() -> int:
    started = time.monotonic()
    try:
        tar, name = build_agent_image()
    except (BuildError, OSError) as error:
        print(f"agent image: {error}", file=sys.stderr)
        return 1
    _say(f"done in {time.monotonic() - started:.1f}s")
    print(tar)
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
