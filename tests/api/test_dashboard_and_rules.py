"""The Grafana dashboard and the Prometheus alert rules the chart ships: every query parses with a
real PromQL parser (promql-parser) and reads only metrics the agent exports."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.observability.metrics import AgentMetrics
from dra_driver.usage.attribution import ClaimRow, GpuRow
from tests.support.promql import metric_names

FILES = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "dra-driver" / "files"
DASHBOARD = FILES / "grafana" / "dra-driver-usage.json"
RULES = FILES / "prometheus" / "dra-driver-rules.yaml"
_LABEL_VALUES = re.compile(r"^label_values\((\w+),\s*\w+\)$")


def exported_names() -> set[str]:
    """Every sample name the agent's /metrics can carry, the usage gauges included (one sample of
    each, with every value known)."""
    metrics = AgentMetrics()
    metrics.usage.publish(
        [GpuRow("0", "GPU-1", "H100", 1, 2, 0.5, 1)],
        [ClaimRow("0", "GPU-1", "H100", "gpu-0", "ns", "pod", "c", "claim", 2, 1.0, 1, 0.5)],
    )
    metrics.claims.prepare_duration.observe(0.01)
    metrics.set_devices({("gpu", "unhealthy"): 1})
    text = generate_latest(metrics.registry).decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def dashboard_queries() -> list[str]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def rule_queries() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


@pytest.mark.parametrize("query", [*dashboard_queries(), *rule_queries()])
def test_every_query_parses_and_reads_only_exported_metrics(query: str) -> None:
    names = metric_names(query)
    assert names, query
    assert names <= exported_names(), f"{sorted(names - exported_names())} are not exported by the agent"


def test_the_dashboards_variables_read_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = _LABEL_VALUES.match(variable["definition"])
        assert match, variable["definition"]
        assert match.group(1) in exported_names()


def test_a_misspelt_metric_is_caught() -> None:
    assert metric_names("rate(dra_driver_prepare_error_total[5m]) > 0") - exported_names() == {
        "dra_driver_prepare_error_total"
    }


def test_the_rules_cover_what_operators_asked_for() -> None:
    alerts = {
        rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    }
    assert alerts >= {
        "DRADriverGPULost",
        "DRADriverDevicesUnhealthy",
        "DRADriverShareOverMemoryLimit",
        "DRADriverPrepareErrors",
    }
