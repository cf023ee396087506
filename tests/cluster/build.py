"""Builds the cluster's upstream components from the wrapper modules in hack/cluster/modules
(go.mod and go.sum committed: every version pinned and checksummed) with the Go module proxy as
the only source, and caches the binaries per version outside the work tree.

A binary directory is named by a hash of its module's go.mod and go.sum, the Go version and the
build settings, so a second run builds nothing and a changed pin builds anew. A cold build of
Kubernetes takes tens of minutes on two cores: the build prints which component it is on, how
many packages are compiled and the time elapsed every 30 seconds, never a silent half-hour.

    python -m tests.cluster.build [--kubernetes 1.37]     # prints the bin directory of each
"""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.cache import cache_root
from tests.cluster.versions import MODULES, SUPPORTED, KubernetesVersion, kubernetes_version

_PROGRESS_EVERY = 30.0
_K8S_TAGS = ("selinux", "notest", "grpcnotrace")


class BuildError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Component:
    """One `go build` of a wrapper module: the packages it compiles and how."""

    name: str
    module: Path
    # import path -> binary name
    binaries: dict[str, str]
    cgo: bool = False
    tags: tuple[str, ...] = ()
    # -X settings: every component reports its real version, not a development default.
    version_vars: dict[str, str] = field(default_factory=dict)

    def key(self) -> str:
        digest = hashlib.sha256()
        for part in (
            (self.module / "go.mod").read_bytes(),
            (self.module / "go.sum").read_bytes(),
            go_version().encode(),
            repr(
                (sorted(self.binaries.items()), self.cgo, self.tags, sorted(self.version_vars.items()))
            ).encode(),
        ):
            digest.update(hashlib.sha256(part).digest())
        return digest.hexdigest()[:16]

    def bin_dir(self) -> Path:
        return cache_root() / "bin" / f"{self.name}-{self.key()}"


def go_version() -> str:
    return subprocess.run(
        ["go", "env", "GOVERSION"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _required_version(module: Path, path: str) -> str:
    for line in (module / "go.mod").read_text().splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "require" and words[1] == path:
            return words[2]
    raise BuildError(f"{module / 'go.mod'}: no 'require {path} <version>' line")


def _kubernetes_version_vars(release: str) -> dict[str, str]:
    major, minor = release.lstrip("v").split(".")[:2]
    settings = {
        "gitVersion": release,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    return {
        f"{package}.{name}": value
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for name, value in settings.items()
    }


def kubernetes_component(version: KubernetesVersion) -> Component:
    version_vars = _kubernetes_version_vars(version.release)
    commands = (
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
        "kubectl",
        "kubelet",
    )
    return Component(
        name=f"kubernetes-{version.minor}",
        module=version.module,
        binaries={f"k8s.io/kubernetes/cmd/{command}": command for command in commands},
        tags=_K8S_TAGS,
        version_vars=version_vars,
    )


def node_components() -> list[Component]:
    """etcd, containerd with its shim and ctr, runc (cgo for seccomp, as upstream needs) and the
    CNI plugins of the pod network."""
    containerd = MODULES / "containerd"
    runc = MODULES / "runc"
    cni = MODULES / "cni"
    cni_version = _required_version(cni, "github.com/containernetworking/plugins")
    return [
        Component(name="etcd", module=MODULES / "etcd", binaries={"go.etcd.io/etcd/server/v3": "etcd"}),
        Component(
            name="containerd",
            module=containerd,
            binaries={
                f"github.com/containerd/containerd/v2/cmd/{command}": command
                for command in ("containerd", "containerd-shim-runc-v2", "ctr")
            },
            tags=("no_btrfs", "no_devmapper", "no_zfs"),
            version_vars={
                "github.com/containerd/containerd/v2/version.Version": _required_version(
                    containerd, "github.com/containerd/containerd/v2"
                ),
            },
        ),
        Component(
            name="runc",
            module=runc,
            binaries={"github.com/opencontainers/runc": "runc"},
            cgo=True,
            tags=("seccomp",),
            version_vars={
                "main.version": _required_version(runc, "github.com/opencontainers/runc").lstrip("v")
            },
        ),
        Component(
            name="cni",
            module=cni,
            binaries={
                f"github.com/containernetworking/plugins/plugins/{path}": path.rsplit("/", 1)[1]
                for path in ("main/bridge", "main/loopback", "ipam/host-local")
            },
            version_vars={
                "github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion": cni_version
            },
        ),
    ]


def kwok_component() -> Component:
    """kwok, for the cluster-scale benchmark only (tests/bench/cluster_scale): it keeps fake
    Nodes Ready and their pods Running with no kubelet, so `make cluster` never builds it."""
    return Component(
        name="kwok",
        module=MODULES / "kwok",
        binaries={"sigs.k8s.io/kwok/cmd/kwok": "kwok"},
    )


def dra_test_driver_component() -> Component:
    """Upstream's DRA test driver (k8s.io/kubernetes/test/e2e/dra/test-driver, `dra-test-driver`)
    at the 1.37 pin, for the side-by-side benchmark only (tests/bench/pod_start/go_driver.py): a
    Go kubelet plugin on upstream's kubeletplugin helper. Its own wrapper module, so its build key
    is not kubernetes-1.37's and the cluster's commands never rebuild for it; the shared packages
    come from the warm Go build cache."""
    module = MODULES / "dra-test-driver"
    return Component(
        name="dra-test-driver",
        module=module,
        binaries={"k8s.io/kubernetes/test/e2e/dra/test-driver": "dra-test-driver"},
        tags=_K8S_TAGS,
        version_vars=_kubernetes_version_vars(_required_version(module, "k8s.io/kubernetes")),
    )


def dra_example_driver_component() -> Component:
    """Upstream's reference DRA driver (sigs.k8s.io/dra-example-driver, its kubelet plugin
    `dra-example-kubeletplugin`), for the side-by-side benchmark only. It has no version variable
    to set (its Makefile's -X main.version names none in this command)."""
    return Component(
        name="dra-example-driver",
        module=MODULES / "dra-example-driver",
        binaries={
            "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin": "dra-example-kubeletplugin"
        },
    )


def _say(message: str) -> None:
    print(f"cluster build: {message}", file=sys.stderr, flush=True)


def _progress(name: str, started: float, log: Path, done: threading.Event) -> None:
    while not done.wait(_PROGRESS_EVERY):
        try:
            packages = sum(1 for _ in log.open())
        except OSError:
            packages = 0
        _say(f"{name}: {packages} packages compiled, {time.monotonic() - started:.0f}s elapsed")


def _environment(component: Component) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CGO_ENABLED="1" if component.cgo else "0",
        # Only the local Go: a newer go line must fail, not fetch a toolchain from elsewhere.
        GOTOOLCHAIN="local",
        GOFLAGS="-mod=mod -buildvcs=false",
    )
    return env


def build(component: Component) -> Path:
    """The component's bin directory, built unless it is already in the cache."""
    target = component.bin_dir()
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    log = staging / "build.log"
    ldflags = " ".join(
        ["-s", "-w", *(f"-X {name}={value}" for name, value in component.version_vars.items())]
    )
    argv = [
        "go", "build", "-v", "-trimpath",
        *(["-tags", ",".join(component.tags)] if component.tags else []),
        "-ldflags", ldflags,
        "-o", f"{staging}/",
        *component.binaries,
    ]  # fmt: skip
    started = time.monotonic()
    _say(f"{component.name}: building {', '.join(component.binaries.values())} (log {log})")
    done = threading.Event()
    ticker = threading.Thread(target=_progress, args=(component.name, started, log, done), daemon=True)
    ticker.start()
    try:
        with log.open("w") as output:
            completed = subprocess.run(
                argv,
                cwd=component.module,
                env=_environment(component),
                stdout=output,
                stderr=output,
                check=False,
            )
    finally:
        done.set()
    if completed.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise BuildError(f"{component.name}: go build exited {completed.returncode}; the log's end:\n{tail}")
    for package, binary in component.binaries.items():
        built = staging / _default_name(package)
        if not built.is_file():
            raise BuildError(f"{component.name}: go build made no {built.name}")
        built.rename(staging / binary)
    (staging / ".complete").write_text(f"{time.monotonic() - started:.0f}s\n")
    staging.rename(target)
    _say(f"{component.name}: built in {time.monotonic() - started:.0f}s")
    return target


def _default_name(package: str) -> str:
    """What `go build -o DIR/` names a main package's binary: its last path element, or the one
    before a major-version suffix (go.etcd.io/etcd/server/v3 -> server)."""
    parts = package.split("/")
    if len(parts) > 1 and re.fullmatch(r"v[0-9]+", parts[-1]):
        return parts[-2]
    return parts[-1]


def components(version: KubernetesVersion) -> list[Component]:
    return [*node_components(), kubernetes_component(version)]


def build_all(version: KubernetesVersion) -> dict[str, Path]:
    """Every binary's path by name, building what the cache lacks."""
    if shutil.which("go") is None:
        raise BuildError("go is not on the PATH: install Go >= 1.26.6 (the containerd module needs it)")
    paths: dict[str, Path] = {}
    for component in components(version):
        directory = build(component)
        paths.update({binary: directory / binary for binary in component.binaries.values()})
    return paths


def cached(version: KubernetesVersion) -> Iterator[tuple[Component, bool]]:
    for component in components(version):
        yield component, (component.bin_dir() / ".complete").exists()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster.build", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--kubernetes", choices=SUPPORTED, help="minor version (default: E2E_KUBERNETES or newest)"
    )
    args = parser.parse_args(argv)
    try:
        version = kubernetes_version(args.kubernetes)
        started = time.monotonic()
        for name, path in build_all(version).items():
            print(f"{name}\t{path}")
    except (BuildError, ValueError) as error:
        print(f"cluster build: {error}", file=sys.stderr)
        return 1
    _say(f"everything for Kubernetes {version.release} in place after {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
