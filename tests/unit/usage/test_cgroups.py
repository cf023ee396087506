"""A process's pod from its cgroup file, as kubelet names pod cgroups under either cgroup driver."""

from pathlib import Path

import pytest

from dra_driver.usage.cgroups import PodCgroup, pod_cgroup, pods_by_uid, read_pod_cgroups

UID = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b"
CID = "a" * 64


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd driver, containerd
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
        f"cri-containerd-{CID}.scope\n",
        # cgroup v2, cgroupfs driver
        f"0::/kubepods/besteffort/pod{UID}/{CID}\n",
        # cgroup v1: several hierarchies, the first with a pod wins
        f"12:pids:/\n11:memory:/kubepods/pod{UID}/{CID}\n",
        # CRI-O under systemd
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
    ],
)
def test_pod_and_container_are_read_from_every_kubelet_layout(text: str) -> None:
    assert pod_cgroup(text) == PodCgroup(UID, CID)


def test_a_host_process_and_a_pod_level_cgroup() -> None:
    assert pod_cgroup("0::/system.slice/containerd.service\n") is None
    assert pod_cgroup(f"0::/kubepods/pod{UID}\n") == PodCgroup(UID, "")


def test_readable_processes_are_reported_pod_or_not(tmp_path: Path) -> None:
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "cgroup").write_text("0::/user.slice\n")
    assert read_pod_cgroups(tmp_path, {10, 11, 12}) == {10: PodCgroup(UID, CID), 11: None}


def test_pod_names_come_from_kubelets_log_directories(tmp_path: Path) -> None:
    (tmp_path / f"team-a_trainer-0_{UID}").mkdir()
    (tmp_path / "not-a-pod-dir").mkdir()
    assert pods_by_uid(tmp_path) == {UID: ("team-a", "trainer-0")}
    assert pods_by_uid(tmp_path / "missing") == {}
