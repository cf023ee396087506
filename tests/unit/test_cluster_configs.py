"""The local cluster's configuration files and flags (tests/cluster), read back as the components
read them: containerd's TOML by a TOML parser, kubelet's YAML, the CNI JSON."""

import json
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.cluster import configs, control_plane
from tests.cluster.images import PAUSE_IMAGE
from tests.cluster.layout import Layout
from tests.cluster.pki import subject
from tests.cluster.versions import GATES, SUPPORTED, kubernetes_version

LAYOUT = Layout(Path("/tmp/cluster-under-test"))


def _containerd() -> dict[str, object]:
    text = configs.containerd_config(
        LAYOUT, Path("/cache/runc"), Path("/cache/cni"), [LAYOUT.cdi_dir, Path("/var/run/cdi")]
    )
    return tomllib.loads(text)


def test_containerd_keeps_its_root_and_state_in_the_cluster_directory() -> None:
    config = _containerd()

    # Top-level keys: a key after a table header would belong to that table.
    assert config["version"] == 3
    assert config["root"] == str(LAYOUT.containerd / "root")
    assert config["state"] == str(LAYOUT.containerd / "state")
    assert config["grpc"] == {"address": str(LAYOUT.containerd_socket)}


def test_containerd_reads_cdi_specs_and_does_not_lower_oom_scores() -> None:
    runtime = _containerd()["plugins"]["io.containerd.cri.v1.runtime"]  # type: ignore[index]

    assert runtime["enable_cdi"] is True
    assert runtime["cdi_spec_dirs"] == [str(LAYOUT.cdi_dir), "/var/run/cdi"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["netns_mounts_under_state_dir"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"BinaryName": "/cache/runc", "SystemdCgroup": False}
    assert runtime["cni"]["conf_dir"] == str(LAYOUT.cni_conf_dir)


def test_containerd_never_pulls_the_sandbox_image() -> None:
    images = _containerd()["plugins"]["io.containerd.cri.v1.images"]  # type: ignore[index]

    assert images["pinned_images"] == {"sandbox": PAUSE_IMAGE}


def test_the_pod_network_stays_on_its_own_bridge_without_masquerading() -> None:
    network = json.loads(configs.cni_conflist(LAYOUT))

    bridge = network["plugins"][0]
    assert bridge["type"] == "bridge"
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["dataDir"].startswith(str(LAYOUT.root))


def test_kubelet_runs_on_cgroup_v1_without_lowering_oom_scores() -> None:
    config = yaml.safe_load(configs.kubelet_config(LAYOUT, {"DRAConsumableCapacity": True}))

    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["oomScoreAdj"] == 0
    assert config["featureGates"] == {"DRAConsumableCapacity": True}
    assert config["containerRuntimeEndpoint"] == f"unix://{LAYOUT.containerd_socket}"
    assert config["podLogsDir"].startswith(str(LAYOUT.root))


def test_a_kubeconfig_with_a_token_has_no_certificate() -> None:
    document = yaml.safe_load(
        configs.kubeconfig("https://127.0.0.1:6443", Path("/ca.crt"), None, None, "abc")
    )

    assert document["users"][0]["user"] == {"token": "abc"}
    assert document["clusters"][0]["cluster"]["certificate-authority"] == "/ca.crt"


def test_groups_go_in_the_organization_and_the_user_in_the_common_name() -> None:
    assert subject("system:node:n", ("system:nodes",)) == "/O=system:nodes/CN=system:node:n"


@pytest.mark.parametrize("minor", SUPPORTED)
def test_every_off_by_default_gate_of_ours_is_turned_on_for_every_component(minor: str) -> None:
    version = kubernetes_version(minor)
    turned_on = version.feature_gates

    # Left off: DeviceTaintRules (nothing of ours uses them), and on 1.34 consumable capacity,
    # whose scheduler panics on requests for more devices than a slice holds.
    left_off = {"DRADeviceTaintRules", *(["DRAConsumableCapacity"] if minor == "1.34" else [])}
    for gate in GATES:
        if minor in gate.stages and gate.name not in left_off:
            assert turned_on.get(gate.name, gate.stages[minor][1]) is True, gate.name
    assert not any(turned_on.get(name) for name in left_off)
    flag = f"--feature-gates={version.feature_gate_flag()}"
    assert (flag in control_plane.api_server_argv(Path("a"), LAYOUT, version)) == bool(turned_on)
    assert (flag in control_plane.scheduler_argv(Path("s"), LAYOUT, version)) == bool(turned_on)


def test_the_oldest_version_needs_the_alpha_gates_and_the_newest_none() -> None:
    assert set(kubernetes_version("1.34").feature_gates) == {
        "DRAPartitionableDevices",
        "DRADeviceTaints",
        "DRAExtendedResource",
        "ResourceHealthStatus",
    }
    assert kubernetes_version("1.37").feature_gates == {}


def test_an_unknown_version_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"E2E_KUBERNETES='1\.30': expected one of 1\.34, 1\.37"):
        kubernetes_version("1.30")


def test_alpha_device_taints_bring_their_alpha_api_with_them() -> None:
    oldest = kubernetes_version("1.34")

    assert "--runtime-config=resource.k8s.io/v1alpha3=true" in control_plane.api_server_argv(
        Path("a"), LAYOUT, oldest
    )
    assert kubernetes_version("1.37").runtime_config is None
