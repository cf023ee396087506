"""The GPU check's reading of CDI specs: device IDs to merged edits, and the namespace plan that
applies them, against path facts given as data."""

from collections.abc import Mapping
from typing import Any

import pytest

from tests.support.gpu_check.cdi_apply import (
    CdiEditError,
    Edits,
    MountEdit,
    NodeEdit,
    PathFact,
    edits_for,
    missing_host_paths,
    parse_device_id,
    plan_namespace,
)

CLAIM = {
    "cdiVersion": "0.5.0",
    "kind": "k8s.gpu.dra-driver.dev/claim",
    "devices": [
        {
            "name": "uid-gpu-0",
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=void", "CUDA_DEVICE_MEMORY_LIMIT_0=8192m"],
                "deviceNodes": [{"path": "/dev/nvidia0"}],
            },
        },
        {"name": "uid-other", "containerEdits": {"env": ["OTHER=1"]}},
    ],
}
NODE = {
    "cdiVersion": "0.5.0",
    "kind": "k8s.gpu.dra-driver.dev/node",
    "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "FROM_SPEC=1"]},
    "devices": [
        {
            "name": "common",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": "/run/driver/dev/nvidiactl"}],
                "mounts": [
                    {
                        "hostPath": "/run/driver/lib/libcuda.so.580",
                        "containerPath": "/usr/lib/libcuda.so.1",
                        "options": ["ro", "nosuid", "nodev", "bind"],
                    }
                ],
                "hooks": [{"hookName": "createContainer", "path": "/usr/bin/hook"}],
            },
        }
    ],
}
IDS = ["k8s.gpu.dra-driver.dev/node=common", "k8s.gpu.dra-driver.dev/claim=uid-gpu-0"]


def facts_of(table: Mapping[str, PathFact]) -> Any:
    return lambda path: table.get(path, PathFact("missing"))


def test_the_edits_of_the_requested_devices_merge_spec_edits_first_and_later_variables_win() -> None:
    edits = edits_for([CLAIM, NODE], IDS)

    assert edits.env == {
        "NVIDIA_VISIBLE_DEVICES": "void",
        "FROM_SPEC": "1",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "8192m",
    }
    assert "OTHER" not in edits.env  # a device of the spec that was not asked for
    assert edits.device_nodes == (
        NodeEdit("/dev/nvidiactl", "/run/driver/dev/nvidiactl"),
        NodeEdit("/dev/nvidia0", "/dev/nvidia0"),
    )
    assert edits.mounts == (
        MountEdit(
            "/run/driver/lib/libcuda.so.580", "/usr/lib/libcuda.so.1", ("ro", "nosuid", "nodev", "bind")
        ),
    )
    assert edits.host_paths() == (
        "/run/driver/lib/libcuda.so.580",
        "/run/driver/dev/nvidiactl",
        "/dev/nvidia0",
        "/usr/bin/hook",
    )


@pytest.mark.parametrize(
    ("device_id", "message"),
    [
        ("k8s.gpu.dra-driver.dev/claim", "expected vendor/class=name"),
        ("claim=uid-gpu-0", "expected vendor/class=name"),
        ("k8s.gpu.dra-driver.dev/claim=nope", "'k8s.gpu.dra-driver.dev/claim=nope' is in no spec given"),
    ],
)
def test_a_device_id_that_names_no_device_is_an_error_that_names_it(device_id: str, message: str) -> None:
    with pytest.raises(CdiEditError, match=message):
        edits_for([CLAIM, NODE], [device_id])


def test_a_malformed_spec_is_an_error_that_names_the_device() -> None:
    broken = {"kind": "a.b/c", "devices": [{"name": "d", "containerEdits": {"env": ["NOEQUALS"]}}]}
    with pytest.raises(CdiEditError, match=r"CDI device a.b/c=d: env entry 'NOEQUALS'"):
        edits_for([broken], ["a.b/c=d"])
    mountless = {
        "kind": "a.b/c",
        "devices": [{"name": "d", "containerEdits": {"mounts": [{"hostPath": "/x"}]}}],
    }
    with pytest.raises(CdiEditError, match="a mount has no containerPath"):
        edits_for([mountless], ["a.b/c=d"])


def test_parse_device_id() -> None:
    assert parse_device_id("k8s.gpu.dra-driver.dev/claim=uid=x") == ("k8s.gpu.dra-driver.dev/claim", "uid=x")


def test_missing_host_paths_are_those_the_facts_do_not_know() -> None:
    edits = edits_for([CLAIM, NODE], IDS)
    facts = facts_of({"/dev/nvidia0": PathFact("file", "/dev/nvidia0")})

    assert missing_host_paths(edits, facts) == (
        "/run/driver/lib/libcuda.so.580",
        "/run/driver/dev/nvidiactl",
        "/usr/bin/hook",
    )


def test_the_plan_binds_read_only_creates_missing_targets_and_skips_what_the_host_lacks() -> None:
    edits = Edits(
        env={"A": "1"},
        mounts=(
            MountEdit("/host/lib/libcuda.so.580", "/usr/lib/libcuda.so.1", ("ro", "nosuid", "bind")),
            MountEdit("/host/firmware", "/lib/firmware/nvidia/580", ("ro",)),
            MountEdit("/usr/lib/libnvidia-ml.so.580", "/usr/lib/libnvidia-ml.so.580", ("ro",)),
            MountEdit("/absent", "/usr/lib/absent"),
        ),
        device_nodes=(NodeEdit("/dev/nvidia0", "/dev/nvidia0"), NodeEdit("/dev/nvidiactl", "/drv/nvidiactl")),
    )
    facts = facts_of(
        {
            "/host/lib/libcuda.so.580": PathFact("file", "/host/lib/libcuda.so.580"),
            "/usr/lib/libcuda.so.1": PathFact("file", "/usr/lib/libcuda.so.1.old"),
            "/host/firmware": PathFact("dir", "/host/firmware"),
            "/lib": PathFact("dir", "/usr/lib"),
            "/usr/lib/libnvidia-ml.so.580": PathFact("file", "/usr/lib/libnvidia-ml.so.580"),
            "/dev/nvidia0": PathFact("file", "/dev/nvidia0"),
            "/drv/nvidiactl": PathFact("file", "/drv/nvidiactl"),
            "/dev": PathFact("dir", "/dev"),
        }
    )

    plan = plan_namespace(edits, ["python3", "w.py"], facts)

    assert plan.steps == (
        "mount --bind /host/lib/libcuda.so.580 /usr/lib/libcuda.so.1",
        "mount -o remount,bind,ro,nosuid /usr/lib/libcuda.so.1",
        "mkdir -p /lib/firmware/nvidia/580",
        "mount --bind /host/firmware /lib/firmware/nvidia/580",
        "mount -o remount,bind,ro /lib/firmware/nvidia/580",
        "mkdir -p /dev",
        ": > /dev/nvidiactl",
        "mount --bind /drv/nvidiactl /dev/nvidiactl",
    )
    assert plan.created == ("/lib/firmware", "/dev/nvidiactl")
    assert plan.skipped == ("mount /absent -> /usr/lib/absent",)
    assert plan.env == {"A": "1"}
    assert plan.argv[:6] == ("unshare", "--mount", "--propagation", "private", "sh", "-ec")
    assert plan.argv[6].endswith('\nexec "$@"')
    assert plan.argv[7:] == ("sh", "python3", "w.py")


def test_paths_with_spaces_are_quoted() -> None:
    edits = Edits(mounts=(MountEdit("/a b", "/c d"),))
    facts = facts_of({"/a b": PathFact("file", "/a b"), "/c d": PathFact("file", "/c d")})

    assert plan_namespace(edits, ["x"], facts).steps == ("mount --bind '/a b' '/c d'",)


def test_an_empty_command_is_refused() -> None:
    with pytest.raises(CdiEditError, match="the workload command is empty"):
        plan_namespace(Edits(), [], facts_of({}))


def test_the_hosts_loader_cache_is_hidden_last_so_only_the_spec_places_the_driver() -> None:
    edits = Edits(mounts=(MountEdit("/host/libcuda.so.580", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),))
    present = {
        "/host/libcuda.so.580": PathFact("file", "/host/libcuda.so.580"),
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1": PathFact("file", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
    }
    with_cache = facts_of({**present, "/etc/ld.so.cache": PathFact("file", "/etc/ld.so.cache")})

    hidden = plan_namespace(edits, ["x"], with_cache, empty_loader_cache="/tmp/gc/empty cache")

    assert hidden.steps[-1] == "mount --bind '/tmp/gc/empty cache' /etc/ld.so.cache"
    assert hidden.steps[:-1] == plan_namespace(edits, ["x"], with_cache).steps
    assert hidden.created == ()  # the cache is bound over, never made or removed
    # A host without a cache has nothing to hide.
    assert plan_namespace(edits, ["x"], facts_of(present), empty_loader_cache="/e").steps == (
        "mount --bind /host/libcuda.so.580 /usr/lib/x86_64-linux-gnu/libcuda.so.1",
    )
