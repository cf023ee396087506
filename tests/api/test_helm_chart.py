"""The Helm chart (deploy/helm/dra-driver), through real Helm: the Helm 4 Go library that
helm-sdkpy wraps lints it and installs it into the stand-in API server.

The stand-in serves discovery and the kinds the chart creates, and validates each object against
the upstream schemas as it arrives (kubernetes-validate, strict), so an install that succeeds has
sent only valid objects. Helm installs by server-side apply (PATCH, the Helm 4 CLI's default) or
client-side apply (POST, the library's default): both are tested. Helm's own release records
(Secrets, sent as protobuf) the stand-in keeps as sent and lists back by labels
(tests/support/release_records.py), so upgrade and uninstall run too; an upgrade is tested after a
server-side apply install only, because the stand-in re-applies for a sole field manager but does
not do the strategic-merge patches of a client-side apply upgrade.

The objects installed are compared with `dra-driver manifests` for the same settings
(`chart_values` maps one to the other), so the chart and the command cannot drift apart.
"""

import copy
import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from dra_driver import __version__
from dra_driver.devices.node_config import MODES
from dra_driver.devices.order import PackingPolicy
from dra_driver.hardware.simulated_nodes import node_profiles
from dra_driver.tools.manifests import LOG_FORMATS, ManifestOptions, chart_values, render
from tests.e2e.deploy import e2e_chart_values, e2e_manifests
from tests.support.apiserver import INSTALL_RESOURCE_TYPES, ApiServer
from tests.support.k8s_schemas import validate_everywhere

try:
    import helm_sdkpy
except ImportError as missing:  # a missing Helm fails these tests rather than skipping them
    raise ImportError(
        "helm-sdkpy is not installed: `make .venv/.installed` installs it "
        "(pip install --ignore-requires-python helm-sdkpy==0.1.32)"
    ) from missing

REPOSITORY = Path(__file__).resolve().parents[2]
CHART = REPOSITORY / "deploy" / "helm" / "dra-driver"
# Helm's lint severities (helm.sh/helm/v4/pkg/chart/v2/lint/support).
INFO, WARNING, ERROR = 1, 2, 3
# What Helm adds to every object, and what the chart adds for Helm; the command has neither.
HELM_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")
HELM_ANNOTATIONS = ("meta.helm.sh/release-name", "meta.helm.sh/release-namespace")
SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation")
YAML_KEYS_OF = {"-node-configs", "-simulated-node"}

NODE_CONFIG = "# MIG everywhere\ndefault:\n  mode: mig-dynamic\n"
VGPU_CONFIG = "gpus:\n  - {index: 0, mode: vgpu-capacity}\n"
SIMULATED_NODE = "gpus:\n  - model: H100-SXM5-80GB\n    count: 2\n"
PARTITIONS_CONFIG = (
    "default:\n  mode: vgpu-partitions\n  vgpu:\n"
    "    partitions: [{memory: 10Gi}, {memory: 5120Mi, cores: 25}]\n"
    "gpus:\n  - model: L4\n    mode: vgpu-partitions\n    vgpu:\n"
    "      partitions: [{memory: 1073741824}, {memory: 1536Mi}, {memory: 10240Mi}]\n"
)
SETTINGS = {
    "defaults": ManifestOptions(),
    "extended-resources": ManifestOptions(
        kubernetes_version="1.36",
        extended_resources=True,
        node_configs={"default": NODE_CONFIG, "partitions": PARTITIONS_CONFIG},
    ),
    "extended-resources-chosen": ManifestOptions(
        driver_name="gpu.b.example.com",
        kubernetes_version="1.37",
        extended_resources=True,
        extended_mig_profiles=("3g.40gb", "1g.10gb+me", "1g.10gb"),
    ),
    "other-names": ManifestOptions(
        name="gpus-b",
        driver_name="gpu.b.example.com",
        namespace="gpu-system",
        image="registry.example.com:5000/gpu/dra:1.2.3",
        hardware="simulated:dgx-h100",
        node_selector={"example.com/accelerator": "nvidia"},
    ),
    "node-configs": ManifestOptions(node_configs={"default": NODE_CONFIG, "vgpu": VGPU_CONFIG}),
    "gpu-operator": ManifestOptions(driver_root="/run/nvidia/driver", priority_class_name=""),
    "everything": ManifestOptions(
        name="gpus",
        hardware="simulated:node.yaml",
        simulated_node=SIMULATED_NODE,
        max_surge=0,
        node_configs={"default": NODE_CONFIG},
        hami_core_library="/usr/local/vgpu/libvgpu.so",
        registrar_dir="/var/lib/k0s/kubelet/plugins_registry",
        plugins_dir="/var/lib/k0s/kubelet/plugins",
        log_verbosity=5,
        log_format="console",
        metrics_port=9500,
        extra_env={"MOCK_NVML_NODE": "/run/mock-nvidia/node.txt", "EMPTY": ""},
    ),
}


@pytest.fixture
def server() -> Iterator[ApiServer]:
    api = ApiServer(install_types=True).start()
    yield api
    api.stop()


def helm_config(server: ApiServer, namespace: str, tmp_path: Path) -> helm_sdkpy.Configuration:
    kubeconfig = server.write_kubeconfig(tmp_path / f"kubeconfig-{server.port}")
    return helm_sdkpy.Configuration(namespace=namespace, kubeconfig=str(kubeconfig))


async def install(
    server: ApiServer,
    tmp_path: Path,
    release: str,
    namespace: str,
    values: dict[str, Any],
    server_side_apply: bool = True,
) -> dict[str, Any]:
    """Server-side apply by default, as the Helm 4 CLI installs."""
    config = helm_config(server, namespace, tmp_path)
    action = helm_sdkpy.Install(config).run(
        release, str(CHART), values=values, wait=False, timeout=30, server_side_apply=server_side_apply
    )
    result: dict[str, Any] = await action
    return result


def installed(server: ApiServer, release: str) -> list[dict[str, Any]]:
    """What the stand-in stored for one release (Helm annotates each object with it)."""
    return [
        item
        for rtype in INSTALL_RESOURCE_TYPES
        for item in server.objects(rtype.plural)
        if item["metadata"].get("annotations", {}).get("meta.helm.sh/release-name") == release
    ]


def comparable(item: dict[str, Any]) -> dict[str, Any]:
    """Without what the server and Helm add; node files parsed, because the chart writes them
    with toYaml and the command copies the files as they are (comments included)."""
    item = copy.deepcopy(item)
    metadata = item["metadata"]
    for key in SERVER_METADATA:
        metadata.pop(key, None)
    for key in HELM_ANNOTATIONS:
        metadata.get("annotations", {}).pop(key, None)
    if metadata.get("annotations") == {}:
        del metadata["annotations"]
    for key in HELM_LABELS:
        metadata["labels"].pop(key, None)
    if item["kind"] == "ConfigMap" and any(metadata["name"].endswith(suffix) for suffix in YAML_KEYS_OF):
        item["data"] = {key: yaml.safe_load(text) for key, text in item["data"].items()}
    return item


def by_identity(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {
        (item["kind"], item["metadata"].get("namespace", ""), item["metadata"]["name"]): comparable(item)
        for item in objects
    }


def rendered_by_the_command(options: ManifestOptions) -> dict[tuple[str, str, str], dict[str, Any]]:
    return by_identity([item for item in render(options) if item["kind"] != "Namespace"])


async def lint(chart: Path) -> list[dict[str, Any]]:
    config = helm_sdkpy.Configuration(namespace="default")
    linter = helm_sdkpy.Lint(config)  # type: ignore[no-untyped-call]  # its __init__ lacks annotations
    result = await linter.run(str(chart))
    messages: list[dict[str, Any]] = result["Messages"]
    return messages


# --- Lint -----------------------------------------------------------------------------------------


async def test_strict_helm_lint_passes() -> None:
    """Strict: a warning fails as an error does (the library reports severities, not texts)."""
    messages = await lint(CHART)

    assert [message for message in messages if message["Severity"] >= WARNING] == []


async def test_lint_finds_a_broken_template(tmp_path: Path) -> None:
    """Guards the test above: the same chart with an unknown template function fails."""
    broken = tmp_path / "dra-driver"
    shutil.copytree(CHART, broken)
    template = broken / "templates" / "daemonset.yaml"
    template.write_text(template.read_text().replace("| quote", "| no_such_function", 1))

    errors = [message for message in await lint(broken) if message["Severity"] >= ERROR]

    assert [message["Path"] for message in errors] == ["templates/"]


# --- Installed with real Helm, equal to the command's rendering -----------------------------------


@pytest.mark.parametrize("apply", ["ssa", "csa"])
@pytest.mark.parametrize("setting", SETTINGS)
async def test_the_chart_installs_what_the_command_renders(
    setting: str, apply: str, server: ApiServer, tmp_path: Path
) -> None:
    options = SETTINGS[setting]

    result = await install(
        server, tmp_path, options.name, options.namespace, chart_values(options), apply == "ssa"
    )

    assert (result["info"]["status"], result["apply_method"]) == ("deployed", apply)
    objects = installed(server, options.name)
    assert by_identity(objects) == rendered_by_the_command(options)
    validate_everywhere(objects)
    for item in objects:
        labels = item["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == f"dra-driver-{__version__}"


async def test_the_e2e_values_install_the_e2e_rendering(server: ApiServer, tmp_path: Path) -> None:
    """hack/kind-up.sh installs the chart with e2e_chart_values; the API tests check e2e_manifests."""
    image = "dra-driver:e2e-0123456789ab"
    namespace = e2e_manifests(image)[0]["metadata"]["name"]

    await install(server, tmp_path, "dra-driver", namespace, e2e_chart_values(image))

    expected = by_identity([item for item in e2e_manifests(image) if item["kind"] != "Namespace"])
    assert by_identity(installed(server, "dra-driver")) == expected


def test_the_chart_defaults_are_the_command_defaults() -> None:
    """With no values at all the chart installs the default rendering (the test above passes
    chart_values(ManifestOptions()); here values.yaml itself must carry the same settings)."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    expected = chart_values(ManifestOptions())

    for key, value in expected.items():
        if key == "image":
            assert defaults["image"]["repository"] == value["repository"]
            assert defaults["image"]["tag"] in ("", value["tag"])
        elif key == "metrics":
            assert defaults["metrics"]["port"] == value["port"]
        else:
            assert defaults[key] == value, key


async def test_the_defaults_install_the_default_rendering(server: ApiServer, tmp_path: Path) -> None:
    await install(server, tmp_path, "dra-driver", "dra-driver", {})

    assert by_identity(installed(server, "dra-driver")) == rendered_by_the_command(ManifestOptions())


async def test_a_pod_monitor_scrapes_the_agents_when_asked(server: ApiServer, tmp_path: Path) -> None:
    """Off by default (its kind needs the Prometheus Operator's CRD); on, it selects exactly the
    DaemonSet's pods on their metrics port. The rest of the release is unchanged."""
    monitor = {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}}

    await install(server, tmp_path, "dra-driver", "dra-driver", {"metrics": {"podMonitor": monitor}})

    objects = installed(server, "dra-driver")
    (pod_monitor,) = [item for item in objects if item["kind"] == "PodMonitor"]
    (daemon_set,) = [item for item in objects if item["kind"] == "DaemonSet"]
    ports = daemon_set["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert pod_monitor["metadata"]["namespace"] == "dra-driver"
    assert pod_monitor["metadata"]["labels"]["release"] == "prometheus"
    assert pod_monitor["spec"]["selector"] == daemon_set["spec"]["selector"]
    assert pod_monitor["spec"]["namespaceSelector"] == {"matchNames": ["dra-driver"]}
    assert pod_monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "honorLabels": True}
    ]
    assert [port["name"] for port in ports] == ["metrics"]
    others = [item for item in objects if item["kind"] != "PodMonitor"]
    assert by_identity(others) == rendered_by_the_command(ManifestOptions())


async def test_no_pod_monitor_by_default(server: ApiServer, tmp_path: Path) -> None:
    await install(server, tmp_path, "dra-driver", "dra-driver", {})

    assert server.objects("podmonitors") == []


async def test_namespace_override_puts_the_objects_in_that_namespace(
    server: ApiServer, tmp_path: Path
) -> None:
    await install(server, tmp_path, "dra-driver", "default", {"namespaceOverride": "gpu-system"})

    expected = rendered_by_the_command(ManifestOptions(namespace="gpu-system"))
    assert by_identity(installed(server, "dra-driver")) == expected


async def test_the_chart_only_settings_reach_the_daemon_set(server: ApiServer, tmp_path: Path) -> None:
    """What only the chart sets: pull policy and secrets, tolerations, resources, extra affinity."""
    values = {
        "image": {"repository": "registry.example.com/dra", "tag": "v9", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry-credentials"}],
        "tolerations": [{"operator": "Exists"}],
        "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "1Gi"}},
        "nodeSelector": {"pool": "gpu"},
        "updateStrategy": {"type": "OnDelete", "rollingUpdate": None},
    }

    await install(server, tmp_path, "dra-driver", "dra-driver", values)

    (daemon_set,) = server.objects("daemonsets")
    (account,) = server.objects("serviceaccounts")
    pod = daemon_set["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (container["image"], container["imagePullPolicy"]) == ("registry.example.com/dra:v9", "Always")
    assert pod["imagePullSecrets"] == account["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["tolerations"] == [{"operator": "Exists"}]
    # Helm merges a map into the default one: the memory request stays.
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "64Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert "nodeAffinity" in pod["affinity"], "a nodeSelector narrows the default affinity, ANDed"
    assert daemon_set["spec"]["updateStrategy"] == {"type": "OnDelete"}


async def test_the_notes_say_the_default_image_must_be_built_and_made_pullable(
    server: ApiServer, tmp_path: Path
) -> None:
    result = await install(server, tmp_path, "dra-driver", "dra-driver", {})

    notes = result["info"]["notes"]
    assert f"docker build -t dra-driver:{__version__} ." in notes
    assert "--set image.repository=<registry>/dra-driver" in notes


async def test_the_notes_say_nothing_of_building_for_an_image_elsewhere(
    server: ApiServer, tmp_path: Path
) -> None:
    values = {"image": {"repository": "registry.example.com/gpu/dra-driver"}}

    result = await install(server, tmp_path, "dra-driver", "dra-driver", values)

    notes = result["info"]["notes"]
    assert "docker build" not in notes and "image.repository" not in notes
    assert "installed as release dra-driver" in notes


# --- Two releases side by side ----------------------------------------------------------------------


async def test_two_releases_with_their_own_driver_names_install_side_by_side(
    server: ApiServer, tmp_path: Path
) -> None:
    await install(server, tmp_path, "dra-driver", "dra-driver", {})
    await install(server, tmp_path, "gpus-b", "dra-driver", {"driverName": "gpu.b.example.com"})

    first, second = by_identity(installed(server, "dra-driver")), by_identity(installed(server, "gpus-b"))
    assert first and second and not set(first) & set(second)
    selectors = [
        item["spec"]["selector"]["matchLabels"]
        for item in (*first.values(), *second.values())
        if item["kind"] == "DaemonSet"
    ]
    assert selectors[0] != selectors[1]


async def test_a_second_release_under_the_same_driver_name_is_refused_clearly(
    server: ApiServer, tmp_path: Path
) -> None:
    await install(server, tmp_path, "dra-driver", "dra-driver", {})

    with pytest.raises(helm_sdkpy.InstallError) as refused:
        await install(server, tmp_path, "gpus-b", "other", {})

    message = str(refused.value)
    assert (
        "driverName: gpu.dra-driver.dev is already installed by release dra-driver in namespace dra-driver"
        in message
    )
    assert installed(server, "gpus-b") == []


async def test_an_installation_by_the_command_is_not_taken_over(server: ApiServer, tmp_path: Path) -> None:
    for item in render(ManifestOptions()):
        if item["kind"] == "DeviceClass":
            server.store.objects[("deviceclasses", "", item["metadata"]["name"])] = {
                **item,
                "metadata": {**item["metadata"], "uid": "x", "resourceVersion": "1"},
            }

    with pytest.raises(helm_sdkpy.InstallError, match="not made by Helm"):
        await install(server, tmp_path, "dra-driver", "dra-driver", {})


# --- Upgrade and uninstall --------------------------------------------------------------------------


async def upgrade(
    server: ApiServer, tmp_path: Path, release: str, namespace: str, values: dict[str, Any]
) -> Any:
    """As `helm upgrade` does by default: the apply method the release was installed with."""
    config = helm_config(server, namespace, tmp_path)
    action = helm_sdkpy.Upgrade(config).run(release, str(CHART), values=values, wait=False, timeout=30)
    return await action


def stored(server: ApiServer, release: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The release's objects as stored, server metadata included."""
    return {
        (item["kind"], item["metadata"].get("namespace", ""), item["metadata"]["name"]): item
        for item in installed(server, release)
    }


async def test_an_upgrade_changes_only_what_its_values_change(server: ApiServer, tmp_path: Path) -> None:
    """helm upgrade --set logVerbosity=5: the DaemonSet's environment changes, and no other
    object is written at all (each keeps its resourceVersion)."""
    await install(server, tmp_path, "dra-driver", "dra-driver", {})
    before = stored(server, "dra-driver")

    result = await upgrade(server, tmp_path, "dra-driver", "dra-driver", {"logVerbosity": 5})

    assert (result["version"], result["info"]["status"], result["apply_method"]) == (2, "deployed", "ssa")
    after = stored(server, "dra-driver")
    assert by_identity(list(after.values())) == rendered_by_the_command(ManifestOptions(log_verbosity=5))
    changed = {key for key in before if before[key] != after[key]}
    assert changed == {("DaemonSet", "dra-driver", "dra-driver")}
    old, new = (
        before[("DaemonSet", "dra-driver", "dra-driver")],
        after[("DaemonSet", "dra-driver", "dra-driver")],
    )
    (old_container,), (new_container,) = (
        item["spec"]["template"]["spec"]["containers"] for item in (old, new)
    )
    changed_env = [
        pair for pair in zip(old_container["env"], new_container["env"], strict=True) if pair[0] != pair[1]
    ]
    assert changed_env == [
        ({"name": "DRA_DRIVER_VERBOSITY", "value": "0"}, {"name": "DRA_DRIVER_VERBOSITY", "value": "5"})
    ]
    assert {**old_container, "env": None} == {**new_container, "env": None}
    assert new["metadata"]["uid"] == old["metadata"]["uid"]
    assert new["metadata"]["generation"] == old["metadata"]["generation"] + 1
    history = await helm_sdkpy.History(helm_config(server, "dra-driver", tmp_path)).run("dra-driver")
    assert [(entry["version"], entry["info"]["status"]) for entry in history] == [
        (1, "superseded"),
        (2, "deployed"),
    ]


async def test_uninstall_removes_what_the_install_created_and_leaves_the_slices(
    server: ApiServer, tmp_path: Path
) -> None:
    """Every object of the release goes, with Helm's records; the ResourceSlices the agents
    published are not the release's and stay for `dra-driver cleanup`."""
    values = {
        "nodeConfigs": {"default": {"default": {"mode": "mig-dynamic"}}},
        "metrics": {"podMonitor": {"enabled": True}},
    }
    await install(server, tmp_path, "dra-driver", "dra-driver", values)
    kinds = {item["kind"] for item in installed(server, "dra-driver")}
    published = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu.dra-driver.dev"},
        "spec": {
            "driver": "gpu.dra-driver.dev",
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    status, _ = _request(
        server,
        "POST",
        "/apis/resource.k8s.io/v1/resourceslices",
        json.dumps(published).encode(),
        "application/json",
    )
    assert status == 201

    config = helm_config(server, "dra-driver", tmp_path)
    await helm_sdkpy.Uninstall(config).run("dra-driver", wait=False)

    assert kinds >= {"ConfigMap", "DaemonSet", "DeviceClass", "PodMonitor", "ValidatingAdmissionPolicy"}
    assert installed(server, "dra-driver") == []
    assert [rtype.plural for rtype in INSTALL_RESOURCE_TYPES if server.objects(rtype.plural)] == []
    assert server.release_records == {"dra-driver": {}}
    assert [item["metadata"]["name"] for item in server.objects("resourceslices")] == [
        "node-a-gpu.dra-driver.dev"
    ]


async def test_a_release_installed_again_after_uninstall_is_a_first_install(
    server: ApiServer, tmp_path: Path
) -> None:
    await install(server, tmp_path, "dra-driver", "dra-driver", {})
    await helm_sdkpy.Uninstall(helm_config(server, "dra-driver", tmp_path)).run("dra-driver", wait=False)

    result = await install(server, tmp_path, "dra-driver", "dra-driver", {})

    assert (result["version"], result["info"]["status"]) == (1, "deployed")
    assert by_identity(installed(server, "dra-driver")) == rendered_by_the_command(ManifestOptions())


@pytest.mark.parametrize("version", ["1.34", "1.35"])
async def test_extended_resources_are_refused_below_kubernetes_1_36(version: str, tmp_path: Path) -> None:
    """As `dra-driver manifests --kubernetes-version 1.35 --extended-resources` is: the API
    server of those versions would drop extendedResourceName without a word."""
    server = ApiServer(version=version, install_types=True).start()
    try:
        with pytest.raises(helm_sdkpy.InstallError) as refused:
            await install(
                server, tmp_path, "dra-driver", "dra-driver", {"extendedResources": {"enabled": True}}
            )

        message = str(refused.value)
        assert "extendedResources.enabled: needs Kubernetes 1.36 or later" in message, message
        assert f"this cluster is v{version}.0" in message, message
        assert installed(server, "dra-driver") == []
    finally:
        server.stop()


async def test_the_documented_migration_values_install_an_agent_only_on_labelled_nodes(
    server: ApiServer, tmp_path: Path
) -> None:
    """docs/drafts/extended-resources.md: `--set extendedResources.enabled=true --set-string
    nodeSelector.dra-driver\\.dev/agent=true --set affinity=null`."""
    values = {
        "extendedResources": {"enabled": True},
        "nodeSelector": {"dra-driver.dev/agent": "true"},
        "affinity": None,
    }
    await install(server, tmp_path, "dra-driver", "dra-driver", values)

    objects = by_identity(installed(server, "dra-driver"))
    pod = objects[("DaemonSet", "dra-driver", "dra-driver")]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"dra-driver.dev/agent": "true"}
    assert "affinity" not in pod
    gpu_class = objects[("DeviceClass", "", "gpu.dra-driver.dev")]
    assert gpu_class["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert objects[("DeviceClass", "", "mig-1g.10gb.dra-driver.dev")]["spec"]["extendedResourceName"] == (
        "nvidia.com/mig-1g.10gb"
    )


async def test_a_partition_size_the_chart_cannot_read_is_refused(server: ApiServer, tmp_path: Path) -> None:
    values = {
        "extendedResources": {"enabled": True},
        "nodeConfigs": {
            "odd": {"default": {"mode": "vgpu-partitions", "vgpu": {"partitions": [{"memory": "1.5Gi"}]}}}
        },
    }
    with pytest.raises(
        helm_sdkpy.InstallError, match=r'nodeConfigs.odd: vgpu partition memory \\?"1.5Gi\\?"'
    ):
        await install(server, tmp_path, "dra-driver", "dra-driver", values)


# --- values.schema.json, through Helm ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"logFormat": "text"}, "logFormat"),
        ({"driverRoot": "run/nvidia/driver"}, "driverRoot"),
        ({"driverRoot": "/run/nvidia/driver/"}, "driverRoot"),
        ({"kubeletPluginsDir": "plugins"}, "kubeletPluginsDir"),
        ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"driverName": "GPU.Example.com"}, "driverName"),
        ({"logVerbosity": 11}, "logVerbosity"),
        ({"hamiCore": {"library": "libvgpu.so"}}, "library"),
        ({"nodeConfigs": {"mig": {"defaults": {}}}}, "defaults"),
        ({"nodeConfigs": {"bad name": {}}}, "bad name"),
        ({"nodeConfigs": {"mig": {"default": {"mode": "warp-drive"}}}}, "/nodeConfigs/mig/default/mode"),
        ({"nodeConfigs": {"mig": {"default": {"packing": "tight"}}}}, "/nodeConfigs/mig/default/packing"),
        ({"nodeConfigs": {"mig": {"gpus": [{"index": 0, "uuid": "GPU-1", "mode": "gpu"}]}}}, "oneOf"),
        ({"nodeConfigs": {"mig": {"gpus": [{"mode": "gpu"}]}}}, "oneOf"),
        ({"hardware": "simulated:dgx-h10"}, "hardware"),
        ({"updateStrategy": {"type": "Sometimes"}}, "type"),
        ({"metrics": {"port": 0}}, "port"),
        ({"hardware": "cuda"}, "hardware"),
        ({"nodeSelektor": {}}, "nodeSelektor"),
        ({"extraEnv": [{"name": "1ST", "value": "x"}]}, "name"),
        ({"extraEnv": [{"name": "A", "value": 1}]}, "value"),
        ({"extendedResources": {"enabled": True, "migProfiles": ["1g.10gb+x"]}}, "migProfiles"),
        ({"extendedResources": {"enabled": True, "migProfiles": ["1g.10gb", "1g.10gb"]}}, "migProfiles"),
        ({"extendedResources": {"enabled": "yes", "migProfiles": []}}, "enabled"),
    ],
)
async def test_the_schema_refuses_bad_values(
    values: dict[str, Any], field: str, server: ApiServer, tmp_path: Path
) -> None:
    with pytest.raises(helm_sdkpy.InstallError) as refused:
        await install(server, tmp_path, "dra-driver", "dra-driver", values)

    message = str(refused.value)
    assert "values don't meet the specifications of the schema" in message, message
    assert field in message, message
    assert installed(server, "dra-driver") == []


async def test_a_too_long_release_name_is_refused(server: ApiServer, tmp_path: Path) -> None:
    with pytest.raises(helm_sdkpy.InstallError, match="longer than 48 characters"):
        await install(server, tmp_path, "x" * 49, "dra-driver", {})


def test_the_schema_knows_what_the_agent_knows() -> None:
    """The modes, profiles and log formats the schema allows are the agent's own."""
    properties = json.loads((CHART / "values.schema.json").read_text())["properties"]
    (node_config_schema,) = properties["nodeConfigs"]["patternProperties"].values()
    node_config = node_config_schema["properties"]
    profiles = properties["hardware"]["pattern"].removeprefix("^(nvml|simulated:(").removesuffix("))$")

    assert node_config["default"]["properties"]["mode"]["enum"] == list(MODES)
    assert node_config["gpus"]["items"]["properties"]["mode"]["enum"] == list(MODES)
    for where in (node_config["default"], node_config["gpus"]["items"]):
        assert where["properties"]["packing"]["enum"] == list(get_args(PackingPolicy))
    assert profiles.split("|") == sorted(node_profiles())
    assert properties["logFormat"]["enum"] == list(LOG_FORMATS)


# --- What the stand-in adds for Helm ---------------------------------------------------------------


def _request(server: ApiServer, method: str, path: str, body: bytes, content_type: str) -> tuple[int, Any]:
    request = urllib.request.Request(
        server.url + path, data=body, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_stand_in_creates_by_apply_and_refuses_what_it_cannot_merge(server: ApiServer) -> None:
    """Server-side apply creates a missing object; applying to an existing one (field ownership)
    or another patch type is refused rather than approximated; an invalid object is refused."""
    path = "/api/v1/namespaces/x/configmaps/c"
    config_map = yaml.safe_dump(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}}
    )
    invalid = yaml.safe_dump(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"}, "data": {"a": 1}}
    )

    created, stored = _request(server, "PATCH", path, config_map.encode(), "application/apply-patch+yaml")
    again, _ = _request(server, "PATCH", path, config_map.encode(), "application/apply-patch+yaml")
    merged, _ = _request(server, "PATCH", path, b'{"data": {}}', "application/merge-patch+json")
    refused, status = _request(
        server, "PATCH", "/api/v1/namespaces/x/configmaps/d", invalid.encode(), "application/apply-patch+yaml"
    )

    assert (created, stored["metadata"]["namespace"], stored["data"]) == (201, "x", {"a": "1"})
    assert (again, merged) == (415, 415)
    assert (refused, status["reason"]) == (422, "Invalid")
    assert [item["metadata"]["name"] for item in server.objects("configmaps")] == ["c"]


def test_the_stand_in_re_applies_only_for_the_manager_that_applied(server: ApiServer) -> None:
    """The sole applier's configuration replaces the object (a key it leaves out goes); an apply
    by another manager, or after a PUT took the fields over, would need field ownership."""
    path = "/api/v1/namespaces/x/configmaps/c"
    apply = "application/apply-patch+yaml"

    def config_map(data: dict[str, str]) -> bytes:
        return yaml.safe_dump(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data}
        ).encode()

    _request(server, "PATCH", path + "?fieldManager=helm", config_map({"a": "1", "b": "2"}), apply)
    (created,) = server.objects("configmaps")
    same, _ = _request(server, "PATCH", path + "?fieldManager=helm", config_map({"a": "1", "b": "2"}), apply)
    (unchanged,) = server.objects("configmaps")
    changed, stored = _request(server, "PATCH", path + "?fieldManager=helm", config_map({"a": "3"}), apply)
    other, _ = _request(server, "PATCH", path + "?fieldManager=kubectl", config_map({"a": "4"}), apply)
    put, _ = _request(
        server, "PUT", path, json.dumps({**stored, "data": {"a": "5"}}).encode(), "application/json"
    )
    after_put, _ = _request(server, "PATCH", path + "?fieldManager=helm", config_map({"a": "6"}), apply)

    assert (same, unchanged) == (200, created), "a no-op apply writes nothing"
    assert (changed, stored["data"], stored["metadata"]["uid"]) == (
        200,
        {"a": "3"},
        created["metadata"]["uid"],
    )
    assert stored["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    assert (other, put, after_put) == (415, 200, 415)
    assert server.objects("configmaps")[0]["data"] == {"a": "5"}


def test_the_stand_in_keeps_only_protobuf_release_records(server: ApiServer) -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sh.helm.release.v1.x.v1"}}

    status, answer = _request(
        server, "POST", "/api/v1/namespaces/x/secrets", json.dumps(secret).encode(), "application/json"
    )

    assert (status, answer["reason"]) == (415, "UnsupportedMediaType")
    assert "application/vnd.kubernetes.protobuf" in answer["message"]
    assert server.release_records == {}


def test_the_stand_in_serves_discovery_for_the_install_kinds(server: ApiServer) -> None:
    with urllib.request.urlopen(server.url + "/apis", timeout=10) as response:
        groups = {group["name"] for group in json.loads(response.read())["groups"]}
    with urllib.request.urlopen(server.url + "/apis/apps/v1", timeout=10) as response:
        resources = {item["name"]: item for item in json.loads(response.read())["resources"]}

    assert {"apps", "rbac.authorization.k8s.io", "admissionregistration.k8s.io", "resource.k8s.io"} <= groups
    assert resources["daemonsets"]["namespaced"] is True
    assert resources["daemonsets"]["kind"] == "DaemonSet"


async def test_the_dashboard_and_the_alert_rules_install_when_asked(
    server: ApiServer, tmp_path: Path
) -> None:
    """Both off by default (the rule's kind needs the Prometheus Operator's CRD); on, the dashboard
    ConfigMap carries the Grafana sidecar's label and the file byte for byte, the PrometheusRule the
    rule file's groups. The rest of the release is unchanged."""
    values = {"metrics": {"dashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}}
    await install(server, tmp_path, "dra-driver", "dra-driver", values)

    objects = installed(server, "dra-driver")
    (dashboard,) = [item for item in objects if item["metadata"]["name"] == "dra-driver-dashboard"]
    (rule,) = [item for item in objects if item["kind"] == "PrometheusRule"]
    files = CHART / "files"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["dra-driver-usage.json"] == (
        files / "grafana" / "dra-driver-usage.json"
    ).read_text().rstrip("\n")
    assert rule["spec"] == yaml.safe_load((files / "prometheus" / "dra-driver-rules.yaml").read_text())
    others = [item for item in objects if item is not dashboard and item is not rule]
    assert by_identity(others) == rendered_by_the_command(ManifestOptions())


async def test_no_dashboard_or_alert_rules_by_default(server: ApiServer, tmp_path: Path) -> None:
    await install(server, tmp_path, "dra-driver", "dra-driver", {})

    assert server.objects("prometheusrules") == []
    assert [m for m in server.objects("configmaps") if m["metadata"]["name"].endswith("-dashboard")] == []


async def test_process_attribution_runs_the_agent_in_the_host_pid_namespace(
    server: ApiServer, tmp_path: Path
) -> None:
    """The privilege it costs, in the chart and the command alike: the host PID namespace, and
    the pods' log directories read-only, next to kubelet's PodResources socket."""
    options = ManifestOptions(usage_processes=True)

    await install(server, tmp_path, options.name, options.namespace, chart_values(options))

    assert by_identity(installed(server, options.name)) == rendered_by_the_command(options)
    (daemon_set,) = server.objects("daemonsets")
    pod = daemon_set["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["DRA_DRIVER_USAGE_PROCESSES"] == "true"
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts["/var/log/pods"] is True
    assert mounts["/var/lib/kubelet/pod-resources"] is True


async def test_flushed_records_are_one_value_in_the_chart_and_one_flag_of_the_command(
    server: ApiServer, tmp_path: Path
) -> None:
    options = ManifestOptions(flush_records=True)

    await install(server, tmp_path, options.name, options.namespace, chart_values(options))

    assert by_identity(installed(server, options.name)) == rendered_by_the_command(options)
    (daemon_set,) = server.objects("daemonsets")
    (container,) = daemon_set["spec"]["template"]["spec"]["containers"]
    assert {"name": "DRA_DRIVER_FLUSH_RECORDS", "value": "true"} in container["env"]


async def test_usage_metrics_off_mount_nothing_of_kubelets(server: ApiServer, tmp_path: Path) -> None:
    options = ManifestOptions(usage_interval=0)

    await install(server, tmp_path, options.name, options.namespace, chart_values(options))

    assert by_identity(installed(server, options.name)) == rendered_by_the_command(options)
    (daemon_set,) = server.objects("daemonsets")
    (container,) = daemon_set["spec"]["template"]["spec"]["containers"]
    assert "pod-resources" not in {m["name"] for m in container["volumeMounts"]}
