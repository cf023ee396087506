"""The chart refuses what the decoders refuse (issue 33, item 3), through real Helm.

values.schema.json's node config, simulated node and MIG profile parts are generated from the
decoders' declarations and the GPU catalog (dra_driver/tools/manifests/chart_schema.py); the
first test fails when the committed file is stale. The table below then feeds the same values to
`helm install` and to `dra-driver manifests` (check_options, through the options chart_values is
the inverse of): both must refuse each bad one, the chart naming the value's path, and both must
accept each good one, so the schema is neither looser nor stricter than the decoders.
"""

import json
from pathlib import Path
from typing import Any

import helm_sdkpy
import pytest
import yaml

from dra_driver.tools.manifests import ManifestOptions
from dra_driver.tools.manifests.chart_schema import with_generated_parts
from dra_driver.tools.manifests.options import ManifestError
from dra_driver.tools.manifests.validation import check_options
from tests.api.test_helm_chart import CHART, install, installed
from tests.support.apiserver import ApiServer

REPOSITORY = Path(__file__).resolve().parents[2]
SCHEMA = CHART / "values.schema.json"
PARTITIONS = {"mode": "vgpu-partitions", "vgpu": {"partitions": [{"memory": "10Gi"}]}}


def options_for(values: dict[str, Any]) -> ManifestOptions:
    """The `dra-driver manifests` options that the chart values stand for."""
    extended = values.get("extendedResources", {})
    simulated = values.get("simulatedNode")
    return ManifestOptions(
        node_configs={name: yaml.safe_dump(config) for name, config in values.get("nodeConfigs", {}).items()},
        hardware="simulated:node.yaml" if simulated is not None else "nvml",
        simulated_node=None if simulated is None else yaml.safe_dump(simulated),
        extra_env={entry["name"]: entry["value"] for entry in values.get("extraEnv", [])},
        hami_core_library=values.get("hamiCore", {}).get("library") or None,
        extended_resources=extended.get("enabled", False),
        extended_mig_profiles=tuple(extended.get("migProfiles", ())),
        kubernetes_version="1.36" if extended.get("enabled") else ManifestOptions().kubernetes_version,
    )


def config(**default: Any) -> dict[str, Any]:
    return {"nodeConfigs": {"c": {"default": default}}}


def gpus(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"nodeConfigs": {"c": {"gpus": list(entries)}}}


BAD: list[Any] = [
    pytest.param(
        config(mode="vgpu-partitions", vgpu={"partitions": [{"memory": "-10Gi"}]}),
        "/nodeConfigs/c/default/vgpu/partitions/0/memory",
        id="negative-partition",
    ),
    pytest.param(
        config(mode="vgpu-partitions", vgpu={"partitions": [{"memory": -1073741824}]}),
        "/nodeConfigs/c/default/vgpu/partitions/0/memory",
        id="negative-partition-bytes",
    ),
    pytest.param(
        config(mode="vgpu-partitions", vgpu={"partitions": [{"memory": "10Gi", "cores": 101}]}),
        "/nodeConfigs/c/default/vgpu/partitions/0/cores",
        id="cores-over-100",
    ),
    pytest.param(config(mode="vgpu-partitions"), "/nodeConfigs/c/default", id="partitions-missing"),
    pytest.param(
        config(mode="gpu", vgpu={"memoryStep": "1Gi"}), "/nodeConfigs/c/default", id="vgpu-not-vgpu"
    ),
    pytest.param(
        config(mode="vgpu-capacity", vgpu={"partitions": [{"memory": "1Gi"}]}),
        "/nodeConfigs/c/default",
        id="partitions-in-capacity",
    ),
    pytest.param(
        config(mode="vgpu-capacity", vgpu={"enforcement": "cgroups"}),
        "/nodeConfigs/c/default/vgpu/enforcement",
        id="enforcement",
    ),
    pytest.param(
        config(mode="vgpu-capacity", packing="spread"), "/nodeConfigs/c/default", id="spread-capacity"
    ),
    pytest.param(
        config(mode="mig-static", mig={"profiles": ["1g.10gb"]}), "/nodeConfigs/c/default", id="mig-static"
    ),
    pytest.param(
        config(mode="mig-dynamic", mig={"profiles": ["bogus"]}),
        "/nodeConfigs/c/default/mig/profiles/0",
        id="mig-profile-bogus",
    ),
    pytest.param(
        config(mode="mig-dynamic", mig={"profiles": ["9g.99gb"]}),
        "/nodeConfigs/c/default/mig/profiles/0",
        id="mig-profile-made-up",
    ),
    pytest.param(gpus({"model": "H900", "mode": "gpu"}), "/nodeConfigs/c/gpus/0/model", id="gpu-model"),
    pytest.param(
        gpus({"productName": " ", "mode": "gpu"}), "/nodeConfigs/c/gpus/0/productName", id="product"
    ),
    pytest.param(gpus({"index": -1, "mode": "gpu"}), "/nodeConfigs/c/gpus/0/index", id="index"),
    pytest.param(
        gpus({"index": 0, "mode": "gpu"}, {"index": 0, "mode": "mig-static"}),
        "nodeConfigs.c.gpus[1]: index 0 is already configured by gpus[0]",
        id="duplicate-index",
    ),
    pytest.param(
        gpus({"model": "L4"}, {"model": "L4", "mode": "gpu"}),
        "nodeConfigs.c.gpus[1]: model L4 is already configured by gpus[0]",
        id="duplicate-model",
    ),
    pytest.param(
        {"nodeConfigs": {"bad name!": {}}},
        "at '/nodeConfigs': additional properties 'bad name!'",
        id="config-name",
    ),
    pytest.param(
        {"nodeConfigs": {"-x": {}}}, "at '/nodeConfigs': additional properties '-x'", id="config-name-dash"
    ),
    pytest.param(
        {"nodeConfigs": {"x" * 64: {}}},
        f"at '/nodeConfigs': additional properties '{'x' * 64}'",
        id="config-name-long",
    ),
    pytest.param(
        {"simulatedNode": {"gpus": [{"model": "H900", "count": 1}]}},
        "/simulatedNode/gpus/0/model",
        id="sim-model",
    ),
    pytest.param(
        {"simulatedNode": {"gpus": [{"model": "L4", "count": 17}]}},
        "/simulatedNode/gpus/0/count",
        id="sim-count",
    ),
    pytest.param({"simulatedNode": {"gpus": []}}, "/simulatedNode/gpus", id="sim-empty"),
    pytest.param({"simulatedNode": {"gpu": [{"model": "L4", "count": 1}]}}, "/simulatedNode", id="sim-field"),
    pytest.param(
        {"extendedResources": {"enabled": True, "migProfiles": ["9g.99gb"]}},
        "/extendedResources/migProfiles/0",
        id="extended-mig-made-up",
    ),
    pytest.param(
        {"extendedResources": {"enabled": True, "migProfiles": ["1g.10gb+x"]}},
        "/extendedResources/migProfiles/0",
        id="extended-mig-suffix",
    ),
    pytest.param(
        {"extraEnv": [{"name": "NODE_NAME", "value": "node-a"}]},
        "extraEnv[0].name: NODE_NAME is set by the chart itself",
        id="env-node-name",
    ),
    pytest.param(
        {
            "extraEnv": [{"name": "A", "value": "1"}, {"name": "DRA_DRIVER_HAMI_CORE_DIR", "value": "/x"}],
            "hamiCore": {"library": "/l/libvgpu.so"},
        },
        "extraEnv[1].name: DRA_DRIVER_HAMI_CORE_DIR is set by the chart itself",
        id="env-optional-part",
    ),
]

GOOD: list[Any] = [
    pytest.param(
        {
            "nodeConfigs": {
                "fleet": yaml.safe_load(
                    (REPOSITORY / "deploy/examples/node-configs/mixed-fleet.yaml").read_text()
                )
            }
        },
        id="mixed-fleet-example",
    ),
    pytest.param(
        config(
            mode="vgpu-partitions",
            vgpu={
                "partitions": [{"memory": 1073741824}, {"memory": "1536Mi", "cores": 100}],
                "enforcement": "hami-core",
            },
        ),
        id="partitions",
    ),
    pytest.param(config(mode="vgpu-capacity", vgpu={"memoryStep": "1Gi"}, packing="binpack"), id="capacity"),
    pytest.param(
        config(mode="mig-dynamic", mig={"profiles": ["1g.10gb", "1g.10gb+me", "7g.186gb"]}, packing="spread"),
        id="mig",
    ),
    pytest.param(
        gpus({"index": 0, "mode": "gpu"}, {"uuid": "GPU-1", "mode": "mig-static"}, {"model": "L4"}),
        id="entries",
    ),
    pytest.param({"nodeConfigs": {"A-b_c.1": {}}}, id="config-name"),
    pytest.param(
        {"simulatedNode": {"gpus": [{"model": "A100-SXM4-80GB", "count": 2, "migMode": "enabled"}]}}, id="sim"
    ),
    pytest.param(
        {"extendedResources": {"enabled": True, "migProfiles": ["1g.24gb", "3g.40gb"]}}, id="extended"
    ),
    pytest.param({"extraEnv": [{"name": "MOCK_NVML_NODE", "value": "/run/mock/node.txt"}]}, id="env"),
]


def test_the_committed_schema_is_generated() -> None:
    """Fails when a decoder, the catalog or the node profiles changed and hack/gen-chart-schema.py
    was not run."""
    committed = json.loads(SCHEMA.read_text())

    assert with_generated_parts(committed) == committed, "run hack/gen-chart-schema.py"


def test_a_stale_schema_is_noticed() -> None:
    """Guards the test above: a schema that lost a catalog model is not what the generator writes."""
    stale = json.loads(SCHEMA.read_text())
    stale["properties"]["simulatedNode"]["properties"]["gpus"]["items"]["properties"]["model"]["enum"].remove(
        "L4"
    )

    assert with_generated_parts(stale) != stale


@pytest.fixture
def server() -> Any:
    api = ApiServer(version="1.36", install_types=True).start()
    yield api
    api.stop()


def _without_marks(case: Any) -> Any:
    """The chart refuses every bad value now; only the command waits for item 1."""
    return pytest.param(*case.values, id=case.id)


@pytest.mark.parametrize(("values", "where"), [_without_marks(case) for case in BAD])
async def test_the_chart_refuses_what_the_decoders_refuse(
    values: dict[str, Any], where: str, server: ApiServer, tmp_path: Path
) -> None:
    with pytest.raises(helm_sdkpy.InstallError) as refused:
        await install(server, tmp_path, "refused", "dra-driver", values)

    assert where in str(refused.value), str(refused.value)
    assert installed(server, "refused") == []


@pytest.mark.parametrize(("values", "where"), BAD)
def test_the_command_refuses_the_same_values(values: dict[str, Any], where: str) -> None:
    with pytest.raises(ManifestError):
        check_options(options_for(values))


@pytest.mark.parametrize("values", GOOD)
async def test_both_accept_what_the_decoders_accept(
    values: dict[str, Any], server: ApiServer, tmp_path: Path
) -> None:
    check_options(options_for(values))

    result = await install(server, tmp_path, "accepted", "dra-driver", values)

    assert result["info"]["status"] == "deployed"
