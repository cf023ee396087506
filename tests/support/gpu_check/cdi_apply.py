"""What a CDI-aware runtime would do for a set of CDI device IDs, as data: the environment, the
bind mounts and the device nodes, and the shell steps that apply them in a private mount
namespace (`unshare -m`). Pure: the file system is read through a `PathFacts` snapshot, so the
plan for any spec can be tested without the files.

Short of a new root, the workload sees the host's file system with the spec's mounts on top; a
mount whose target already is its source is left alone, and a target that does not exist is
created as an empty mount point (listed in `created`, for the caller to remove afterwards).
Hooks are not run: they are listed so the report can say so.

The host's loader cache names where the host keeps the driver (`/usr/local/nvidia/lib64` on the
first GPU machine), so a workload that uses it finds the driver whatever the spec mounts. A
container image's cache knows nothing of that directory: with `empty_loader_cache` the plan binds
an empty file over `/etc/ld.so.cache`, and the loader searches only its built-in directories, where
the spec must have put the driver's libraries.
"""

import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

PathKind = Literal["file", "dir", "missing"]


class CdiEditError(ValueError):
    """A device ID or a spec that the edits cannot be read from; the message names which."""


@dataclass(frozen=True, slots=True)
class PathFact:
    kind: PathKind
    # The path with every symlink resolved; "" for a missing path.
    real: str = ""


PathFacts = Callable[[str], PathFact]


@dataclass(frozen=True, slots=True)
class MountEdit:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeEdit:
    path: str
    host_path: str


@dataclass(frozen=True, slots=True)
class Edits:
    """The container edits of some CDI devices, merged in the order a runtime applies them."""

    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[MountEdit, ...] = ()
    device_nodes: tuple[NodeEdit, ...] = ()
    hooks: tuple[str, ...] = ()

    def host_paths(self) -> tuple[str, ...]:
        """Every path on the host the edits name: mount sources, device nodes, hook programs."""
        paths = [m.host_path for m in self.mounts] + [n.host_path for n in self.device_nodes]
        return tuple(dict.fromkeys([*paths, *self.hooks]))


def parse_device_id(device_id: str) -> tuple[str, str]:
    """`vendor/class=name` -> (`vendor/class`, `name`)."""
    kind, equals, name = device_id.partition("=")
    if not equals or not name or "/" not in kind:
        raise CdiEditError(f"CDI device ID {device_id!r}: expected vendor/class=name")
    return kind, name


def _container_edits(
    owner: str, raw: Any
) -> tuple[dict[str, str], list[MountEdit], list[NodeEdit], list[str]]:
    if raw is None:
        return {}, [], [], []
    if not isinstance(raw, Mapping):
        raise CdiEditError(f"{owner}: containerEdits must be an object")
    env: dict[str, str] = {}
    for entry in raw.get("env") or []:
        key, equals, value = str(entry).partition("=")
        if not equals or not key:
            raise CdiEditError(f"{owner}: env entry {entry!r}: expected NAME=value")
        env[key] = value
    mounts = []
    for mount in raw.get("mounts") or []:
        try:
            mounts.append(
                MountEdit(mount["hostPath"], mount["containerPath"], tuple(mount.get("options") or ()))
            )
        except KeyError as missing:
            raise CdiEditError(f"{owner}: a mount has no {missing.args[0]}") from None
    nodes = []
    for node in raw.get("deviceNodes") or []:
        if "path" not in node:
            raise CdiEditError(f"{owner}: a device node has no path")
        nodes.append(NodeEdit(node["path"], node.get("hostPath") or node["path"]))
    hooks = [str(hook.get("path", "")) for hook in raw.get("hooks") or []]
    return env, mounts, nodes, hooks


def edits_for(specs: Sequence[Mapping[str, Any]], device_ids: Iterable[str]) -> Edits:
    """The merged edits of `device_ids`: each spec's own edits once, before those of its first
    requested device, then every requested device's, in the order given (a later variable wins)."""
    devices: dict[tuple[str, str], tuple[int, Mapping[str, Any]]] = {}
    for index, spec in enumerate(specs):
        kind = spec.get("kind")
        if not isinstance(kind, str):
            raise CdiEditError(f"CDI spec #{index}: no kind")
        for device in spec.get("devices") or []:
            devices[(kind, str(device.get("name")))] = (index, device)
    env: dict[str, str] = {}
    mounts: list[MountEdit] = []
    nodes: list[NodeEdit] = []
    hooks: list[str] = []
    applied_specs: set[int] = set()

    def add(owner: str, raw: Any) -> None:
        more_env, more_mounts, more_nodes, more_hooks = _container_edits(owner, raw)
        env.update(more_env)
        mounts.extend(more_mounts)
        nodes.extend(more_nodes)
        hooks.extend(more_hooks)

    for device_id in device_ids:
        key = parse_device_id(device_id)
        if key not in devices:
            known = ", ".join(f"{k}={n}" for k, n in sorted(devices)) or "none"
            raise CdiEditError(f"CDI device {device_id!r} is in no spec given (devices: {known})")
        index, device = devices[key]
        if index not in applied_specs:
            applied_specs.add(index)
            add(f"CDI spec {key[0]} #{index}", specs[index].get("containerEdits"))
        add(f"CDI device {device_id}", device.get("containerEdits"))
    return Edits(env, tuple(mounts), tuple(nodes), tuple(hooks))


def missing_host_paths(edits: Edits, facts: PathFacts) -> tuple[str, ...]:
    return tuple(path for path in edits.host_paths() if facts(path).kind == "missing")


@dataclass(frozen=True, slots=True)
class NamespacePlan:
    """`argv` runs the command in a private mount namespace with the edits applied; `env` is what
    the edits add to the command's environment."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    steps: tuple[str, ...]
    # Mount points made on the host for targets that did not exist; removed after the run.
    created: tuple[str, ...]
    # Edits that could not be applied: their host path does not exist.
    skipped: tuple[str, ...]


def _first_missing(path: str, facts: PathFacts) -> str:
    """The outermost missing directory on the way to `path` (or `path`), what creating it makes."""
    missing = path
    for parent in PurePosixPath(path).parents:
        if facts(str(parent)).kind != "missing":
            break
        missing = str(parent)
    return missing


def _bind(host: str, target: str, options: Sequence[str], facts: PathFacts, created: list[str]) -> list[str]:
    host_fact, target_fact = facts(host), facts(target)
    if target_fact.kind != "missing" and target_fact.real == host_fact.real:
        return []
    steps = []
    quoted = shlex.quote(target)
    if target_fact.kind == "missing":
        created.append(_first_missing(target, facts))
        if host_fact.kind == "dir":
            steps.append(f"mkdir -p {quoted}")
        else:
            steps += [f"mkdir -p {shlex.quote(str(PurePosixPath(target).parent))}", f": > {quoted}"]
    steps.append(f"mount --bind {shlex.quote(host)} {quoted}")
    # A bind mount takes its flags only from a remount.
    flags = [flag for flag in ("ro", "nosuid", "nodev", "noexec") if flag in options]
    if flags:
        steps.append(f"mount -o remount,bind,{','.join(flags)} {quoted}")
    return steps


LOADER_CACHE = "/etc/ld.so.cache"


def plan_namespace(
    edits: Edits, command: Sequence[str], facts: PathFacts, empty_loader_cache: str | None = None
) -> NamespacePlan:
    """`empty_loader_cache`: an empty file to bind over the host's loader cache (module docstring)."""
    if not command:
        raise CdiEditError("the workload command is empty")
    steps: list[str] = []
    created: list[str] = []
    skipped: list[str] = []
    for mount in edits.mounts:
        if facts(mount.host_path).kind == "missing":
            skipped.append(f"mount {mount.host_path} -> {mount.container_path}")
            continue
        steps += _bind(mount.host_path, mount.container_path, mount.options, facts, created)
    for node in edits.device_nodes:
        if facts(node.host_path).kind == "missing":
            skipped.append(f"device node {node.host_path}")
            continue
        steps += _bind(node.host_path, node.path, (), facts, created)
    if empty_loader_cache is not None and facts(LOADER_CACHE).kind == "file":
        steps.append(f"mount --bind {shlex.quote(empty_loader_cache)} {LOADER_CACHE}")
    script = "\n".join([*steps, 'exec "$@"'])
    argv = ("unshare", "--mount", "--propagation", "private", "sh", "-ec", script, "sh", *command)
    return NamespacePlan(argv, dict(edits.env), tuple(steps), tuple(dict.fromkeys(created)), tuple(skipped))
