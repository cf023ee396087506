"""Every kind of device a claim can hold, consumed by a real container through podman.

The contract tests check the CDI specs as JSON; only a real runtime shows that what a container
finally sees is right: podman resolves the IDs prepare returned through the upstream CDI library
and applies the edits. One simulated node offers every kind at once (static MIG on GPUs 0-1,
dynamic MIG on 2-3, vGPU capacity mode on 4-5, whole GPUs on 6-7), so a single agent serves all
the tests of this module and each test pays only for its containers.
"""

import json
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dra_driver.agent.gpu_platform import SIMULATED_HARDWARE_STATE
from dra_driver.hardware.simulated_nodes import mig_instance_uuid, resolve_node_spec, simulated_gpus
from dra_driver.tools import kubelet_client, podman
from dra_driver.tools.kubelet_client import ClaimArg, DraApi
from tests.support import podman_tier
from tests.support.agent import NODE_NAME, AgentDirs, AgentProcess
from tests.support.claims import allocate_results

pytestmark = pytest.mark.podman

# A driver name of this module's own: its specs in /var/run/cdi cannot clash with another test's,
# and the agent's start-up sweep of unowned specs cannot remove another test's.
DRIVER = "gpu.podman-kinds.dra-driver.dev"
CDI_KIND = f"k8s.{DRIVER}/claim"
HARDWARE = "mixed"
NODE_CONFIG = """\
gpus:
  - {index: 2, mode: mig-dynamic}
  - {index: 3, mode: mig-dynamic}
  - {index: 4, mode: vgpu-capacity, vgpu: {enforcement: none}}
  - {index: 5, mode: vgpu-capacity}
"""
# gpu-4's shares get HAMi-core's variables (advisory: no library here); gpu-5's go through its
# MPS daemon (the default enforcement), a real simulated daemon whose pipe directory is mounted.
GPUS = simulated_gpus(NODE_NAME, resolve_node_spec(HARDWARE))
# Everything the driver's edits set: device descriptions (DRA_) and HAMi-core's settings.
SHOWN_ENV = "env | grep -E '^(DRA|CUDA|GPU|ACTIVE)_' | sort"
CONFIG_API = "resource.dra-driver.dev/v1alpha1"


@dataclass
class Node:
    """The running agent and the API its claims are allocated through, as the scheduler would."""

    agent: AgentProcess
    claims: client.ResourceV1Api

    @property
    def dirs(self) -> AgentDirs:
        return self.agent.dirs

    def allocate(
        self, name: str, results: Sequence[dict[str, Any]], configs: Sequence[dict[str, Any]] = ()
    ) -> ClaimArg:
        """Creates claim `name` and writes an allocation status with `results` (request, device and
        any shareID/consumedCapacity) and `configs`; tests.support.claims.allocate only knows
        request/driver/pool/device."""
        full = [{"driver": DRIVER, "pool": NODE_NAME, **result} for result in results]
        return ClaimArg("default", name, allocate_results(self.claims, name, full, configs))

    async def prepare(self, *claims: ClaimArg, api: DraApi = "v1") -> dict[str, Any]:
        answer = await kubelet_client.prepare(self.dirs.dra_socket, api, list(claims))
        answered: dict[str, Any] = answer["claims"]
        return answered

    async def unprepare(self, *claims: ClaimArg) -> dict[str, Any]:
        answer = await kubelet_client.unprepare(self.dirs.dra_socket, "v1", list(claims))
        answered: dict[str, Any] = answer["claims"]
        return answered

    @asynccontextmanager
    async def prepared(self, *claims: ClaimArg) -> AsyncIterator[dict[str, Any]]:
        """The claims' prepare answers, each checked for success; unprepared on the way out, even
        when the test fails, so no spec is left in the runtime's CDI directory."""
        try:
            answer = await self.prepare(*claims)
            for claim in claims:
                assert answer[claim.uid]["error"] == "", answer[claim.uid]
            yield answer
        finally:
            unprepared = await self.unprepare(*claims)
        assert unprepared == {claim.uid: {"error": ""} for claim in claims}
        for claim in claims:
            assert not self.spec_path(claim.uid).exists()

    def spec_path(self, uid: str) -> Path:
        return podman.CDI_DIRS[1] / f"k8s.{DRIVER}-claim_{uid}.json"

    def dynamic_instances(self, gpu_index: int) -> list[dict[str, int]]:
        """The MIG instances the simulated GPU holds now, as its state file records them."""
        path = self.dirs.state_dir / SIMULATED_HARDWARE_STATE
        if not path.exists():
            return []
        instances: list[dict[str, int]] = json.loads(path.read_text())["instances"][GPUS[gpu_index].uuid]
        return instances


def cdi_ids(answer: dict[str, Any]) -> list[str]:
    return [cdi_id for device in answer["devices"] for cdi_id in device["cdi_device_ids"]]


def container_env(ids: Sequence[str]) -> list[str]:
    """The driver's variables, as a fresh container given `ids` sees them."""
    return podman.run_with_cdi_devices(list(ids), SHOWN_ENV).splitlines()


def vgpu_config(**knobs: object) -> dict[str, Any]:
    return {
        "source": "FromClaim",
        "requests": [],
        "opaque": {"driver": DRIVER, "parameters": {"apiVersion": CONFIG_API, "kind": "VgpuConfig", **knobs}},
    }


@pytest.fixture(scope="module")
def require_podman() -> None:
    podman_tier.require_podman()


@pytest.fixture(scope="module")
def node(require_podman: None) -> Iterator[Node]:
    """One agent for the whole module, so each test pays only for its containers."""
    with podman_tier.simulated_node(DRIVER, HARDWARE, NODE_CONFIG) as (agent, claims):
        yield Node(agent, claims)


async def test_a_whole_gpu(node: Node) -> None:
    claim = node.allocate("whole", [{"request": "gpu", "device": "gpu-6"}])

    async with node.prepared(claim) as answer:
        (device,) = answer[claim.uid]["devices"]
        assert (device["request_names"], device["device_name"]) == (["gpu"], "gpu-6")
        assert device["cdi_device_ids"] == [
            f"{CDI_KIND}={claim.uid}-gpu-6",
            f"{CDI_KIND}={claim.uid}-gpu.metadata",
        ]
        seen = container_env(cdi_ids(answer[claim.uid]))

    assert seen == [f"DRA_DEVICE_GPU_6={GPUS[6].uuid}", "DRA_DEVICE_GPU_6_PRODUCT_NAME=NVIDIA L4"]


async def test_a_static_mig_device_is_the_instance_that_already_exists(node: Node) -> None:
    claim = node.allocate("static-mig", [{"request": "mig", "device": "gpu-0-mig-1g10gb-2"}])
    existing = next(i for i in GPUS[0].mig_instances if i.placement.start == 2)

    async with node.prepared(claim) as answer:
        seen = container_env(cdi_ids(answer[claim.uid]))

    assert seen == [
        f"DRA_DEVICE_GPU_0_MIG_1G10GB_2={existing.uuid}",
        f"DRA_DEVICE_GPU_0_MIG_1G10GB_2_PARENT={GPUS[0].uuid}",
        "DRA_DEVICE_GPU_0_MIG_1G10GB_2_PLACEMENT=2+1",
        "DRA_DEVICE_GPU_0_MIG_1G10GB_2_PROFILE=1g.10gb",
    ]


async def test_dynamic_mig_devices_are_instances_created_for_the_claim_and_destroyed_after(
    node: Node,
) -> None:
    claim = node.allocate(
        "dynamic-mig",
        [
            {"request": "small", "device": "gpu-2-mig-1g10gb-3"},
            {"request": "large", "device": "gpu-2-mig-3g40gb-4"},
        ],
    )
    assert node.dynamic_instances(2) == []

    async with node.prepared(claim) as answer:
        created = {instance["start"]: instance for instance in node.dynamic_instances(2)}
        seen = container_env(cdi_ids(answer[claim.uid]))

    assert sorted(created) == [3, 4], "one instance per device, at the device's placement"
    mig_uuid = {
        start: mig_instance_uuid(GPUS[2].uuid, instance["gi"], instance["profileId"], start)
        for start, instance in created.items()
    }
    assert seen == [
        f"DRA_DEVICE_GPU_2_MIG_1G10GB_3={mig_uuid[3]}",
        f"DRA_DEVICE_GPU_2_MIG_1G10GB_3_PARENT={GPUS[2].uuid}",
        "DRA_DEVICE_GPU_2_MIG_1G10GB_3_PLACEMENT=3+1",
        "DRA_DEVICE_GPU_2_MIG_1G10GB_3_PROFILE=1g.10gb",
        f"DRA_DEVICE_GPU_2_MIG_3G40GB_4={mig_uuid[4]}",
        f"DRA_DEVICE_GPU_2_MIG_3G40GB_4_PARENT={GPUS[2].uuid}",
        "DRA_DEVICE_GPU_2_MIG_3G40GB_4_PLACEMENT=4+4",
        "DRA_DEVICE_GPU_2_MIG_3G40GB_4_PROFILE=3g.40gb",
    ]
    assert node.dynamic_instances(2) == [], "unprepare destroyed both instances"


async def test_a_vgpu_share_gets_its_consumed_capacity_as_hami_core_limits(node: Node) -> None:
    share = str(uuid.uuid4())
    claim = node.allocate(
        "vgpu",
        [
            {
                "request": "gpu",
                "device": "gpu-4",
                "shareID": share,
                "consumedCapacity": {"memory": "4Gi", "cores": "25"},
            }
        ],
        [vgpu_config(coreLimitPolicy="Force", taskPriority=0)],
    )

    async with node.prepared(claim) as answer:
        (device,) = answer[claim.uid]["devices"]
        assert (device["device_name"], device["share_id"]) == ("gpu-4", share)
        # Two shares of one device in one claim are two CDI devices, so the name carries the share.
        assert device["cdi_device_ids"] == [
            f"{CDI_KIND}={claim.uid}-gpu-4-{share}",
            f"{CDI_KIND}={claim.uid}-gpu.metadata",
        ]
        seen = container_env(cdi_ids(answer[claim.uid]))

    assert seen == [
        "ACTIVE_OOM_KILLER=false",
        "CUDA_DEVICE_MEMORY_LIMIT_0=4096m",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_DEVICE_SM_LIMIT_0=25",
        "CUDA_OVERSUBSCRIBE=false",
        "CUDA_TASK_PRIORITY=0",
        f"DRA_DEVICE_GPU_4={GPUS[4].uuid}",
        "DRA_DEVICE_GPU_4_PRODUCT_NAME=NVIDIA A100-SXM4-80GB",
        "GPU_CORE_UTILIZATION_POLICY=force",
    ]


def vgpu_share(share_id: str, memory: str, cores: str) -> list[dict[str, Any]]:
    return [
        {
            "request": "gpu",
            "device": "gpu-5",
            "shareID": share_id,
            "consumedCapacity": {"memory": memory, "cores": cores},
        }
    ]


async def test_two_claims_sharing_one_vgpu_see_the_same_gpu_with_their_own_limits(node: Node) -> None:
    shares = {"share-small": str(uuid.uuid4()), "share-large": str(uuid.uuid4())}
    small = node.allocate("share-small", vgpu_share(shares["share-small"], "4Gi", "25"))
    large = node.allocate("share-large", vgpu_share(shares["share-large"], "10Gi", "60"))

    # Both at once: shares of a device that allows multiple allocations are not exclusive.
    async with node.prepared(small, large) as answer:
        assert {c.name: answer[c.uid]["devices"][0]["share_id"] for c in (small, large)} == shares
        seen = {
            claim.name: {
                line for line in container_env(cdi_ids(answer[claim.uid])) if "GPU_5" in line or "MPS" in line
            }
            for claim in (small, large)
        }
        # The GPU daemon's control socket, through the pipe directory mounted at MPS's default.
        reach = "test -S /tmp/nvidia-mps/control && echo reachable"
        assert podman.run_with_cdi_devices(list(cdi_ids(answer[small.uid])), reach).strip() == "reachable"

    # One MPS daemon for the GPU, each share's limits its own clients'.
    gpu = {
        f"DRA_DEVICE_GPU_5={GPUS[5].uuid}",
        "DRA_DEVICE_GPU_5_PRODUCT_NAME=NVIDIA A100-SXM4-80GB",
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
    }
    assert seen == {
        "share-small": gpu
        | {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M"},
        "share-large": gpu
        | {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M"},
    }


async def test_a_claim_shared_by_two_pods_is_prepared_once_and_both_containers_see_its_gpu(
    node: Node,
) -> None:
    claim = node.allocate("shared", [{"request": "gpu", "device": "gpu-7"}])

    async with node.prepared(claim) as first:
        # The second pod's kubelet call (over the other API version) finds the claim prepared.
        second = await node.prepare(claim, api="v1beta1")
        assert second == first
        assert [p.name for p in podman.CDI_DIRS[1].glob(f"k8s.{DRIVER}-claim_*.json")] == [
            node.spec_path(claim.uid).name
        ]
        containers = [container_env(cdi_ids(answer[claim.uid])) for answer in (first, second)]

    expected = [f"DRA_DEVICE_GPU_7={GPUS[7].uuid}", "DRA_DEVICE_GPU_7_PRODUCT_NAME=NVIDIA L4"]
    assert containers == [expected, expected]
