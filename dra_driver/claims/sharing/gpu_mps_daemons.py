"""The MPS control daemon of each GPU whose vGPU shares MPS enforces (`vgpu.enforcement: mps`).

One daemon per GPU, shared by every share on it: MPS gives each GPU one server, and a second
daemon on the same GPU would only queue behind the first. A share's own limits travel with its
clients (sharing.vgpu_share_mps_edits), so the daemon needs no per-share settings, and it is
started and stopped by whichever agent process prepares or unprepares a share on its GPU.

Which claims use a GPU's daemon is in the durable claim records (their `GpuMpsEntry`s,
written "preparing" before the daemon is started): a restarted agent, or the other agent of a
rolling update, decides from the same records. A per-GPU lock (a key of the node's shared claim
locks) serialises "count the GPU's shares, then start or stop its daemon", so a prepare and the
last unprepare on one GPU cannot cross: the daemon starts before the first share's prepare
returns and stops only after the last share's unprepare.

Counting does not read the records each time (every record on the node, on every share's
prepare and unprepare: the cost grew with the claims). This process keeps each GPU's users in
memory, read from the records at start (or at a GPU's first use) and changed under the GPU's lock
where the records change; a per-GPU change counter (state.change_counters), bumped under the
same lock after each change, tells it when a peer process changed them, and it reads the records
afresh then. The records stay the truth: a restarted process starts from them.

A daemon that dies while its shares run is found by `probe`, which the agent runs every
`--mps-probe-interval` seconds off the prepare path: the metric and the device health of the
shares show it until the next prepare on the GPU restarts it.

The daemon itself runs in the same runner, directories and pods as a claim's daemon would, keyed
by the GPU (sharing.gpu_daemon_key) instead of a claim UID.
"""

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping

import structlog
from msgspec.structs import replace

from dra_driver.claims.effect_entries import GpuMpsEntry
from dra_driver.claims.errors import ClaimRejected
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.opaque_config import OpaqueConfigError
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.sharing.mps import MpsDaemonRunner
from dra_driver.claims.sharing.sharing import gpu_daemon_key, gpu_daemon_spec
from dra_driver.devices.vgpu import MPS_CLIENTS_PER_GPU
from dra_driver.hardware.model import HardwareError
from dra_driver.state import failpoints
from dra_driver.state.change_counters import ChangeCounters
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
    `write_record`: the durable write of one claim's record; `changes`: the per-GPU change
    counters every agent process on the node shares."""

    def __init__(
        self,
        runner: MpsDaemonRunner,
        locks: ClaimLocks,
        read_records: Callable[[], Mapping[str, ClaimRecord]],
        write_record: Callable[[ClaimRecord], Awaitable[None]],
        report: DaemonReport,
        changes: ChangeCounters,
    ) -> None:
        self._runner = runner
        self._locks = locks
        self._read_records = read_records
        self._write_record = write_record
        self._report = report
        self._changes = changes
        # Each GPU's users (claims whose record names it), valid while its change counter is the
        # one in `_seen`; a GPU not in `_seen` is read from the records at its first use.
        self._users_of: dict[str, set[str]] = {}
        self._seen: dict[str, int] = {}

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
            self._changed(gpu_uuid, add=ref.uid)
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
            left = replace(record.without((GpuMpsEntry(gpu_uuid),)), state="preparing")
            await self._write_record(left)
            self._changed(gpu_uuid, remove=claim_uid)
            return left

    async def daemon_keys(self, gpu_uuids: Collection[str]) -> dict[str, str]:
        """The daemon key of every GPU that has or may have a daemon (`gpu_uuids`, the node's,
        and those the records name), to tell GPU daemons from claim daemons."""
        records = await asyncio.to_thread(self._read_records)
        return self._keys(set(gpu_uuids) | {gpu for record in records.values() for gpu in _gpus_of(record)})

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
        counters = {gpu: self._changes.read(key) for key, gpu in self._keys(gpu_uuids).items()}
        records = await asyncio.to_thread(self._read_records)
        named = {gpu for record in records.values() for gpu in _gpus_of(record)}
        keys = self._keys(set(gpu_uuids) | named)
        for gpu_uuid, counter in counters.items():  # read before the records: a later change shows
            self._learn(gpu_uuid, counter, records)
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

    async def probe(self) -> None:
        """Reports whether the daemon of each GPU with shares answers, so that one that died while
        nothing was prepared shows in the metric and the shares' device health. Each GPU under its
        lock: a daemon stopped with its GPU's last share meanwhile is not taken for a dead one."""
        for gpu_uuid, seen in sorted(self._seen.items()):
            if not self._users_of[gpu_uuid] and self._changes.read(self._key(gpu_uuid)) == seen:
                continue  # no share, and no peer process changed that: no daemon to look at
            async with self._locks.hold(_lock_key(gpu_uuid)):
                if await self._users(gpu_uuid, None):
                    self._report(gpu_uuid, await self._runner.is_running(self._key(gpu_uuid)))

    async def _users(self, gpu_uuid: str, except_claim: str | None) -> set[str]:
        """The claims whose record (prepared or preparing) names the GPU's daemon; call it under
        the GPU's lock. From memory unless a peer process changed them since this one looked."""
        counter = self._changes.read(self._key(gpu_uuid))
        if self._seen.get(gpu_uuid) != counter:
            self._learn(gpu_uuid, counter, await asyncio.to_thread(self._read_records))
        return self._users_of[gpu_uuid] - {except_claim}

    def _learn(self, gpu_uuid: str, counter: int, records: Mapping[str, ClaimRecord]) -> None:
        """The GPU's users as `records` name them, valid while its counter is `counter` (read
        before the records)."""
        self._users_of[gpu_uuid] = {uid for uid, record in records.items() if gpu_uuid in _gpus_of(record)}
        self._seen[gpu_uuid] = counter

    def _changed(self, gpu_uuid: str, *, add: str | None = None, remove: str | None = None) -> None:
        """Records the change this process made to the GPU's users (after its record write, under
        the GPU's lock) and tells peer processes, which read the records afresh."""
        users = self._users_of.setdefault(gpu_uuid, set())
        if add is not None:
            users.add(add)
        if remove is not None:
            users.discard(remove)
        self._seen[gpu_uuid] = self._changes.bump(self._key(gpu_uuid))


def _gpus_of(record: ClaimRecord) -> tuple[str, ...]:
    """The GPUs whose daemons the claim's shares go through."""
    return tuple(entry.gpu_uuid for entry in record.entries(GpuMpsEntry))
