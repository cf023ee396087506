"""Re-planning a running agent's node config: the new plan, GPUs that wait for their claims,
the fallback to features the API server has, following a named config, and the metric."""

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.agent.node_configs import NamedConfigs, gpus_in_use, replan, unclaimed_mig
from dra_driver.agent.node_watch import NodeFacts
from dra_driver.claims.effect_entries import MigInstanceEntry
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord, PreparedDevice
from dra_driver.devices.config_files import ConfigChoice
from dra_driver.devices.inventory import build_inventory
from dra_driver.devices.node_config import (
    ConfigProblem,
    GpuEntry,
    GpuPlan,
    GpuSettings,
    Mode,
    NodeConfig,
    plan_node,
)
from dra_driver.observability.metrics import AgentMetrics
from dra_driver.publish.desired import ApiCapabilities
from tests.support.node_configs import write_configmap
from tests.support.nodes import simulated_node

MIXED = simulated_node("mixed")
LABEL = "dra-driver.dev/config"


def choice(config: NodeConfig | None, *problems: ConfigProblem) -> ConfigChoice:
    return ConfigChoice("test", config, problems)


def l4s(mode: Mode) -> NodeConfig:
    return NodeConfig(gpus=(GpuEntry("gpus[0]", None, None, GpuSettings(mode=mode), model="L4"),))


def offered(plans: tuple[GpuPlan, ...]) -> dict[str, GpuPlan]:
    return {plan.gpu.uuid: plan for plan in plans}


def record(uid: str, *devices: str, mig_on: str | None = None) -> ClaimRecord:
    mig = (MigInstanceEntry(mig_on, 19, 0, 1),) if mig_on else ()
    return ClaimRecord(
        claim=ClaimRef("default", uid, uid),
        devices=tuple(PreparedDevice(("r",), "node-a", device, ()) for device in devices),
        effects=mig,
    )


def test_claims_are_traced_to_their_gpus_by_device_name_and_mig_instance() -> None:
    records = [
        record("a", "gpu-6"),
        record("b", "gpu-7-vgpu-6gi-1", "gpu-0-mig-1g10gb-2"),
        record("c", mig_on=MIXED[3].uuid),
        record("d", "not-ours"),
    ]
    assert gpus_in_use(records, MIXED) == {MIXED[i].uuid for i in (0, 3, 6, 7)}


def test_mig_instances_a_record_names_are_the_claims_and_the_others_are_foreign() -> None:
    """GPU 0 of the mixed node has 2g.20gb at 0, 1g.10gb at 2 and 3, 3g.40gb at 4."""
    gpu = MIXED[0]
    mine = ClaimRecord(
        claim=ClaimRef("default", "a", "a"),
        devices=(PreparedDevice(("r",), "node-a", "gpu-0-mig-3g40gb-4", ()),),
        state="preparing",  # half-prepared: rolled back at start, never handed out
        effects=(MigInstanceEntry(gpu.uuid, 9, 4, 4), MigInstanceEntry(MIXED[1].uuid, 19, 2, 1)),
    )
    (left, other, *_) = unclaimed_mig(MIXED, [mine])

    assert [i.placement.start for i in left.mig_instances] == [0, 2, 3]
    assert [i.placement.start for i in other.mig_instances] == [0, 3, 4]
    # The claimed instance's placement stays offered; nothing overlaps the foreign ones.
    dynamic = plan_node(NodeConfig(default=GpuSettings(mode="mig-dynamic")), (left,)).plans
    names = {device.name for device in build_inventory(dynamic).devices}
    assert {"gpu-0-mig-3g40gb-4", "gpu-0-mig-2g20gb-0"} <= names
    assert "gpu-0-mig-1g10gb-0" not in names and "gpu-0-mig-4g40gb-0" not in names


def test_a_gpu_whose_plan_changes_while_claims_use_it_waits_and_the_others_change() -> None:
    current = offered(plan_node(l4s("gpu"), MIXED).plans)
    result = replan(
        choice(l4s("vgpu-capacity")),
        MIXED,
        current,
        frozenset({MIXED[6].uuid}),
        ApiCapabilities(),
        hami_core=True,
    )
    assert result.waiting == (MIXED[6],)
    assert {plan.gpu.index: plan.mode for plan in result.plans if plan.gpu.index >= 4} == {
        4: "gpu",
        5: "gpu",
        7: "vgpu-capacity",
    }
    # Once its claims are gone the GPU takes the new plan.
    later = replan(
        choice(l4s("vgpu-capacity")), MIXED, current, frozenset(), ApiCapabilities(), hami_core=True
    )
    assert later.waiting == ()
    assert [plan.mode for plan in later.plans if plan.gpu.index == 6] == ["vgpu-capacity"]


def test_a_gpu_in_use_whose_plan_stays_does_not_wait() -> None:
    plans = plan_node(l4s("gpu"), MIXED).plans
    in_use = frozenset(gpu.uuid for gpu in MIXED)
    result = replan(choice(l4s("gpu")), MIXED, offered(plans), in_use, ApiCapabilities(), hami_core=True)
    assert (result.plans, result.waiting) == (plans, ())


def test_a_gpu_left_out_meanwhile_comes_back_under_its_claims_plan_without_waiting() -> None:
    """Its claims were prepared under the plan it was last offered under, which the broken
    config in between did not change."""
    plans = plan_node(l4s("gpu"), MIXED).plans
    in_use = frozenset({MIXED[6].uuid})
    broken = replan(
        choice(None, ConfigProblem("file", "broken")),
        MIXED,
        offered(plans),
        in_use,
        ApiCapabilities(),
        hami_core=True,
    )
    assert (broken.plans, broken.waiting) == ((), ())
    mended = replan(choice(l4s("gpu")), MIXED, offered(plans), in_use, ApiCapabilities(), hami_core=True)
    assert (mended.plans, mended.waiting) == (plans, ())


def test_at_start_nothing_waits() -> None:
    result = replan(
        choice(l4s("vgpu-capacity")),
        MIXED,
        None,
        frozenset({MIXED[6].uuid}),
        ApiCapabilities(),
        hami_core=True,
    )
    assert result.waiting == ()
    assert [plan.mode for plan in result.plans if plan.gpu.index == 6] == ["vgpu-capacity"]


def test_a_config_that_offers_nothing_keeps_its_problems_and_plans_nothing() -> None:
    problem = ConfigProblem("file", "broken")
    result = replan(choice(None, problem), MIXED, None, frozenset(), ApiCapabilities(), hami_core=True)
    assert (result.plans, result.problems) == ((), (problem,))


def test_the_new_plan_falls_back_to_what_the_api_server_stores() -> None:
    result = replan(
        choice(l4s("vgpu-capacity")),
        MIXED,
        None,
        frozenset(),
        ApiCapabilities(unsupported=frozenset({"DRAConsumableCapacity"})),
        hami_core=True,
    )
    assert [plan.mode for plan in result.plans if plan.gpu.index == 6] == ["vgpu-partitions"]


@pytest.mark.parametrize(("version", "mode"), [((1, 34), "vgpu-partitions"), ((1, 35), "vgpu-capacity")])
def test_on_kubernetes_1_34_vgpu_capacity_falls_back_although_the_server_stores_it(
    version: tuple[int, int], mode: str
) -> None:
    """1.34's scheduler checks a share against another device's capacity (seen on a real 1.34.4
    cluster): the GPU is offered as partitions there, and as asked from 1.35."""
    result = replan(
        choice(l4s("vgpu-capacity")),
        MIXED,
        None,
        frozenset(),
        ApiCapabilities(kubernetes_version=version),
        hami_core=True,
    )
    assert [plan.mode for plan in result.plans if plan.gpu.index == 6] == [mode]


class Applied:
    def __init__(self, wait: bool = False) -> None:
        self.choices: list[ConfigChoice] = []
        self.wait = wait

    def __call__(self, choice: ConfigChoice) -> bool:
        self.choices.append(choice)
        return self.wait


def labelled(value: str | None) -> NodeFacts:
    return NodeFacts(exists=True, uid="u", labels={LABEL: value} if value else {"other": "x"})


def test_named_configs_follow_the_label_and_the_files(tmp_path: Path) -> None:
    write_configmap(
        tmp_path, {"default.yaml": "default: {mode: gpu}\n", "l4.yaml": "default: {mode: auto}\n"}
    )
    applied = Applied()
    named = NamedConfigs(tmp_path, LABEL, applied)
    named.poll()
    assert applied.choices == []  # the label is not known yet

    named.node_changed(labelled(None))
    named.node_changed(labelled(None))  # a heartbeat: nothing changed
    named.poll()
    assert [c.name for c in applied.choices] == ["default"]

    named.node_changed(labelled("l4"))
    assert applied.choices[-1].config == NodeConfig(default=GpuSettings(mode="auto"))

    write_configmap(tmp_path, {"default.yaml": "{}\n", "l4.yaml": "default: {mode: vgpu-capacity}\n"})
    named.poll()
    assert applied.choices[-1].config == NodeConfig(default=GpuSettings(mode="vgpu-capacity"))
    named.poll()
    assert len(applied.choices) == 3

    write_configmap(tmp_path, {"default.yaml": "{}\n"})  # l4.yaml removed from the ConfigMap
    named.poll()
    assert applied.choices[-1].config is None
    assert "there is no" in applied.choices[-1].problems[0].message


def test_while_gpus_wait_each_poll_applies_the_config_again(tmp_path: Path) -> None:
    write_configmap(tmp_path, {"default.yaml": "{}\n"})
    applied = Applied(wait=True)
    named = NamedConfigs(tmp_path, LABEL, applied)
    named.without_node()
    named.poll()
    named.poll()
    assert len(applied.choices) == 3
    applied.wait = False
    named.poll()
    named.poll()
    assert len(applied.choices) == 4


def metric_samples(metrics: AgentMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for sample in family.samples
        if sample.name == name
    }


def test_the_problems_metric_shows_the_current_problems_only() -> None:
    metrics = AgentMetrics()
    metrics.set_node_config(
        "a100", [ConfigProblem("gpus[0].mode", "m", MIXED[4]), ConfigProblem("file", "f")]
    )
    assert metric_samples(metrics, "dra_driver_node_config_problems") == {
        (("gpu", "4"), ("setting", "gpus[0].mode")): 1.0,
        (("gpu", ""), ("setting", "file")): 1.0,
    }
    metrics.set_node_config("l4", [])
    assert metric_samples(metrics, "dra_driver_node_config_problems") == {}
    assert metric_samples(metrics, "dra_driver_node_config_info") == {(("config", "l4"),): 1.0}


@pytest.mark.parametrize("value", ["", None])
def test_an_empty_label_counts_as_none(tmp_path: Path, value: str | None) -> None:
    write_configmap(tmp_path, {"default.yaml": "default: {mode: gpu}\n"})
    applied = Applied()
    named = NamedConfigs(tmp_path, LABEL, applied)
    named.node_changed(NodeFacts(exists=True, labels={} if value is None else {LABEL: value}))
    assert applied.choices[-1].config == NodeConfig(default=GpuSettings(mode="gpu"))


def test_hami_core_asked_for_by_a_later_config_on_a_node_without_it_is_a_problem() -> None:
    config = NodeConfig(
        gpus=(
            GpuEntry(
                "gpus[0]", None, None, GpuSettings(mode="vgpu-capacity", enforcement="hami-core"), model="L4"
            ),
        )
    )
    current = offered(plan_node(l4s("gpu"), MIXED).plans)

    without = replan(choice(config), MIXED, current, frozenset(), ApiCapabilities(), hami_core=False)
    assert [(p.setting, p.gpu) for p in without.problems] == [
        ("gpus[0].vgpu.enforcement", MIXED[i]) for i in (6, 7)
    ]
    assert "hami-core on GPU 6 (NVIDIA L4" in without.problems[0].message
    assert "needs --hami-core-library" in without.problems[0].message
    assert {plan.gpu.index for plan in without.plans} == {0, 1, 2, 3, 4, 5}  # not the L4s
    with_it = replan(choice(config), MIXED, current, frozenset(), ApiCapabilities(), hami_core=True)
    assert with_it.problems == ()
    assert [plan.mode for plan in with_it.plans if plan.gpu.index >= 6] == ["vgpu-capacity"] * 2
