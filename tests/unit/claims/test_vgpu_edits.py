"""vGPU shares as HAMi-core container edits: exact environment, index order, refusals, mounts.

The index order is the part HAMi's own DRA driver gets wrong (it comes from a map there), so it
is checked on an example whose bus order differs from both minor and input order, and as a
property over random shares of random simulated GPUs with their bus ids shuffled.
"""

import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from dra_driver.claims.claim_object import AllocatedDevice, ResourceClaimView
from dra_driver.claims.edits.cdi import ContainerEdits, Mount
from dra_driver.claims.edits.vgpu_edits import (
    HamiCore,
    HostDirectory,
    HostFile,
    VgpuClaimEdits,
    enforcement_off_message,
    vgpu_claim_edits,
)
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.opaque_config import VgpuConfig
from dra_driver.claims.sharing.sharing import vgpu_share_mps_edits
from dra_driver.claims.vgpu_grant import VgpuGrant, check_claim_grants, vgpu_grant
from dra_driver.devices.model import Device
from dra_driver.devices.node_config import MIB, Enforcement
from dra_driver.devices.vgpu import shareable_gpu_device
from dra_driver.hardware.model import Gpu
from tests.support.nodes import GIB, all_profiles, inventory_for, simulated_node

UID = "0b7c4d6e-1f2a-4b3c-8d9e-0a1b2c3d4e5f"
SHARE_ID = "5f0e9c1a-2b3d-4e5f-8a9b-0c1d2e3f4a5b"
HAMI = HamiCore(library=PurePosixPath("/opt/hami/libvgpu.so"), state_dir=PurePosixPath("/var/lib/dra/vgpu"))
DEFAULT_SETTINGS = (
    "CUDA_OVERSUBSCRIBE=false",
    "GPU_CORE_UTILIZATION_POLICY=default",
    "CUDA_TASK_PRIORITY=1",
    "ACTIVE_OOM_KILLER=false",
)
RESULTS = "status.allocation.devices.results"
DRIVER = "gpu.example.com"


def l4(minor: int, bus_id: str | None = None) -> Gpu:
    gpu = simulated_node("l4x8")[minor]
    return gpu if bus_id is None else replace(gpu, pci_bus_id=bus_id)


def shareable(gpu: Gpu) -> Device:
    return shareable_gpu_device(gpu, MIB)


def result(
    device: str, consumed: Mapping[str, object] | None = None, share_id: str | None = None
) -> dict[str, object]:
    raw: dict[str, object] = {
        "request": "vgpu",
        "driver": DRIVER,
        "pool": "node-a",
        "device": device,
    }
    if consumed is not None:
        raw["consumedCapacity"] = dict(consumed)
    if share_id is not None:
        raw["shareID"] = share_id
    return raw


def allocated(raw: dict[str, object], position: int = 0) -> AllocatedDevice:
    """`raw` decoded as entry `position` of a claim's results, as prepare decodes it."""
    other = {"request": "nic", "driver": "net.example.com", "pool": "node-a", "device": "eth0"}
    results = [*([other] * position), raw]
    document = {"metadata": {"uid": UID}, "status": {"allocation": {"devices": {"results": results}}}}
    (device,) = ResourceClaimView.decode(document, DRIVER).results
    return device


def capacity_share(gpu: Gpu, consumed: Mapping[str, object] | None, position: int = 0) -> VgpuGrant:
    device = shareable(gpu)
    return vgpu_grant(
        allocated(result(device.name, consumed), position), device, gpu, VgpuConfig(), "hami-core"
    )


def hami_edits(uid: str, shares: list[VgpuGrant], hami: HamiCore | None) -> VgpuClaimEdits:
    """The claim's edits with its GPUs under vgpu.enforcement hami-core (with a library) or none."""
    enforcement: Enforcement = "hami-core" if hami else "none"
    shares = [replace(share, enforcement=enforcement) for share in shares]
    return vgpu_claim_edits(uid, shares, hami, None)


def env_of(shares: list[VgpuGrant], hami: HamiCore | None = None) -> tuple[str, ...]:
    return hami_edits(UID, shares, hami).edits.env


# --- Shares from allocation results ----------------------------------------------------------


def test_a_capacity_mode_result_grants_what_it_consumed() -> None:
    gpu = l4(1)
    device = shareable(gpu)
    raw = result(device.name, {"memory": "10Gi", "cores": "30"}, SHARE_ID)

    share = vgpu_grant(allocated(raw, 2), device, gpu, VgpuConfig(oom_killer=True))

    assert share == VgpuGrant("gpu-1", gpu, 10 * GIB, 30, SHARE_ID, VgpuConfig(oom_killer=True))


def test_a_result_without_consumed_capacity_takes_the_whole_device() -> None:
    gpu = l4(0)

    share = capacity_share(gpu, None)

    assert (share.memory_bytes, share.cores, share.share_id) == (gpu.memory_bytes, 100, None)


def test_a_capacity_left_out_of_consumed_capacity_is_taken_whole() -> None:
    gpu = l4(0)

    assert capacity_share(gpu, {"memory": "4Gi"}).cores == 100
    assert capacity_share(gpu, {"cores": "25"}).memory_bytes == gpu.memory_bytes


def test_a_partition_grants_its_fixed_capacities() -> None:
    inventory = inventory_for("l4x8", "vgpu-partitions")
    device = inventory.device_by_name["gpu-3-vgpu-5gi-1"]
    gpu = inventory.gpu_of_device[device.name]

    share = vgpu_grant(allocated(result(device.name)), device, gpu, VgpuConfig())

    # A quarter of the L4 in whole GiB, and that share of its SMs.
    assert (share.device, share.gpu, share.memory_bytes, share.cores) == (
        "gpu-3-vgpu-5gi-1",
        gpu,
        5 * GIB,
        22,
    )
    assert env_of([share])[1:3] == ("CUDA_DEVICE_MEMORY_LIMIT_0=5120m", "CUDA_DEVICE_SM_LIMIT_0=22")


def test_a_whole_gpu_device_is_no_vgpu_grant() -> None:
    inventory = inventory_for("l4x8", "vgpu-partitions")
    device = inventory.device_by_name["gpu-3"]

    with pytest.raises(ValueError, match=r"^device gpu-3 is a gpu device, not a vGPU$"):
        vgpu_grant(allocated(result("gpu-3")), device, inventory.gpu_of_device["gpu-3"], VgpuConfig())


L4_MEMORY = "23034Mi"
NOT_A_QUANTITY = (
    "is not a whole number of bytes with an optional suffix Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E, "
    'e.g. "10Gi"'
)


@pytest.mark.parametrize(
    ("consumed", "message"),
    [
        (
            {"memory": "24Gi"},
            f'{RESULTS}[1].consumedCapacity.memory: "24Gi" is more than the {L4_MEMORY} of device gpu-0',
        ),
        (
            {"memory": "512Ki"},
            f'{RESULTS}[1].consumedCapacity.memory: "512Ki" is less than 1Mi; HAMi-core limits memory in '
            "whole MiB and reads a limit of 0 as no limit",
        ),
        (
            {"memory": "0"},
            f'{RESULTS}[1].consumedCapacity.memory: "0" is zero; a memory limit must be more than zero',
        ),
        ({"memory": "lots"}, f'{RESULTS}[1].consumedCapacity.memory: "lots" {NOT_A_QUANTITY}'),
        (
            {"memory": "1.5Gi"},
            f'{RESULTS}[1].consumedCapacity.memory: "1.5Gi" has a fraction; write it in a smaller unit, '
            "e.g. 1536Mi for 1.5Gi",
        ),
        (
            {"cores": "0"},
            f'{RESULTS}[1].consumedCapacity.cores: "0" is out of range; '
            "expected a percentage from 1 to 100 (the cores of device gpu-0)",
        ),
        (
            {"cores": "101"},
            f'{RESULTS}[1].consumedCapacity.cores: "101" is out of range; '
            "expected a percentage from 1 to 100 (the cores of device gpu-0)",
        ),
        (
            {"cores": "500m"},
            f'{RESULTS}[1].consumedCapacity.cores: "500m" is not a whole percentage such as "50"',
        ),
        (
            {"cores": 50},
            f"{RESULTS}[1].consumedCapacity.cores: expected a quantity string, got the integer 50",
        ),
        (
            {"gpu.example.com/memory": "1Gi"},
            f"{RESULTS}[1].consumedCapacity: 'gpu.example.com/memory' is not a capacity of device gpu-0 "
            "(it has clients, cores, memory)",
        ),
    ],
)
def test_consumed_capacity_that_does_not_fit_is_refused(consumed: Mapping[str, object], message: str) -> None:
    with pytest.raises(ClaimRejected) as refused:
        capacity_share(l4(0), consumed, position=1)

    assert str(refused.value) == message


def test_a_malformed_result_is_refused() -> None:
    gpu = l4(0)
    device = shareable(gpu)

    with pytest.raises(ClaimRejected) as not_an_object:
        vgpu_grant(
            allocated({**result(device.name), "consumedCapacity": ["10Gi"]}, 4), device, gpu, VgpuConfig()
        )
    with pytest.raises(ClaimRejected) as bad_share_id:
        vgpu_grant(allocated({**result(device.name), "shareID": 7}, 4), device, gpu, VgpuConfig())

    assert str(not_an_object.value) == f"{RESULTS}[4].consumedCapacity: expected an object, got a list"
    assert str(bad_share_id.value) == f"{RESULTS}[4].shareID: expected a string, got the integer 7"


def test_a_partition_never_grants_more_than_its_size() -> None:
    inventory = inventory_for("l4x8", "vgpu-partitions")
    device = inventory.device_by_name["gpu-0-vgpu-1gi-0"]
    raw = result(device.name, {"memory": "2Gi"})

    with pytest.raises(ClaimRejected) as refused:
        vgpu_grant(allocated(raw), device, inventory.gpu_of_device[device.name], VgpuConfig())

    assert str(refused.value) == (
        f'{RESULTS}[0].consumedCapacity.memory: "2Gi" is more than the 1Gi of device gpu-0-vgpu-1gi-0'
    )


def test_a_share_refuses_limits_hami_core_would_read_as_none() -> None:
    gpu = l4(0)

    with pytest.raises(ValueError, match=r"^gpu-0: 1048575 bytes is not between 1Mi and "):
        VgpuGrant("gpu-0", gpu, MIB - 1, 50, None, VgpuConfig())
    with pytest.raises(ValueError, match=r"^gpu-0: 0 cores is not between 1 and 100$"):
        VgpuGrant("gpu-0", gpu, GIB, 0, None, VgpuConfig())


# --- The environment -------------------------------------------------------------------------


def test_indices_follow_the_bus_order_whatever_the_input_and_minor_order() -> None:
    # Minor 2 sits on a later bus than minor 5, and comes first in the claim.
    late, early = l4(2, "0000:c1:00.0"), l4(5, "0000:07:00.0")
    shares = [
        capacity_share(late, {"memory": "10Gi", "cores": "50"}),
        capacity_share(early, {"memory": "4Gi", "cores": "30"}, position=1),
    ]

    assert env_of(shares) == (
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_DEVICE_MEMORY_LIMIT_0=4096m",
        "CUDA_DEVICE_SM_LIMIT_0=30",
        "CUDA_DEVICE_MEMORY_LIMIT_1=10240m",
        "CUDA_DEVICE_SM_LIMIT_1=50",
        *DEFAULT_SETTINGS,
    )
    assert env_of(shares[::-1]) == env_of(shares)


def test_bus_ids_compare_as_numbers() -> None:
    # As text, "0000:3B" sorts before "0000:3a"; CUDA goes by the number.
    shares = [
        capacity_share(l4(0, "0000:3B:00.0"), {"cores": "10"}),
        capacity_share(l4(1, "0000:3a:00.0"), {}),
    ]

    assert env_of(shares)[2] == "CUDA_DEVICE_SM_LIMIT_0=100"


def test_without_bus_ids_the_minor_number_decides() -> None:
    shares = [capacity_share(l4(6, ""), {"cores": "60"}), capacity_share(l4(3, ""), {"cores": "30"})]

    assert env_of(shares)[2::2][:2] == ("CUDA_DEVICE_SM_LIMIT_0=30", "CUDA_DEVICE_SM_LIMIT_1=60")


def test_memory_limits_round_down_to_whole_mib() -> None:
    share = capacity_share(l4(0), {"memory": "1500000000"})

    # 1430.51 MiB: the container may use 1430 MiB, never the half MiB it was not granted.
    assert env_of([share])[1] == "CUDA_DEVICE_MEMORY_LIMIT_0=1430m"


def test_the_vgpu_config_settings_are_merged_in() -> None:
    config = VgpuConfig(
        memory_oversubscription=True, core_limit_policy="Force", task_priority=0, oom_killer=True
    )
    shares = [replace(capacity_share(l4(minor), {}), config=config) for minor in (0, 1)]

    assert env_of(shares)[5:] == (
        "CUDA_OVERSUBSCRIBE=true",
        "GPU_CORE_UTILIZATION_POLICY=force",
        "CUDA_TASK_PRIORITY=0",
        "ACTIVE_OOM_KILLER=true",
    )


def test_vgpus_of_one_claim_need_the_same_settings() -> None:
    first = capacity_share(l4(0), {})
    second = replace(capacity_share(l4(1), {}), config=VgpuConfig(task_priority=0))

    with pytest.raises(ClaimRejected) as refused:
        check_claim_grants([first, second])

    assert str(refused.value) == (
        "devices gpu-0 and gpu-1 have different VgpuConfigs; HAMi-core applies one setting to "
        "every GPU of a process, so all vGPUs of a claim need the same VgpuConfig"
    )


def test_two_shares_of_one_gpu_are_refused() -> None:
    gpu = l4(4)
    device = shareable(gpu)
    shares = [
        capacity_share(l4(1), {}),
        vgpu_grant(
            allocated(result("gpu-4", {"memory": "1Gi"}, SHARE_ID), 1), device, gpu, VgpuConfig(), "hami-core"
        ),
        vgpu_grant(
            allocated(result("gpu-4", {"memory": "2Gi"}, UID), 2), device, gpu, VgpuConfig(), "hami-core"
        ),
    ]

    with pytest.raises(ClaimRejected) as refused:
        check_claim_grants(shares)

    assert str(refused.value) == (
        f"devices gpu-4 and gpu-4 are both shares of {gpu.label}; a claim takes at most one share of a GPU, "
        "because HAMi-core sets one limit per GPU a container sees and the container sees that GPU once; "
        "ask for one larger share"
    )


def test_two_partitions_of_one_gpu_are_refused() -> None:
    inventory = inventory_for("l4x8", "vgpu-partitions")
    shares = [
        vgpu_grant(
            allocated(result(name), position),
            inventory.device_by_name[name],
            inventory.gpu_of_device[name],
            VgpuConfig(),
            "hami-core",
        )
        for position, name in enumerate(("gpu-2-vgpu-1gi-0", "gpu-2-vgpu-5gi-0"))
    ]

    with pytest.raises(
        ClaimRejected, match=r"^devices gpu-2-vgpu-1gi-0 and gpu-2-vgpu-5gi-0 are both shares of"
    ):
        check_claim_grants(shares)


def test_a_claim_without_shares_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match=r"^a claim without vGPU shares needs no vGPU edits$"):
        vgpu_claim_edits(UID, [], HAMI, None)


# --- Enforcement ----------------------------------------------------------------------------


def test_with_hami_core_the_library_is_preloaded_and_the_claim_gets_its_own_directory() -> None:
    share = capacity_share(l4(0), {"memory": "8Gi", "cores": "40"})
    claim_dir = PurePosixPath(f"/var/lib/dra/vgpu/claims/{UID}")

    edits = hami_edits(UID, [share], HAMI)

    assert edits.edits.env == (
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_DEVICE_MEMORY_LIMIT_0=8192m",
        "CUDA_DEVICE_SM_LIMIT_0=40",
        *DEFAULT_SETTINGS,
        f"CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/cache/{UID}.cache",
    )
    assert edits.edits.mounts == (
        Mount("/opt/hami/libvgpu.so", "/usr/local/vgpu/libvgpu.so", ("ro", "nosuid", "nodev", "bind")),
        Mount(f"{claim_dir}/ld.so.preload", "/etc/ld.so.preload", ("ro", "nosuid", "nodev", "bind")),
        Mount(f"{claim_dir}/cache", "/usr/local/vgpu/cache", ("rw", "nosuid", "nodev", "noexec", "bind")),
        Mount("/var/lib/dra/vgpu/vgpulock", "/tmp/vgpulock", ("rw", "nosuid", "nodev", "noexec", "bind")),
    )
    assert edits.edits.device_nodes == ()
    assert edits.host_entries == (
        HostDirectory(claim_dir, 0o755),
        HostFile(claim_dir / "ld.so.preload", "/usr/local/vgpu/libvgpu.so\n", 0o644),
        HostDirectory(claim_dir / "cache", 0o777),
        HostDirectory(PurePosixPath("/var/lib/dra/vgpu/vgpulock"), 0o1777),
    )
    assert edits.claim_dir == claim_dir


def test_without_hami_core_the_limits_are_advisory_only() -> None:
    share = capacity_share(l4(0), {"memory": "8Gi", "cores": "40"})

    edits = hami_edits(UID, [share], None)

    assert edits.edits.env == (
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_DEVICE_MEMORY_LIMIT_0=8192m",
        "CUDA_DEVICE_SM_LIMIT_0=40",
        *DEFAULT_SETTINGS,
    )
    assert (edits.edits.mounts, edits.host_entries, edits.claim_dir) == ((), (), None)


@pytest.mark.parametrize("uid", ["../../etc", UID.upper(), f"{UID}/x", ""])
def test_a_claim_uid_that_is_not_a_uuid_names_no_directory(uid: str) -> None:
    share = capacity_share(l4(0), {})

    with pytest.raises(ClaimRejected) as refused:
        hami_edits(uid, [share], HAMI)

    assert str(refused.value) == (
        f"claim UID: {uid!r} is not a Kubernetes UID (a lowercase UUID like {UID}); "
        "refusing to name a host directory after it"
    )


@pytest.mark.parametrize(
    ("library", "state_dir", "message"),
    [
        ("libvgpu.so", "/var/lib/dra/vgpu", "HAMi-core library 'libvgpu.so' is not an absolute path"),
        ("/opt/hami/libvgpu.so", "vgpu", "HAMi-core state_dir 'vgpu' is not an absolute path"),
    ],
)
def test_hami_core_paths_are_absolute(library: str, state_dir: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        HamiCore(PurePosixPath(library), PurePosixPath(state_dir))


def test_the_enforcement_off_message_names_the_gpus() -> None:
    gpus = simulated_node("l4x8")[:2]

    assert enforcement_off_message(gpus) == (
        f"vGPU enforcement is off for {gpus[0].label}, {gpus[1].label}: their vgpu.enforcement is none, "
        "so a container gets its memory and SM limits only as advisory environment variables and nothing "
        "stops it from using the whole GPU"
    )


# --- Property: the index of a limit is the GPU's place in bus order ---------------------------


def bus_key(gpu: Gpu) -> tuple[int, ...]:
    return tuple(int(part, 16) for part in re.split(r"[:.]", gpu.pci_bus_id))


@st.composite
def claim_shares(draw: st.DrawFn) -> list[VgpuGrant]:
    """Shares of distinct GPUs of one simulated node, its bus ids shuffled, in random order."""
    gpus = simulated_node(draw(st.sampled_from(all_profiles())))
    bus_ids = draw(st.permutations([gpu.pci_bus_id for gpu in gpus]))
    chosen = draw(st.lists(st.sampled_from(range(len(gpus))), min_size=1, unique=True))
    config = VgpuConfig(
        memory_oversubscription=draw(st.booleans()),
        core_limit_policy=draw(st.sampled_from(["Default", "Force", "Disable"])),
        task_priority=draw(st.integers(0, 1)),
        oom_killer=draw(st.booleans()),
    )
    shares = []
    for position in chosen:
        gpu = replace(gpus[position], pci_bus_id=bus_ids[position])
        memory = draw(st.integers(MIB, gpu.memory_bytes))
        shares.append(VgpuGrant(f"gpu-{gpu.minor}", gpu, memory, draw(st.integers(1, 100)), None, config))
    return shares


@given(shares=claim_shares(), enforced=st.booleans())
def test_each_index_carries_the_limits_of_the_gpu_at_that_place_in_bus_order(
    shares: list[VgpuGrant], enforced: bool
) -> None:
    env = hami_edits(UID, shares, HAMI if enforced else None).edits.env

    names = [entry.split("=", 1)[0] for entry in env]
    assert len(names) == len(set(names))
    values = dict(entry.split("=", 1) for entry in env)
    memory_indices = sorted(int(name.rsplit("_", 1)[1]) for name in names if "MEMORY_LIMIT_" in name)
    sm_indices = sorted(int(name.rsplit("_", 1)[1]) for name in names if "SM_LIMIT_" in name)
    assert memory_indices == sm_indices == list(range(len(shares)))
    for index, share in enumerate(sorted(shares, key=lambda share: bus_key(share.gpu))):
        mib = int(values[f"CUDA_DEVICE_MEMORY_LIMIT_{index}"].removesuffix("m"))
        assert mib * MIB <= share.memory_bytes < (mib + 1) * MIB
        assert values[f"CUDA_DEVICE_SM_LIMIT_{index}"] == str(share.cores)
    assert values["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


# --- vgpu.enforcement mps ---------------------------------------------------------------------


MPS_DIR = Path("/run/dra-driver/mps")


def mps_share_edits(granted: VgpuGrant) -> ContainerEdits:
    """What the protocol hands vgpu_claim_edits for a node whose MPS daemons live under MPS_DIR."""
    return vgpu_share_mps_edits(MPS_DIR, granted.gpu.uuid, granted.cores, granted.memory_bytes)


def test_under_mps_a_share_reaches_its_gpus_daemon_with_its_own_limits_as_client_settings() -> None:
    gpu = l4(0)
    share = replace(capacity_share(gpu, {"memory": "8Gi", "cores": "25"}), enforcement="mps")
    daemon = MPS_DIR / gpu.uuid.removeprefix("GPU-")

    edits = vgpu_claim_edits(UID, [share], HAMI, mps_share_edits)

    assert edits.edits.env == (
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M",
    )
    assert [(m.host_path, m.container_path) for m in edits.edits.mounts] == [
        (str(daemon / "pipe"), "/tmp/nvidia-mps"),
        (str(daemon / "shm"), "/dev/shm"),
    ]
    assert edits.host_entries == () and edits.claim_dir is None, "no HAMi-core under mps"


def test_under_mps_the_memory_limit_is_rounded_down_to_whole_mib() -> None:
    share = replace(capacity_share(l4(0), {}), memory_bytes=3 * GIB + MIB - 1, enforcement="mps")

    env = vgpu_claim_edits(UID, [share], None, mps_share_edits).edits.env

    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M" in env


def test_a_share_under_mps_must_be_its_claims_only_device() -> None:
    share = replace(capacity_share(l4(3), {}), enforcement="mps")

    with pytest.raises(ClaimRejected) as refused:
        check_claim_grants([share], ["gpu-5"])

    assert str(refused.value).startswith(
        f"device gpu-3 is a vGPU share enforced by MPS (vgpu.enforcement: mps on {l4(3).label}), so it must "
        "be the claim's only device, but the claim also has gpu-5: a process reaches one MPS server"
    )


def test_shares_of_gpus_with_different_enforcement_are_refused_together() -> None:
    first = replace(capacity_share(l4(0), {}), enforcement="none")
    second = capacity_share(l4(1), {})

    with pytest.raises(ClaimRejected, match=r"different vgpu.enforcement \(none on GPU 0"):
        check_claim_grants([first, second])


def test_hami_core_enforcement_without_the_library_is_refused_with_what_to_do() -> None:
    share = capacity_share(l4(0), {})

    with pytest.raises(ClaimRejected, match=r"vgpu.enforcement is hami-core on .* no --hami-core-library"):
        vgpu_claim_edits(UID, [share], None, mps_share_edits)
