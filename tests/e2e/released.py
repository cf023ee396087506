"""What a claim leaves on its node once its pods are gone: nothing. No ResourceClaim, no record of
the agent (`<state dir>/claims/<uid>.json`), no CDI spec, and no MPS daemon pod.

The files are read in the agent's own container (`kubectl exec`), which mounts the kubelet
plugins directory and the CDI directory at the host's paths, so this works on every provider.
"""

import json
import time
from collections.abc import Iterable

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.claims.edits.cdi import claim_spec_file_name
from dra_driver.tools.manifests import DEFAULT_NAMESPACE
from tests.e2e import kube
from tests.e2e.deploy import RELEASE

CDI_DIR = "/var/run/cdi"
RELEASE_TIMEOUT = 90.0


def _state_dir() -> str:
    """The agent's state directory: the plugins directory the chart mounts, and the driver's name
    below it (the agent's default --state-dir)."""
    daemon_set = kube.get("daemonset", RELEASE, "--namespace", DEFAULT_NAMESPACE)
    (plugins,) = [
        volume["hostPath"]["path"]
        for volume in daemon_set["spec"]["template"]["spec"]["volumes"]
        if volume["name"] == "plugins"
    ]
    return f"{plugins}/{DEFAULT_DRIVER_NAME}"


def agent_files(state_dir: str) -> set[str]:
    """The paths of every claim record (under `state_dir`) and every CDI spec on the agent's node."""
    listing = kube.kubectl(
        "exec", "--namespace", DEFAULT_NAMESPACE, f"daemonset/{RELEASE}", "--container", "node-agent", "--",
        "python3", "-c",
        "import glob, json, sys; print(json.dumps(sorted(glob.glob(sys.argv[1]) + glob.glob(sys.argv[2]))))",
        f"{state_dir}/claims/*.json", f"{CDI_DIR}/*",
    )  # fmt: skip
    return set(json.loads(listing))


def leftovers(claim_uids: Iterable[str]) -> list[str]:
    """What is still there of these claims: the claims, their records, CDI specs and MPS pods."""
    uids = set(claim_uids)
    found = [
        f"ResourceClaim {claim['metadata']['namespace']}/{claim['metadata']['name']}"
        for claim in kube.get("resourceclaims.resource.k8s.io", "--all-namespaces")["items"]
        if claim["metadata"]["uid"] in uids
    ]
    state = _state_dir()
    files = agent_files(state)
    for uid in sorted(uids):
        spec = f"{CDI_DIR}/{claim_spec_file_name(DEFAULT_DRIVER_NAME, uid)}"
        found += [path for path in (f"{state}/claims/{uid}.json", spec) if path in files]
    daemons = kube.get("pods", "--namespace", DEFAULT_NAMESPACE)["items"]
    found += [
        f"pod {DEFAULT_NAMESPACE}/{pod['metadata']['name']}"
        for pod in daemons
        if pod["metadata"]["name"] in {f"mps-{uid}" for uid in uids}
    ]
    return found


def wait_until_released(claim_uids: Iterable[str], timeout: float = RELEASE_TIMEOUT) -> None:
    """Returns once nothing of the claims is left; fails naming what is."""
    uids = list(claim_uids)
    deadline = time.monotonic() + timeout
    while left := leftovers(uids):
        if time.monotonic() > deadline:
            raise AssertionError(f"{timeout:.0f}s after their pods were deleted, left of the claims: {left}")
        time.sleep(2)
