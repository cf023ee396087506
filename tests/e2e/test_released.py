"""After every example, fault and update test: every device of the node can be allocated again.

One pod asks for all of it at once, a claim per kind (prepare refuses an MPS-enforced share
together with other devices in one claim): every whole GPU (by UUID; a partitioned GPU's whole
device takes its shared counters whole, so it fits only if no partition is taken), the
largest profile of every dynamic-MIG GPU, every MIG instance made at boot, and all of the
capacity-shared GPU where the cluster has one (its memory, cores and MPS clients). The claims being released
afterwards is the runner's own check (tests/e2e/released.py).
"""

from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME as D
from tests.e2e import kube
from tests.e2e.conftest import RunObjects
from tests.e2e.objects import claim_pod, claim_template

# On an H100 80GB the profile that takes the whole GPU.
WHOLE_GPU_PROFILE = "7g.80gb"


def _attributes(device: dict[str, Any]) -> dict[str, Any]:
    return {name: next(iter(value.values())) for name, value in device.get("attributes", {}).items()}


def _cel(expression: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": expression}}]


def _everything(published: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], set[str]]:
    """The claim templates that take every device of the node, and the devices they must get.
    A device the agent tainted stays out: the XID test leaves its GPU tainted, as a GPU with a
    fatal XID is until it is reset."""
    untainted = {name: device for name, device in published.items() if not device.get("taints")}
    attributes = {name: _attributes(device) for name, device in untainted.items()}
    whole = {name for name, attrs in attributes.items() if attrs["type"] == "gpu"}
    dynamic = {
        name
        for name, attrs in attributes.items()
        if attrs["type"] == "mig" and attrs["profile"] == WHOLE_GPU_PROFILE and "uuid" not in attrs
    }
    static = {name for name, attrs in attributes.items() if attrs["type"] == "mig" and "uuid" in attrs}
    shared = [name for name, device in untainted.items() if device.get("allowMultipleAllocations")]
    templates = [
        claim_template(
            "all-whole",
            {
                "deviceClassName": "gpu.dra-driver.dev",
                "count": len(whole),
                "selectors": _cel(
                    f'device.attributes["{D}"].uuid in {sorted(attributes[name]["uuid"] for name in whole)}'
                ),
            },
        ),
        claim_template(
            "all-dynamic-mig",
            {
                "deviceClassName": "mig.dra-driver.dev",
                "count": len(dynamic),
                "selectors": _cel(f'device.attributes["{D}"].profile == "{WHOLE_GPU_PROFILE}"'),
            },
        ),
        claim_template(
            "all-static-mig",
            {
                "deviceClassName": "mig.dra-driver.dev",
                "count": len(static),
                # Guarded: a selector that fails on any device (a placement has no uuid) fails
                # the whole scheduling attempt.
                "selectors": _cel(
                    f'"uuid" in device.attributes["{D}"] && '
                    f'device.attributes["{D}"].uuid in {sorted(attributes[name]["uuid"] for name in static)}'
                ),
            },
        ),
    ]
    expected = whole | dynamic | static
    for name in shared:
        capacity = untainted[name]["capacity"]
        templates.append(
            claim_template(
                f"all-of-{name}",
                {
                    "deviceClassName": "vgpu.dra-driver.dev",
                    "selectors": _cel(f'device.attributes["{D}"].uuid == "{attributes[name]["uuid"]}"'),
                    "capacity": {"requests": {key: entry["value"] for key, entry in capacity.items()}},
                },
            )
        )
        expected.add(name)
    return templates, expected


def test_every_device_of_the_node_can_be_allocated_again(run_objects: RunObjects, worker: str) -> None:
    published = kube.published_devices(worker)
    templates, expected = _everything(published)
    assert len(expected) >= 8, sorted(expected)
    pod = claim_pod("every-device", [item["metadata"]["name"] for item in templates])

    run = run_objects([*templates, pod])

    assert {result["device"] for result in run.results} == expected
    assert not any(result.get("adminAccess") for result in run.results)
