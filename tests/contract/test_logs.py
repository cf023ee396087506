"""The agent's log as a log pipeline reads it: one JSON object per line, and every line about a
claim names the claim, every line about a device its pool and device."""

from kubernetes import client

from dra_driver.tools import kubelet_client
from dra_driver.tools.kubelet_client import ClaimArg
from tests.support.agent import AgentProcess
from tests.support.claims import allocate

CLAIM_KEYS = {"claim_namespace", "claim_name", "claim_uid"}


# Lines about one claim (summaries about many, such as "claims restored from state", are not).
PER_CLAIM_EVENTS = {
    "claim prepared",
    "claim unprepared",
    "prepare refused",
    "unprepare refused",
    "prepare failed unexpectedly",
    "unprepare failed unexpectedly",
}


async def test_every_line_is_json_and_claim_and_device_lines_carry_their_keys(
    agent: AgentProcess, claims_api: client.ResourceV1Api
) -> None:
    good = ClaimArg("default", "logged", allocate(claims_api, "logged", {"gpu": "gpu-1"}, pool="node-a"))
    taken = ClaimArg("default", "second", allocate(claims_api, "second", {"gpu": "gpu-1"}, pool="node-a"))
    missing = ClaimArg("default", "absent", "3f1c7a52-9c1e-4e43-9d57-4c6f3f1e2a10")
    socket = agent.dirs.dra_socket

    async def calls() -> None:
        await kubelet_client.prepare(socket, "v1", [good])
        await kubelet_client.prepare(socket, "v1", [taken, missing])
        await kubelet_client.unprepare(socket, "v1", [good, taken])

    await calls()
    agent.terminate()

    lines = agent.log_lines()
    assert [line for line in lines if line.get("unparsed")] == []
    events = {str(line["event"]) for line in lines}
    assert {"claim prepared", "prepare refused", "claim unprepared"} <= events
    for line in lines:
        assert {"event", "level", "timestamp"} <= set(line), line
        if line["event"] in PER_CLAIM_EVENTS or CLAIM_KEYS & set(line):
            assert set(line) >= CLAIM_KEYS, line
        if "device" in line or "devices" in line:
            assert "pool" in line, line
    refused = [line for line in lines if line["event"] == "prepare refused"]
    assert {(line["claim_name"], line["claim_uid"]) for line in refused} == {
        ("second", taken.uid),
        ("absent", missing.uid),
    }
