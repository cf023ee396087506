"""The MPS control daemon of each GPU whose vGPU shares MPS enforces (`vgpu.enforcement: mps`).

One daemon per GPU, shared by every share on it: MPS gives each GPU one server, and a second
daemon on the same GPU would only queue behind the first. A share's own limits travel with its
clients (sharing.vgpu_share_mps_edits), so the daemon needs no per-share settings, and it is
started and stopped by whichever agent process prepares or unprepares a share on its GPU.

Which claims use a GPU's daemon is in the durable claim records alone (`ClaimRecord.mps_gpus`,
written "preparing" before the daemon is started), never in this process's memory: a restarted
agent, or the other agent of a rolling update, decides from the same records. A per-GPU lock (a
key of the node's shared claim locks) serialises "count the GPU's shares, then start or stop its
daemon", so a prepare and the last unprepare on one GPU cannot cross: the daemon starts before
the first share's prepare returns and stops only after the last share's unprepare.

The daemon itself runs in the same runner, directories and pods as a claim's daemon would, keyed
by the GPU (sharing.gpu_daemon_key) instead of a claim UID.
"""

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import replace

import structlog

from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.opaque_config import OpaqueConfigError
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.sharing.mps import MpsDaemonRunner
from dra_driver.claims.sharing.sharing import gpu_daemon_key, gpu_daemon_spec
from dra_driver.devices.vgpu import MPS_CLIENTS_PER_GPU
from dra_driver.hardware.model import HardwareError
from dra_driver.state import failpoints
from dra_driver.state.shared_locks import ClaimLocks

log = structlog.get_logger("dra_driver.claims")

# A GPU's daemon state for metrics and health: True answering, False dead or failed to start,
# None stopped with the GPU's last share.
DaemonReport = Callable[[str, bool | None], None]


def _lock_key(gpu_uuid: str) -> str:
    """The GPU's key in the shared claim locks (hashed, so any string; no claim UID has this form)."""
    return f"gpu-mps/{gpu_uuid}"


class GpuMpsDaemons:
    """`read_records`: every claim record on disk now (other agent processes write them too);
    `write_record`: the durable write of one claim's record."""

    def __init__(
        self,
        runner: MpsDaemonRunner,
        locks: ClaimLocks,
        read_records: Callable[[], Mapping[str, ClaimRecord]],
        write_record: Callable[[ClaimRecord], Awaitable[None]],
        report: DaemonReport,
    ) -> None:
        self._runner = runner
        self._locks = locks
        self._read_records = read_records
        self._write_record = write_record
        self._report = report

    async def attach(self, ref: ClaimRef, gpu_uuid: str) -> None:
        """Makes sure the GPU's daemon answers before the claim's prepare returns: started for
        the GPU's first share, restarted if it died. The claim's record names the GPU already.
        Refused when the GPU already has as many shares as one MPS server takes clients."""
        key = self._key(gpu_uuid)
        async with self._locks.hold(_lock_key(gpu_uuid)):
            others = await self._users(gpu_uuid, ref.uid)
            if len(others) >= MPS_CLIENTS_PER_GPU:
                raise ClaimRejected(
                    f"claim {ref}: GPU {gpu_uuid} already has {len(others)} prepared vGPU shares under "
                    f"vgpu.enforcement mps, and one MPS server takes at most {MPS_CLIENTS_PER_GPU} clients "
                    "per GPU (Volta and later); each share is at least one client"
                )
            was_running = await self._runner.is_running(key)
            if not was_running and others:
                log.error(
                    "the MPS daemon of a GPU with prepared vGPU shares had died; restarting it (the "
                    "shares' running pods lost their MPS server and need a restart)",
                    gpu=gpu_uuid,
                    claims=sorted(others),
                )
            try:
                await self._runner.start(gpu_daemon_spec(self._runner.runtime_dir, gpu_uuid))
            except HardwareError as error:
                self._report(gpu_uuid, False)
                raise ClaimRejected(
                    f"claim {ref}: the MPS control daemon of GPU {gpu_uuid}, which enforces its vGPU "
                    f"shares (vgpu.enforcement: mps), did not start: {error}; the next prepare on this "
                    "GPU tries again"
                ) from error
            failpoints.reached("prepare.gpu-mps-started")
            self._report(gpu_uuid, True)

    async def detach(self, record: ClaimRecord, gpu_uuid: str) -> ClaimRecord:
        """Stops the GPU's daemon if no other claim's record names the GPU, then, still under the
        GPU's lock, writes the claim's record ("preparing": it is being undone) without the GPU,
        so that a share unprepared at the same time counts this one as gone: otherwise each of
        two last shares would see the other and neither would stop the daemon. A crash between
        the two leaves a record that names the GPU and the rollback after it repeats this.
        Returns the record as written."""
        key = self._key(gpu_uuid)
        claim_uid = record.claim.uid
        async with self._locks.hold(_lock_key(gpu_uuid)):
            if not await self._users(gpu_uuid, claim_uid):
                await self._runner.stop(key)
                failpoints.reached("unprepare.gpu-mps-stopped")
                self._report(gpu_uuid, None)
                log.info("MPS daemon of a GPU stopped with its last vGPU share", gpu=gpu_uuid)
            left = replace(
                record, state="preparing", mps_gpus=tuple(g for g in record.mps_gpus if g != gpu_uuid)
            )
            await self._write_record(left)
            return left

    async def daemon_keys(self, gpu_uuids: Collection[str]) -> dict[str, str]:
        """The daemon key of every GPU that has or may have a daemon (`gpu_uuids`, the node's,
        and those the records name), to tell GPU daemons from claim daemons."""
        records = await asyncio.to_thread(self._read_records)
        return self._keys(set(gpu_uuids) | {gpu for record in records.values() for gpu in record.mps_gpus})

    def _keys(self, gpu_uuids: Collection[str]) -> dict[str, str]:
        keys = {}
        for gpu_uuid in gpu_uuids:
            try:
                keys[gpu_daemon_key(gpu_uuid)] = gpu_uuid
            except OpaqueConfigError:
                continue  # such a GPU never gets a daemon (refused at prepare)
        return keys

    async def reconcile(self, gpu_uuids: Collection[str]) -> None:
        """At start: stops the daemon of every GPU no record names (a crash between stopping the
        last share's record and its daemon, or before a first share's record was written), and
        reports each GPU whose shares' daemon does not answer (it is restarted at the next prepare
        on that GPU; running pods of those shares need a restart)."""
        records = await asyncio.to_thread(self._read_records)
        named = {gpu for record in records.values() for gpu in record.mps_gpus}
        keys = self._keys(set(gpu_uuids) | named)
        present = await self._runner.leftover_claim_uids()
        for key, gpu_uuid in sorted(keys.items()):
            if gpu_uuid not in named:
                if key in present:
                    async with self._locks.hold(_lock_key(gpu_uuid)):
                        if not await self._users(gpu_uuid, None):
                            log.info("stopping the MPS daemon of a GPU no vGPU share uses", gpu=gpu_uuid)
                            await self._runner.stop(key)
                continue
            up = await self._runner.is_running(key)
            self._report(gpu_uuid, up)
            if not up:
                log.error(
                    "the MPS daemon of a GPU with prepared vGPU shares is not running; the next prepare "
                    "on the GPU restarts it, and the shares' pods need a restart",
                    gpu=gpu_uuid,
                )

    def _key(self, gpu_uuid: str) -> str:
        try:
            return gpu_daemon_key(gpu_uuid)
        except OpaqueConfigError as error:
            raise ClaimRejected(str(error)) from error

    async def _users(self, gpu_uuid: str, except_claim: str | None) -> set[str]:
        """The claims whose record (prepared or preparing) names the GPU's daemon."""
        records = await asyncio.to_thread(self._read_records)
        return {uid for uid, record in records.items() if gpu_uuid in record.mps_gpus and uid != except_claim}
