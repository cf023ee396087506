"""Device health from the GPUs' MPS control daemons (vGPU shares under `vgpu.enforcement: mps`).

A GPU's daemon that dies takes the MPS server of every share prepared on that GPU with it: their
pods' CUDA work fails until they are restarted, although the GPU itself is sound. This is a
second, separate input to the devices' health, beside the GPU's own condition (tracker): pure,
so each transition is testable without daemons or clocks, and kept apart from the XID state
because it neither decays with time nor taints anything.

Which devices: only those the GPU's prepared shares were allocated from, not every vGPU device
of the GPU. Those are the devices whose pods lost their server, which is what kubelet reports
per pod; a device with no prepared share is fine to allocate, since the next prepare on the GPU
restarts the daemon (with `vgpu-capacity` the GPU's one shared device is the share's device
anyway). Whole GPUs and the devices of other GPUs are never affected: each GPU has its own daemon.

No taint: a NoSchedule taint would keep off the very prepare that restarts the daemon, and the
shares' pods are not evicted by it either (NoExecute would evict the pods of every share on the
GPU, also those started after a restart). Unhealthy on the kubelet stream shows in the affected
pods' status, which is where the one remedy, restarting them, applies.
"""

from collections.abc import Mapping
from datetime import UTC, datetime

import msgspec
from msgspec.structs import replace


class DaemonState(msgspec.Struct, frozen=True):
    """Whether a GPU's daemon answers, as last reported, and since when."""

    down: bool
    since: float
    # What names the daemon to an operator: its pod is mps-<name>, its directory <mps-dir>/<name>.
    name: str


class GpuDaemons(msgspec.Struct, frozen=True):
    """The daemons of the node's GPUs as device health needs them: a GPU is absent until its
    daemon is first reported down, and stays (answering again) afterwards, so that its devices
    say when they became healthy again."""

    states: Mapping[str, DaemonState] = msgspec.field(default_factory=dict)
    # By GPU: the devices its prepared vGPU shares were allocated from, as of the last report.
    share_devices: Mapping[str, frozenset[str]] = msgspec.field(default_factory=dict)

    def reported(self, gpu_uuid: str, up: bool | None, name: str, at: float) -> "GpuDaemons":
        """After a report at `at`: `up` None means stopped with the GPU's last share, which leaves
        no share to be unhealthy, as answering does."""
        down = up is False
        before = self.states.get(gpu_uuid)
        if (before is None and not down) or (before is not None and before.down == down):
            return self
        return replace(self, states={**self.states, gpu_uuid: DaemonState(down, at, name)})

    def with_share_devices(self, share_devices: Mapping[str, frozenset[str]]) -> "GpuDaemons":
        """Only the GPUs with a state matter; the rest are left out so that equal health compares equal."""
        relevant = {gpu: devices for gpu, devices in share_devices.items() if gpu in self.states and devices}
        return self if relevant == self.share_devices else replace(self, share_devices=relevant)

    def affecting(self, gpu_uuid: str, device_name: str) -> DaemonState | None:
        """The state of the daemon that `device_name` of `gpu_uuid` depends on, if it has one."""
        state = self.states.get(gpu_uuid)
        if state is None or device_name not in self.share_devices.get(gpu_uuid, frozenset()):
            return None
        return state


def _timestamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def down_message(gpu_uuid: str, state: DaemonState) -> str:
    """What an operator reads on the pod: which daemon, since when, what it means, what to do."""
    return (
        f"the MPS control daemon {state.name} of GPU {gpu_uuid} (vgpu.enforcement: mps) has not answered "
        f"since {_timestamp(state.since)}: pods of vGPU shares prepared on this GPU lost their MPS server; "
        "restart them (the next prepare of a share on this GPU restarts the daemon)"
    )
