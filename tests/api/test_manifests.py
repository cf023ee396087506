"""The install manifests (`dra-driver manifests`, deploy/dra-driver.yaml).

The admission policy's CEL is run by the real CEL engine (cel-expr-python) against admission
requests shaped like the API server's, because a policy that is wrong in the permissive direction
fails silently: nothing in a working cluster would show that one node's agent can write another's
slices.
"""

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import main
from dra_driver.devices.classes import device_classes
from dra_driver.tools.manifests import (
    ManifestError,
    ManifestOptions,
    parse_env,
    parse_node_selector,
    render,
    render_yaml,
    service_account_username,
    split_node_config_argument,
)
from tests.support.admission_policy import denials, user_info
from tests.support.k8s_schemas import KUBERNETES_VERSIONS

REPOSITORY = Path(__file__).resolve().parents[2]
OTHER = ManifestOptions(
    driver_name="gpu.example.com",
    image="registry.example.com/gpu/dra:1.2.3",
    namespace="gpu-system",
    hardware="simulated:dgx-h100",
    node_selector={"example.com/accelerator": "nvidia", "pool": ""},
)
NODE_CONFIG = "default:\n  mode: mig-dynamic\n"
VGPU_CONFIG = "# the vGPU nodes\ngpus:\n  - {index: 0, mode: vgpu-capacity}\n"
SIMULATED_NODE = "gpus:\n  - model: H100-SXM5-80GB\n    count: 2\n"
EVERYTHING = ManifestOptions(
    name="gpus",
    hardware="simulated:node.yaml",
    max_surge=0,
    node_configs={"default": NODE_CONFIG, "vgpu": VGPU_CONFIG},
    simulated_node=SIMULATED_NODE,
    hami_core_library="/usr/local/vgpu/libvgpu.so",
    driver_root="/run/nvidia/driver",
    registrar_dir="/var/lib/k0s/kubelet/plugins_registry",
    plugins_dir="/var/lib/k0s/kubelet/plugins",
    priority_class_name="",
    log_verbosity=4,
    log_format="console",
    metrics_port=9500,
    extra_env={"MOCK_NVML_NODE": "/run/mock-nvidia/node.txt", "EMPTY": ""},
)


def objects_of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item for item in objects if item["kind"] == kind]


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = objects_of_kind(objects, kind)
    return found


# --- The committed file and validity ------------------------------------------------------------


def test_the_committed_manifests_are_the_default_rendering() -> None:
    committed = (REPOSITORY / "deploy" / "dra-driver.yaml").read_text()

    assert committed == render_yaml(ManifestOptions()), (
        "deploy/dra-driver.yaml is stale: dra-driver manifests > deploy/dra-driver.yaml"
    )
    assert list(yaml.safe_load_all(committed)) == render(ManifestOptions())


@pytest.mark.parametrize("kubernetes", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "options", [ManifestOptions(), OTHER, EVERYTHING], ids=["default", "other", "everything"]
)
def test_every_object_is_valid(kubernetes: str, options: ManifestOptions) -> None:
    for item in render(options):
        kubernetes_validate.validate(item, kubernetes, strict=True)


def test_the_order_is_namespace_rbac_policy_daemonset_classes() -> None:
    kinds = [item["kind"] for item in render(ManifestOptions())]

    assert kinds == [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DaemonSet",
        *["DeviceClass"] * 5,
    ]
    rendered_classes = render(OTHER)[-5:]
    assert [item["spec"] for item in rendered_classes] == [
        item["spec"] for item in device_classes(OTHER.driver_name)
    ]
    assert {item["metadata"]["labels"]["app.kubernetes.io/instance"] for item in rendered_classes} == {
        OTHER.name
    }


# --- RBAC ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [ManifestOptions(), OTHER], ids=["default", "other"])
def test_rbac_grants_exactly_what_the_agent_uses(options: ManifestOptions) -> None:
    objects = render(options)
    role = only(objects, "ClusterRole")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }

    assert granted == {
        ("resource.k8s.io", "resourceclaims", "get"),
        *(("", "nodes", verb) for verb in ("get", "list", "watch")),
        *(
            ("resource.k8s.io", "resourceslices", verb)
            for verb in ("get", "list", "watch", "create", "update", "delete")
        ),
        ("", "events", "create"),
        ("", "events", "patch"),
        ("resource.k8s.io", "resourceclaims/status", "update"),
        ("resource.k8s.io", "resourceclaims/driver", "associated-node:update"),
    }
    # The synthetic driver subresource of 1.36 is named by the driver: our own name only.
    named = [rule for rule in role["rules"] if "resourceNames" in rule]
    assert named == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims/driver"],
            "resourceNames": [options.driver_name],
            "verbs": ["associated-node:update"],
        }
    ]
    assert all(
        set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"] if rule not in named
    )
    assert "*" not in str(role["rules"])
    binding = only(objects, "ClusterRoleBinding")
    account = only(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": options.namespace}
    ]
    assert account["metadata"]["namespace"] == options.namespace


# --- The admission policy, evaluated ------------------------------------------------------------


def admit(policy: dict[str, Any], request: dict[str, Any]) -> tuple[bool, list[str]]:
    """What the API server decides: (allowed, the denial messages)."""
    operation = request["operation"]
    new = None if operation == "DELETE" else request["object"]
    old = None if operation == "CREATE" else request["oldObject"]
    found = denials(policy, "resourceslices", request, new, old)
    return (True, []) if found is None else (not found, found)


def slice_on(node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": DEFAULT_DRIVER_NAME, "pool": {"name": "p", "generation": 1}}
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": spec,
    }


def request(
    operation: str,
    new: dict[str, Any] | None,
    old: dict[str, Any] | None,
    namespace: str = "dra-driver",
    node: str | None = "node-a",
) -> dict[str, Any]:
    user = user_info(service_account_username(namespace), node, pod="dra-driver-x")
    return {"operation": operation, "userInfo": user, "object": new, "oldObject": old}


# The first policy is the slices' one; the claim-status and MPS daemon pods' policies have tests of their own
# (test_claim_status_policy.py, test_mps_admission.py).
POLICY = objects_of_kind(render(ManifestOptions()), "ValidatingAdmissionPolicy")[0]


@pytest.mark.parametrize(
    ("operation", "new", "old"),
    [
        ("CREATE", slice_on("node-a"), None),
        ("UPDATE", slice_on("node-a"), slice_on("node-a")),
        ("DELETE", None, slice_on("node-a")),
    ],
)
def test_the_agent_may_write_its_own_nodes_slices(
    operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None
) -> None:
    assert admit(POLICY, request(operation, new, old)) == (True, [])


@pytest.mark.parametrize(
    ("operation", "new", "old"),
    [
        ("CREATE", slice_on("node-b"), None),
        ("UPDATE", slice_on("node-b"), slice_on("node-b")),
        ("UPDATE", slice_on("node-a"), slice_on("node-b")),  # taking over another node's slice
        ("UPDATE", slice_on("node-b"), slice_on("node-a")),  # moving its own slice away
        ("DELETE", None, slice_on("node-b")),
        ("CREATE", slice_on(None), None),
        ("UPDATE", slice_on(None), slice_on(None)),
        ("DELETE", None, slice_on(None)),
    ],
)
def test_the_agent_may_not_write_other_slices(
    operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None
) -> None:
    allowed, denials = admit(POLICY, request(operation, new, old))

    assert not allowed
    assert all("node-a" in denial for denial in denials)


def test_a_token_not_bound_to_a_node_writes_nothing() -> None:
    allowed, denials = admit(POLICY, request("CREATE", slice_on("node-a"), None, node=None))

    assert not allowed
    assert any("bound to a pod on a node" in denial for denial in denials)


def test_the_policy_leaves_everyone_else_alone() -> None:
    """Another namespace's service account with the same name is not the agent; the policy is
    off for it (RBAC decides), as it is for the scheduler and admins."""
    assert admit(POLICY, request("CREATE", slice_on("node-b"), None, namespace="elsewhere")) == (True, [])
    other_policy = objects_of_kind(render(OTHER), "ValidatingAdmissionPolicy")[0]
    allowed, _ = admit(other_policy, request("CREATE", slice_on("node-b"), None, namespace="gpu-system"))
    assert not allowed
    binding = objects_of_kind(render(OTHER), "ValidatingAdmissionPolicyBinding")[0]
    assert binding["spec"] == {"policyName": other_policy["metadata"]["name"], "validationActions": ["Deny"]}


# --- The DaemonSet ------------------------------------------------------------------------------


def test_the_daemon_set_runs_the_agent_as_configured() -> None:
    daemon_set = only(render(OTHER), "DaemonSet")
    pod = daemon_set["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume["hostPath"] for volume in pod["volumes"]}

    assert daemon_set["metadata"]["namespace"] == "gpu-system"
    assert container["image"] == OTHER.image
    assert pod["nodeSelector"] == OTHER.node_selector
    assert "affinity" not in pod, "a node selector replaces the default placement"
    assert pod["priorityClassName"] == "system-node-critical"
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}, "sockets named per pod"
    assert env["DRA_DRIVER_NAME"] == "gpu.example.com"
    assert env["DRA_DRIVER_HARDWARE"] == "simulated:dgx-h100"
    assert env["DRA_DRIVER_ROOT"] == "/driver-root"
    # CDI specs name the driver root as the host has it: the runtime resolves them there.
    assert env["DRA_DRIVER_HOST_ROOT"] == volumes["driver-root"]["path"] == "/"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void", "the NVIDIA runtime must not inject GPUs into the agent"
    assert env["DRA_DRIVER_MPS_DIR"].startswith(volumes["run"]["path"] + "/")
    assert (env["DRA_DRIVER_LOG_FORMAT"], env["DRA_DRIVER_VERBOSITY"]) == ("json", "0")
    assert container["securityContext"] == {"privileged": True}
    assert container["ports"] == [{"name": "metrics", "containerPort": 9477, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    # The new agent pod starts next to the old one: the node never stops preparing claims.
    assert daemon_set["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert "DRA_DRIVER_NODE_CONFIGS" not in env and "DRA_DRIVER_HAMI_CORE_LIBRARY" not in env
    assert objects_of_kind(render(OTHER), "ConfigMap") == []
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    # The driver installed on the host by default, seen read-only, and later mounts propagate.
    assert volumes["driver-root"] == {"path": "/", "type": "DirectoryOrCreate"}
    assert mounts["driver-root"] == {
        "name": "driver-root",
        "mountPath": "/driver-root",
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }
    for path in ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi", "/dev"):
        (name,) = [name for name, volume in volumes.items() if volume["path"] == path]
        assert mounts[name]["mountPath"] == path, "kubelet and the runtime see these paths as the agent does"
    assert set(mounts) == set(volumes)


def test_by_default_the_agent_runs_on_nodes_with_either_gpu_label() -> None:
    pod = only(render(ManifestOptions()), "DaemonSet")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]

    assert "nodeSelector" not in pod
    # Terms are ORed; the expressions within one term are ANDed: one label per term.
    assert terms == [
        {"matchExpressions": [{"key": key, "operator": "In", "values": ["true"]}]}
        for key in ("feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present")
    ]


def test_node_configs_driver_root_kubelet_paths_hami_core_and_the_rest_when_asked() -> None:
    objects = render(EVERYTHING)
    config_maps = {item["metadata"]["name"]: item for item in objects_of_kind(objects, "ConfigMap")}
    daemon_set = only(objects, "DaemonSet")
    pod = daemon_set["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}

    assert [item["kind"] for item in objects[:3]] == ["Namespace", "ConfigMap", "ConfigMap"]
    assert config_maps["gpus-node-configs"]["data"] == {"default.yaml": NODE_CONFIG, "vgpu.yaml": VGPU_CONFIG}
    assert config_maps["gpus-simulated-node"]["data"] == {"simulated-node.yaml": SIMULATED_NODE}
    assert volumes["node-configs"]["configMap"]["name"] == "gpus-node-configs"
    assert mounts["node-configs"] == {
        "name": "node-configs",
        "mountPath": "/etc/dra-driver/node-configs",
        "readOnly": True,
    }
    assert env["DRA_DRIVER_NODE_CONFIGS"] == "/etc/dra-driver/node-configs"
    assert volumes["simulated-node"]["configMap"]["name"] == "gpus-simulated-node"
    assert (
        env["DRA_DRIVER_HARDWARE"] == f"simulated:{mounts['simulated-node']['mountPath']}/simulated-node.yaml"
    )
    assert env["DRA_DRIVER_HAMI_CORE_LIBRARY"] == "/usr/local/vgpu/libvgpu.so"
    for name in ("hami-core-library", "hami-core-dir"):
        assert mounts[name]["mountPath"] == volumes[name]["hostPath"]["path"], "host paths, as CDI names them"
    assert volumes["hami-core-dir"]["hostPath"]["path"] == env["DRA_DRIVER_HAMI_CORE_DIR"]
    assert mounts["hami-core-library"]["readOnly"] is True
    assert volumes["driver-root"]["hostPath"] == {"path": "/run/nvidia/driver", "type": "DirectoryOrCreate"}
    assert env["DRA_DRIVER_HOST_ROOT"] == "/run/nvidia/driver"
    assert mounts["driver-root"]["mountPath"] == env["DRA_DRIVER_ROOT"] == "/driver-root"
    assert container["env"][-2:] == [
        {"name": "MOCK_NVML_NODE", "value": "/run/mock-nvidia/node.txt"},
        {"name": "EMPTY", "value": ""},
    ]
    for name, variable, path in (
        ("plugins-registry", "DRA_DRIVER_REGISTRAR_DIR", "/var/lib/k0s/kubelet/plugins_registry"),
        ("plugins", "DRA_DRIVER_PLUGINS_DIR", "/var/lib/k0s/kubelet/plugins"),
    ):
        assert volumes[name]["hostPath"]["path"] == mounts[name]["mountPath"] == env[variable] == path
    assert "priorityClassName" not in pod
    assert (env["DRA_DRIVER_LOG_FORMAT"], env["DRA_DRIVER_VERBOSITY"]) == ("console", "4")
    assert env["DRA_DRIVER_METRICS_ADDRESS"] == ":9500"
    assert container["ports"][0]["containerPort"] == 9500
    assert daemon_set["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}


def test_the_command_reads_node_files_into_config_maps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "node.yaml").write_text(SIMULATED_NODE)
    (tmp_path / "config.yaml").write_text(NODE_CONFIG)
    (tmp_path / "vgpu.yaml").write_text(VGPU_CONFIG)
    argv = ["manifests", "--name", "gpus", "--hardware", f"simulated:{tmp_path / 'node.yaml'}"]
    argv += ["--max-surge", "0", "--node-config", str(tmp_path / "config.yaml")]
    argv += ["--node-config", f"vgpu={tmp_path / 'vgpu.yaml'}"]
    argv += ["--hami-core-library", "/usr/local/vgpu/libvgpu.so", "--driver-root", "/run/nvidia/driver"]
    argv += ["--registrar-dir", EVERYTHING.registrar_dir, "--plugins-dir", EVERYTHING.plugins_dir]
    argv += ["--priority-class-name", "", "--log-verbosity", "4", "--log-format", "console"]
    argv += ["--metrics-port", "9500", "--env", "MOCK_NVML_NODE=/run/mock-nvidia/node.txt", "--env", "EMPTY="]
    assert main(argv) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == render(EVERYTHING)


def test_an_unreadable_node_file_exits_2_naming_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["manifests", "--node-config", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err.startswith("dra-driver manifests: --node-config default: cannot read")
    assert main(["manifests", "--node-config", f"mig={tmp_path / 'missing.yaml'}"]) == 2
    assert capsys.readouterr().err.startswith("dra-driver manifests: --node-config mig: cannot read")
    assert main(["manifests", "--hardware", f"simulated:{tmp_path / 'missing.yaml'}"]) == 2
    assert capsys.readouterr().err.startswith("dra-driver manifests: --hardware: cannot read")


@pytest.mark.parametrize(
    ("argument", "config", "expected"),
    [
        ("{name}", "default:\n  mode: [mig-dynamic\n", "--node-config default: not valid YAML: "),
        ("mig={name}", "gpus:\n  - index: 0\n   mode: x\n", "--node-config mig: not valid YAML: "),
        ("{name}", "default:\n  mode: warp-drive\n", "--node-config default: node config 'default': "),
        ("mig={name}", "gpus:\n  - {index: -1}\n", "--node-config mig: node config 'mig': gpus[0]"),
        ("{name}", "defaults: {}\n", "--node-config default: node config 'default': "),
    ],
    ids=["bad-yaml", "bad-yaml-named", "unknown-mode", "bad-index", "unknown-field"],
)
def test_a_broken_node_config_exits_2_instead_of_being_installed(
    argument: str, config: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config)

    assert main(["manifests", "--node-config", argument.format(name=path)]) == 2

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"dra-driver manifests: {expected}"), captured.err
    assert captured.err.count("\n") == 1, "one line"


def test_the_same_config_name_twice_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.yaml").write_text(NODE_CONFIG)

    assert (
        main(["manifests", "--node-config", f"a={tmp_path}/a.yaml", "--node-config", f"a={tmp_path}/a.yaml"])
        == 2
    )
    assert "--node-config: the config 'a' is given twice" in capsys.readouterr().err


def test_an_unknown_simulated_profile_exits_2_listing_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["manifests", "--hardware", "simulated:dgx-h10"]) == 2

    error = capsys.readouterr().err
    assert error.startswith("dra-driver manifests: --hardware: unknown simulated node profile 'dgx-h10'")
    assert "dgx-h100" in error.partition("known profiles:")[2]


@pytest.mark.parametrize(
    "node",
    ["gpus:\n  - model: H100-SXM9\n    count: 2\n", "gpus: [\n", "gpu: []\n"],
    ids=["model", "yaml", "field"],
)
def test_a_broken_simulated_node_file_exits_2(
    node: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "node.yaml").write_text(node)

    assert main(["manifests", "--hardware", f"simulated:{tmp_path / 'node.yaml'}"]) == 2

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("dra-driver manifests: --hardware: "), captured.err
    assert captured.err.count("\n") == 1


def test_a_node_config_argument_is_a_file_or_a_named_config_and_a_bad_name_is_refused() -> None:
    assert split_node_config_argument("configs/mig.yaml") == ("default", "configs/mig.yaml")
    assert split_node_config_argument("mig=configs/mig.yaml") == ("mig", "configs/mig.yaml")
    assert split_node_config_argument("/tmp/a=b.yaml") == ("default", "/tmp/a=b.yaml")
    for bad, said in (("mig=", "names no file after the '='"), ("bad!name=FILE", "config name 'bad!name'")):
        with pytest.raises(ManifestError, match=said):
            split_node_config_argument(bad)


# --- Two installations side by side -------------------------------------------------------------


def _identities(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (item["kind"], item["metadata"].get("namespace", ""), item["metadata"]["name"]) for item in objects
    }


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


@pytest.mark.parametrize("namespace", ["dra-driver", "gpu-system"], ids=["same-namespace", "other-namespace"])
def test_two_installations_with_other_names_share_no_object(namespace: str) -> None:
    first = render(ManifestOptions(node_configs={"default": NODE_CONFIG}, simulated_node=None))
    second = render(
        ManifestOptions(
            name="gpus-b",
            driver_name="gpu.b.example.com",
            namespace=namespace,
            node_configs={"default": NODE_CONFIG},
            hami_core_library="/usr/local/vgpu/libvgpu.so",
        )
    )
    shared = _identities(first) & _identities(second)
    first_set, second_set = only(first, "DaemonSet"), only(second, "DaemonSet")

    # Only the namespace they may share, which both render the same way.
    assert shared == ({("Namespace", "", "dra-driver")} if namespace == "dra-driver" else set())
    for one, other in ((first_set, second_set), (second_set, first_set)):
        assert not _selects(
            one["spec"]["selector"]["matchLabels"], other["spec"]["template"]["metadata"]["labels"]
        )
    paths = [
        {
            volume["hostPath"]["path"]
            for volume in ds["spec"]["template"]["spec"]["volumes"]
            if "hostPath" in volume and volume["name"] in ("run", "hami-core-dir")
        }
        for ds in (first_set, second_set)
    ]
    assert not paths[0] & paths[1], "each installation has its own host directories"


def test_an_installation_name_must_fit_the_names_made_from_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["manifests", "--name", "x" * 49]) == 2
    assert capsys.readouterr().err.startswith("dra-driver manifests: --name: ")
    assert render(ManifestOptions(name="x" * 48))


def test_the_command_applies_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["manifests", "--driver-name", OTHER.driver_name, "--image", OTHER.image]
    argv += ["--namespace", OTHER.namespace, "--hardware", OTHER.hardware]
    argv += ["--node-selector", "example.com/accelerator=nvidia", "--node-selector", "pool="]
    assert main(argv) == 0

    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == render(OTHER)
    assert only(printed, "Namespace")["metadata"]["name"] == "gpu-system"
    assert only(printed, "ClusterRole")["metadata"]["name"].startswith("gpu.example.com")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--driver-name", "GPU.Example.com"),
        ("--driver-name", 'gpu" || true || "'),
        ("--namespace", "gpu.system"),
        ("--namespace", "-x"),
        ("--node-selector", "no-equals-sign"),
        ("--node-selector", "bad key=x"),
        ("--node-selector", "example.com/ok=bad value"),
        ("--node-selector", "Not_A.Domain/key=x"),
        ("--hardware", "cuda"),
        ("--image", "has space:1"),
        ("--hami-core-library", "libvgpu.so"),
        ("--driver-root", "run/nvidia/driver"),
        ("--driver-root", "/run/nvidia/driver/"),
        ("--driver-root", ""),
        ("--registrar-dir", "plugins_registry"),
        ("--plugins-dir", "/var/lib/kubelet//plugins"),
        ("--priority-class-name", "Critical"),
        ("--log-verbosity", "11"),
        ("--log-format", "text"),
        ("--metrics-port", "0"),
        ("--usage-interval", "3601"),
        ("--usage-interval", "-1"),
        ("--name", "Dra_Driver"),
        ("--env", "NO_EQUALS_SIGN"),
        ("--env", "1ST=x"),
        ("--env", "A B=x"),
        ("--env", "DRA_DRIVER_ROOT=/elsewhere"),
    ],
)
def test_a_bad_option_exits_2_naming_its_flag(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["manifests", f"{flag}={value}"]) == 2

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"dra-driver manifests: {flag}"), captured.err


def test_the_command_sets_up_usage_metrics_as_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["manifests", "--usage-interval", "30", "--usage-processes"]) == 0

    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == render(ManifestOptions(usage_interval=30, usage_processes=True))
    pod = only(printed, "DaemonSet")["spec"]["template"]["spec"]
    env = {entry["name"]: entry.get("value") for entry in pod["containers"][0]["env"]}
    assert (pod["hostPID"], env["DRA_DRIVER_USAGE_INTERVAL"], env["DRA_DRIVER_USAGE_PROCESSES"]) == (
        True,
        "30",
        "true",
    )


def test_records_are_flushed_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    def agent_env(options: ManifestOptions) -> dict[str, str | None]:
        container = only(render(options), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
        return {entry["name"]: entry.get("value") for entry in container["env"]}

    assert "DRA_DRIVER_FLUSH_RECORDS" not in agent_env(ManifestOptions())
    assert main(["manifests", "--flush-records"]) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == render(ManifestOptions(flush_records=True))
    assert agent_env(ManifestOptions(flush_records=True))["DRA_DRIVER_FLUSH_RECORDS"] == "true"


def test_render_refuses_bad_options_itself() -> None:
    """A caller building options in Python gets the same checks as the command."""
    with pytest.raises(ManifestError, match="--node-selector"):
        render(ManifestOptions(node_selector={"a=b": "c"}))
    with pytest.raises(ManifestError, match="--driver-name"):
        render(ManifestOptions(driver_name=""))
    with pytest.raises(ManifestError, match="--max-surge"):
        render(ManifestOptions(max_surge=2))
    with pytest.raises(ManifestError, match="--hardware: a simulated node file needs simulated hardware"):
        render(ManifestOptions(simulated_node=SIMULATED_NODE))
    assert parse_node_selector(["a=1", "example.com/b="]) == {"a": "1", "example.com/b": ""}
    with pytest.raises(ManifestError, match="--env: DRA_DRIVER_HOST_ROOT is set by the installation itself"):
        render(ManifestOptions(extra_env={"DRA_DRIVER_HOST_ROOT": "/"}))
    assert parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}


# --- Extended resources backed by DRA (--extended-resources) ---------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--extended-resources"], "--extended-resources: needs Kubernetes 1.36 or later, where the "),
        (
            ["--extended-resources", "--kubernetes-version", "1.35"],
            "--extended-resources: needs Kubernetes 1.36",
        ),
        (
            ["--kubernetes-version", "v1.36"],
            "--kubernetes-version: 'v1.36' is not a Kubernetes version MAJOR.MINOR",
        ),
        (["--extended-mig-profile", "1g.10gb"], "--extended-mig-profile: only with --extended-resources"),
        (
            ["--extended-resources", "--kubernetes-version", "1.36", "--extended-mig-profile", "1g.10GB"],
            "--extended-mig-profile: '1g.10GB' is not a MIG profile name",
        ),
    ],
    ids=["no-version", "1.35", "bad-version", "profile-alone", "bad-profile"],
)
def test_extended_resources_the_cluster_cannot_serve_exit_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["manifests", *argv]) == 2

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"dra-driver manifests: {expected}"), captured.err
    assert captured.err.count("\n") == 1, "one line"


def test_extended_resources_add_the_device_plugin_names_to_the_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "vgpu.yaml").write_text(
        "default: {mode: vgpu-partitions, vgpu: {partitions: [{memory: 10Gi}, {memory: 4096Mi}]}}\n"
    )
    argv = ["manifests", "--extended-resources", "--kubernetes-version", "1.36"]
    argv += ["--node-config", str(tmp_path / "vgpu.yaml"), "--extended-mig-profile", "1g.10gb"]

    assert main(argv) == 0

    classes = [item for item in yaml.safe_load_all(capsys.readouterr().out) if item["kind"] == "DeviceClass"]
    assert [(c["metadata"]["name"], c["spec"].get("extendedResourceName")) for c in classes] == [
        ("gpu.dra-driver.dev", "nvidia.com/gpu"),
        ("mig.dra-driver.dev", None),
        ("vgpu.dra-driver.dev", None),
        ("gpu-time-sliced.dra-driver.dev", None),
        ("gpu-mps.dra-driver.dev", None),
        ("mig-1g.10gb.dra-driver.dev", "nvidia.com/mig-1g.10gb"),
        ("vgpu-4gi.dra-driver.dev", "nvidia.com/vgpu-4gi"),
        ("vgpu-10gi.dra-driver.dev", "nvidia.com/vgpu-10gi"),
    ]
    for item in classes:
        for version in ("1.36.0", "1.37.0"):
            kubernetes_validate.validate(item, version, strict=True)
