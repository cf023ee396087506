"""The agent's /metrics, /healthz and /readyz as Prometheus and kubelet probes see them."""

import urllib.error
import urllib.request

from kubernetes import client

from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support.agent import AgentProcess
from tests.support.claims import allocate


def get(agent: AgentProcess, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.metrics_port()}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def test_metrics_and_probes_follow_registration_and_claims(
    agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    status, body = get(agent, "/healthz")
    assert (status, body.strip()) == (200, "ok")
    status, reason = get(agent, "/readyz")
    assert status == 503 and "not registered with kubelet" in reason

    await kubelet_client.register(agent.dirs.registration_socket)
    uid = allocate(claims_api, "measured", {"gpu": "gpu-2"}, pool="node-a")
    missing = ClaimArg("default", "absent", "3f1c7a52-9c1e-4e43-9d57-4c6f3f1e2a10")
    await kubelet_client.prepare(agent.dirs.dra_socket, "v1", [ClaimArg("default", "measured", uid), missing])

    assert get(agent, "/readyz")[0] == 200
    metrics = agent.scrape()
    assert metrics[("dra_driver_kubelet_registered", ())] == 1
    assert metrics[("dra_driver_prepare_duration_seconds_count", ())] == 2
    # Both claims were asked for, the missing one too (a 404 is timed as well), and the GETs are
    # a part of the prepares they belong to.
    assert metrics[("dra_driver_claim_get_duration_seconds_count", ())] == 2
    assert (
        0
        < metrics[("dra_driver_claim_get_duration_seconds_sum", ())]
        < metrics[("dra_driver_prepare_duration_seconds_sum", ())]
    )
    assert metrics[("dra_driver_prepare_errors_total", (("reason", "claim_rejected"),))] == 1
    assert metrics[("dra_driver_resourceslice_writes_total", (("verb", "create"),))] == 1
    assert metrics[("dra_driver_devices", (("health", "healthy"), ("type", "gpu")))] == 8
    assert any(name == "dra_driver_build_info" for name, _ in metrics)
