"""The chart's knobs that operators know from NVIDIA's and HAMi's charts (issue 33, item 4),
installed with real Helm into the stand-in API server, which validates every object against the
upstream schemas as it arrives; the objects are validated again here (kubernetes-validate, every
supported version). With every knob at its default the chart installs what `dra-driver
manifests` renders (tests/api/test_helm_chart.py), so each knob only adds what it says.
"""

from pathlib import Path
from typing import Any

import helm_sdkpy
import pytest

from dra_driver.tools.manifests import ManifestOptions
from tests.api.test_helm_chart import by_identity, install, installed, rendered_by_the_command
from tests.support.apiserver import ApiServer
from tests.support.k8s_schemas import validate_everywhere


@pytest.fixture
def server() -> Any:
    api = ApiServer(install_types=True).start()
    yield api
    api.stop()


async def objects_of(server: ApiServer, tmp_path: Path, values: dict[str, Any]) -> Any:
    await install(server, tmp_path, "dra-driver", "dra-driver", values)
    objects = installed(server, "dra-driver")
    validate_everywhere(objects)
    return {(item["kind"], item["metadata"]["name"]): item for item in objects}


def pod_of(objects: Any, name: str = "dra-driver") -> dict[str, Any]:
    template: dict[str, Any] = objects[("DaemonSet", name)]["spec"]["template"]
    return template


async def test_pod_annotations_and_labels_reach_the_pods_only(server: ApiServer, tmp_path: Path) -> None:
    values = {
        "podAnnotations": {"example.com/scrape": "true"},
        "podLabels": {"team": "gpu", "example.com/tier": "node"},
    }

    objects = await objects_of(server, tmp_path, values)

    template = pod_of(objects)
    assert template["metadata"]["annotations"] == {"example.com/scrape": "true"}
    assert template["metadata"]["labels"] == {
        "app.kubernetes.io/name": "dra-driver",
        "app.kubernetes.io/instance": "dra-driver",
        "team": "gpu",
        "example.com/tier": "node",
    }
    assert "team" not in objects[("DaemonSet", "dra-driver")]["metadata"]["labels"]


async def test_a_pod_label_that_would_change_the_selector_is_refused(
    server: ApiServer, tmp_path: Path
) -> None:
    with pytest.raises(
        helm_sdkpy.InstallError, match=r"podLabels.app.kubernetes.io/instance: set by the chart"
    ):
        await install(
            server, tmp_path, "dra-driver", "dra-driver", {"podLabels": {"app.kubernetes.io/instance": "x"}}
        )


async def test_an_existing_service_account_is_named_everywhere_the_agent_is(
    server: ApiServer, tmp_path: Path
) -> None:
    """create: false installs no account; the DaemonSet, every binding and every admission
    policy that names the agent's identity name the given one instead."""
    values = {"serviceAccount": {"create": False, "name": "gpu-agent"}}

    objects = await objects_of(server, tmp_path, values)

    assert [key for key in objects if key[0] == "ServiceAccount"] == []
    assert pod_of(objects)["spec"]["serviceAccountName"] == "gpu-agent"
    subjects = [
        subject
        for (kind, _), item in objects.items()
        if kind in ("ClusterRoleBinding", "RoleBinding")
        for subject in item["subjects"]
    ]
    assert subjects and {subject["name"] for subject in subjects} == {"gpu-agent"}
    # The policies on the agent's own writes (the claim-shape policy is on every user's claims).
    policies = [
        item
        for (kind, name), item in objects.items()
        if kind == "ValidatingAdmissionPolicy" and not name.endswith("-claim-shapes")
    ]
    identity = "system:serviceaccount:dra-driver:gpu-agent"
    assert len(policies) == 3
    assert all(identity in str(policy["spec"]) for policy in policies)
    assert not any(
        "system:serviceaccount:dra-driver:dra-driver" in str(policy["spec"]) for policy in policies
    )


async def test_a_created_service_account_takes_its_name_and_annotations(
    server: ApiServer, tmp_path: Path
) -> None:
    annotations = {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/gpu"}
    values = {"serviceAccount": {"name": "gpu-agent", "annotations": annotations}}

    objects = await objects_of(server, tmp_path, values)

    assert objects[("ServiceAccount", "gpu-agent")]["metadata"]["annotations"].items() >= annotations.items()
    assert pod_of(objects)["spec"]["serviceAccountName"] == "gpu-agent"


async def test_no_account_and_no_name_is_refused(server: ApiServer, tmp_path: Path) -> None:
    with pytest.raises(
        helm_sdkpy.InstallError, match=r"serviceAccount\.name: needed when serviceAccount\.create is false"
    ):
        await install(server, tmp_path, "dra-driver", "dra-driver", {"serviceAccount": {"create": False}})


async def test_security_contexts_can_be_added_to_and_privileged_stays(
    server: ApiServer, tmp_path: Path
) -> None:
    values = {
        "podSecurityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "securityContext": {"seLinuxOptions": {"type": "spc_t"}},
    }

    objects = await objects_of(server, tmp_path, values)

    spec = pod_of(objects)["spec"]
    (container,) = spec["containers"]
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    # Helm merges the map given into the default one: privileged stays unless set false.
    assert container["securityContext"] == {"privileged": True, "seLinuxOptions": {"type": "spc_t"}}


async def test_the_default_container_is_privileged(server: ApiServer, tmp_path: Path) -> None:
    (container,) = pod_of(await objects_of(server, tmp_path, {}))["spec"]["containers"]

    assert container["securityContext"] == {"privileged": True}


async def test_the_full_name_override_is_the_commands_name(server: ApiServer, tmp_path: Path) -> None:
    """fullnameOverride names what --name names: the same objects as `manifests --name gpus`."""
    await install(server, tmp_path, "dra-driver", "dra-driver", {"fullnameOverride": "gpus"})

    objects = installed(server, "dra-driver")
    validate_everywhere(objects)
    assert by_identity(objects) == rendered_by_the_command(ManifestOptions(name="gpus"))


async def test_the_name_override_is_the_app_label(server: ApiServer, tmp_path: Path) -> None:
    objects = await objects_of(server, tmp_path, {"nameOverride": "gpu-driver"})

    daemon_set = objects[("DaemonSet", "dra-driver")]
    assert daemon_set["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "gpu-driver",
        "app.kubernetes.io/instance": "dra-driver",
    }
    assert {item["metadata"]["labels"]["app.kubernetes.io/name"] for item in objects.values()} == {
        "gpu-driver"
    }


async def test_a_too_long_full_name_override_is_refused_by_its_name(
    server: ApiServer, tmp_path: Path
) -> None:
    with pytest.raises(helm_sdkpy.InstallError, match="fullnameOverride"):
        await install(server, tmp_path, "dra-driver", "dra-driver", {"fullnameOverride": "x" * 49})


async def test_extra_volumes_and_mounts_come_after_the_agents_own(server: ApiServer, tmp_path: Path) -> None:
    values = {
        "extraVolumes": [{"name": "ca", "configMap": {"name": "ca-bundle"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/extra", "readOnly": True}],
    }

    objects = await objects_of(server, tmp_path, values)

    spec = pod_of(objects)["spec"]
    (container,) = spec["containers"]
    assert spec["volumes"][-1] == {"name": "ca", "configMap": {"name": "ca-bundle"}}
    assert container["volumeMounts"][-1] == {"name": "ca", "mountPath": "/etc/ssl/extra", "readOnly": True}
    default = rendered_by_the_command(ManifestOptions())[("DaemonSet", "dra-driver", "dra-driver")]
    default_spec = default["spec"]["template"]["spec"]
    assert spec["volumes"][:-1] == default_spec["volumes"]
    assert container["volumeMounts"][:-1] == default_spec["containers"][0]["volumeMounts"]


async def test_the_global_image_registry_is_in_front_of_the_repository(
    server: ApiServer, tmp_path: Path
) -> None:
    """Accepted and ignored before issue 33; now the agent and its MPS daemons pull from it."""
    values = {"global": {"imageRegistry": "registry.example.com:5000/mirror/"}, "image": {"tag": "1.2.3"}}

    objects = await objects_of(server, tmp_path, values)

    (container,) = pod_of(objects)["spec"]["containers"]
    env = {entry["name"]: entry.get("value") for entry in container["env"]}
    expected = "registry.example.com:5000/mirror/dra-driver:1.2.3"
    assert (container["image"], env["DRA_DRIVER_MPS_DAEMON_IMAGE"]) == (expected, expected)


async def test_openshift_grants_the_agent_the_privileged_scc(server: ApiServer, tmp_path: Path) -> None:
    values = {"openshift": {"enabled": True}, "serviceAccount": {"name": "gpu-agent"}}

    objects = await objects_of(server, tmp_path, values)

    role = objects[("ClusterRole", "gpu.dra-driver.dev-openshift-scc")]
    binding = objects[("ClusterRoleBinding", "gpu.dra-driver.dev-openshift-scc")]
    assert role["rules"] == [
        {
            "apiGroups": ["security.openshift.io"],
            "resources": ["securitycontextconstraints"],
            "resourceNames": ["privileged"],
            "verbs": ["use"],
        }
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-agent", "namespace": "dra-driver"}]


async def test_no_openshift_objects_by_default(server: ApiServer, tmp_path: Path) -> None:
    objects = await objects_of(server, tmp_path, {})

    assert not [key for key in objects if key[1].endswith("-openshift-scc")]


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"podLabels": {"bad key!": "x"}}, "at '/podLabels': additional properties 'bad key!'"),
        ({"podAnnotations": {"a": 1}}, "/podAnnotations/a"),
        ({"serviceAccount": {"name": "Bad_Name"}}, "/serviceAccount/name"),
        ({"serviceAccount": {"craete": True}}, "/serviceAccount"),
        ({"nameOverride": "Bad"}, "/nameOverride"),
        ({"extraVolumes": [{"hostPath": {"path": "/x"}}]}, "/extraVolumes/0"),
        ({"extraVolumeMounts": [{"name": "x", "mountPath": "relative"}]}, "/extraVolumeMounts/0/mountPath"),
        ({"global": {"imageRegistry": "has space"}}, "/global/imageRegistry"),
        ({"openshift": {"enabled": "yes"}}, "/openshift/enabled"),
    ],
)
async def test_the_schema_refuses_malformed_knobs(
    values: dict[str, Any], where: str, server: ApiServer, tmp_path: Path
) -> None:
    with pytest.raises(helm_sdkpy.InstallError) as refused:
        await install(server, tmp_path, "dra-driver", "dra-driver", values)

    assert where in str(refused.value), str(refused.value)


async def test_the_notes_say_nothing_of_building_behind_a_registry(server: ApiServer, tmp_path: Path) -> None:
    result = await install(
        server, tmp_path, "dra-driver", "dra-driver", {"global": {"imageRegistry": "mirror.example.com"}}
    )

    assert "docker build" not in result["info"]["notes"]
