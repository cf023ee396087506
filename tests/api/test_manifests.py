"""The install manifests (`dra-driver manifests`, deploy/dra-driver.yaml).

The admission policy's CEL is run by the real CEL engine (cel-expr-python) against admission
requests shaped like the API server's, because a policy that is wrong in the permissive direction
fails silently: nothing in a working cluster would show that one node's agent can write another's
slices.
"""

from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cel_expr_python import cel

from dra_driver import DEFAULT_DRIVER_NAME, __version__
from dra_driver.cli import main
from dra_driver.devices.classes import device_classes
from dra_driver.manifests import (
    NODE_NAME_EXTRA,
    ManifestError,
    ManifestOptions,
    parse_node_selector,
    render,
    render_yaml,
    service_account_username,
)
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
SIMULATED_NODE = "gpus:\n  - model: H100-SXM5-80GB\n    count: 2\n"
EVERYTHING = ManifestOptions(
    hardware="simulated:node.yaml",
    max_surge=0,
    node_config=NODE_CONFIG,
    simulated_node=SIMULATED_NODE,
    hami_core_library="/usr/local/vgpu/libvgpu.so",
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
        "DaemonSet",
        "DeviceClass",
        "DeviceClass",
        "DeviceClass",
    ]
    assert render(OTHER)[-3:] == device_classes(OTHER.driver_name)


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
        ("", "nodes", "get"),
        *(
            ("resource.k8s.io", "resourceslices", verb)
            for verb in ("get", "list", "watch", "create", "update", "delete")
        ),
        ("", "events", "create"),
    }
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])
    assert "*" not in str(role["rules"])
    binding = only(objects, "ClusterRoleBinding")
    account = only(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": options.namespace}
    ]
    assert account["metadata"]["namespace"] == options.namespace


# --- The admission policy, evaluated ------------------------------------------------------------

_MAP = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)


@cache
def _environment() -> cel.Env:
    """`request`, `object`, `oldObject` and `variables` as maps, as the API server binds them
    (with typed objects there; the expressions read the same fields)."""
    return cel.NewEnv(
        variables={"request": _MAP, "object": cel.Type.DYN, "oldObject": cel.Type.DYN, "variables": _MAP}
    )


def _evaluate(expression: str, data: dict[str, Any]) -> Any:
    result = _environment().compile(expression).eval(data=data)
    assert result.type() != cel.Type.ERROR, f"{expression!r} failed: {result.value()}"
    return result.value()


def admit(policy: dict[str, Any], request: dict[str, Any]) -> tuple[bool, list[str]]:
    """What the API server decides: (allowed, the denial messages), as the policy's match
    conditions, variables and validations say."""
    spec = policy["spec"]
    operation = request["operation"]
    data: dict[str, Any] = {
        "request": request,
        "object": None if operation == "DELETE" else request["object"],
        "oldObject": None if operation == "CREATE" else request["oldObject"],
        "variables": {},
    }
    rules = spec["matchConstraints"]["resourceRules"]
    if not any(operation in rule["operations"] and "resourceslices" in rule["resources"] for rule in rules):
        return True, []
    if not all(_evaluate(condition["expression"], data) for condition in spec["matchConditions"]):
        return True, []
    for variable in spec.get("variables", []):
        data["variables"] = {**data["variables"], variable["name"]: _evaluate(variable["expression"], data)}
    denials = []
    for validation in spec["validations"]:
        if _evaluate(validation["expression"], data) is not True:
            if "messageExpression" in validation:
                denials.append(_evaluate(validation["messageExpression"], data))
            else:
                denials.append(validation["message"])
    return not denials, denials


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
    extra = (
        {NODE_NAME_EXTRA: [node], "authentication.kubernetes.io/pod-name": ["dra-driver-x"]} if node else {}
    )
    return {
        "operation": operation,
        "userInfo": {"username": service_account_username(namespace), "extra": extra},
        "object": new,
        "oldObject": old,
    }


POLICY = only(render(ManifestOptions()), "ValidatingAdmissionPolicy")


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
    other_policy = only(render(OTHER), "ValidatingAdmissionPolicy")
    allowed, _ = admit(other_policy, request("CREATE", slice_on("node-b"), None, namespace="gpu-system"))
    assert not allowed
    binding = only(render(OTHER), "ValidatingAdmissionPolicyBinding")
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
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}, "sockets named per pod"
    assert env["DRA_DRIVER_NAME"] == "gpu.example.com"
    assert env["DRA_DRIVER_HARDWARE"] == "simulated:dgx-h100"
    assert env["DRA_DRIVER_ROOT"] == "/driver-root"
    assert env["DRA_DRIVER_MPS_DIR"].startswith(volumes["run"]["path"] + "/")
    assert container["securityContext"] == {"privileged": True}
    assert container["ports"] == [{"name": "metrics", "containerPort": 9477, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    # The new agent pod starts next to the old one: the node never stops preparing claims.
    assert daemon_set["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert "DRA_DRIVER_NODE_CONFIG" not in env and "DRA_DRIVER_HAMI_CORE_LIBRARY" not in env
    assert objects_of_kind(render(OTHER), "ConfigMap") == []
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert volumes["driver-root"]["path"] == "/run/nvidia/driver"
    assert mounts["driver-root"]["readOnly"] is True
    for path in ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins", "/var/run/cdi", "/dev"):
        (name,) = [name for name, volume in volumes.items() if volume["path"] == path]
        assert mounts[name]["mountPath"] == path, "kubelet and the runtime see these paths as the agent does"
    assert set(mounts) == set(volumes)


def test_node_files_hami_core_and_one_after_the_other_updates_when_asked() -> None:
    objects = render(EVERYTHING)
    config_map = only(objects, "ConfigMap")
    daemon_set = only(objects, "DaemonSet")
    pod = daemon_set["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}

    assert [item["kind"] for item in objects[:2]] == ["Namespace", "ConfigMap"]
    assert config_map["data"] == {"node-config.yaml": NODE_CONFIG, "simulated-node.yaml": SIMULATED_NODE}
    assert volumes["node-files"]["configMap"]["name"] == config_map["metadata"]["name"]
    files_dir = mounts["node-files"]["mountPath"]
    assert env["DRA_DRIVER_NODE_CONFIG"] == f"{files_dir}/node-config.yaml"
    assert env["DRA_DRIVER_HARDWARE"] == f"simulated:{files_dir}/simulated-node.yaml"
    assert env["DRA_DRIVER_HAMI_CORE_LIBRARY"] == "/usr/local/vgpu/libvgpu.so"
    for name in ("hami-core-library", "hami-core-dir"):
        assert mounts[name]["mountPath"] == volumes[name]["hostPath"]["path"], "host paths, as CDI names them"
    assert volumes["hami-core-dir"]["hostPath"]["path"] == env["DRA_DRIVER_HAMI_CORE_DIR"]
    assert mounts["hami-core-library"]["readOnly"] is True
    assert daemon_set["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}


def test_the_command_reads_node_files_into_the_config_map(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "node.yaml").write_text(SIMULATED_NODE)
    (tmp_path / "config.yaml").write_text(NODE_CONFIG)
    argv = ["manifests", "--hardware", f"simulated:{tmp_path / 'node.yaml'}", "--max-surge", "0"]
    argv += [
        "--node-config",
        str(tmp_path / "config.yaml"),
        "--hami-core-library",
        "/usr/local/vgpu/libvgpu.so",
    ]
    assert main(argv) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    daemon_set = only(printed, "DaemonSet")
    assert printed[1] == only(render(EVERYTHING), "ConfigMap")
    assert daemon_set == only(render(EVERYTHING), "DaemonSet")


def test_an_unreadable_node_file_exits_2_naming_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["manifests", "--node-config", str(tmp_path / "missing.yaml")]) == 2
    assert capsys.readouterr().err.startswith("dra-driver manifests: --node-config: cannot read")
    assert main(["manifests", "--hardware", f"simulated:{tmp_path / 'missing.yaml'}"]) == 2
    assert capsys.readouterr().err.startswith("dra-driver manifests: --hardware: cannot read")


# --- Options and the command ------------------------------------------------------------------


def test_the_command_prints_the_default_rendering(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["manifests"]) == 0

    printed = capsys.readouterr().out
    assert printed == render_yaml(ManifestOptions())
    daemon_set = only(list(yaml.safe_load_all(printed)), "DaemonSet")
    pod = daemon_set["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == f"ghcr.io/dra-driver/dra-driver:{__version__}"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


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
    ],
)
def test_a_bad_option_exits_2_naming_its_flag(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["manifests", f"{flag}={value}"]) == 2

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"dra-driver manifests: {flag}"), captured.err


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
