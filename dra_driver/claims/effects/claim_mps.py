"""A claim's own MPS control daemon (sharing.strategy MPS on its devices), found by claim UID.

The record says only that the claim has one: the daemon's directories follow from the claim UID,
so the undo, and start-up's sweep of daemons no record owns, need nothing else.
"""

from collections.abc import Callable, Collection, Mapping, Sequence

import structlog

from dra_driver.claims.effect_entries import ClaimMpsEntry, EffectEntry
from dra_driver.claims.effects.contract import Leftovers, Made, SideEffect
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord
from dra_driver.claims.sharing.gpu_mps_daemons import GpuMpsDaemons
from dra_driver.claims.sharing.mps import MpsDaemonRunner
from dra_driver.claims.sharing.sharing import MpsDaemonSpec
from dra_driver.state import failpoints

log = structlog.get_logger("dra_driver.claims")


class ClaimMpsDaemons(SideEffect[MpsDaemonSpec]):
    action_type = MpsDaemonSpec

    def __init__(
        self, runner: MpsDaemonRunner, gpu_mps: GpuMpsDaemons | None, gpu_uuids: Callable[[], Collection[str]]
    ) -> None:
        """`gpu_mps`, `gpu_uuids`: the GPUs' own daemons (run by the same runner), which are not
        claims' and are left to gpu_mps_share."""
        self._runner = runner
        self._gpu_mps = gpu_mps
        self._gpu_uuids = gpu_uuids

    def entry(self, action: MpsDaemonSpec) -> EffectEntry:
        return ClaimMpsEntry()

    async def apply(self, ref: ClaimRef, actions: Sequence[MpsDaemonSpec]) -> Made:
        for spec in actions:
            await self._runner.start(spec)
            failpoints.reached("prepare.mps-started")
        return {}

    async def undo(self, record: ClaimRecord) -> ClaimRecord:
        if record.entries(ClaimMpsEntry):
            await self._runner.stop(record.claim.uid)
        return record

    def leftovers(self) -> Leftovers:
        return Leftovers(
            self._claim_daemon_uids, self._stop, lambda record: bool(record.entries(ClaimMpsEntry))
        )

    async def _claim_daemon_uids(self) -> set[str]:
        """The runner's daemons less the GPUs' (gpu_mps_share looks after those)."""
        found = await self._runner.leftover_claim_uids()
        if self._gpu_mps is None:
            return found
        return found - set(await self._gpu_mps.daemon_keys(self._gpu_uuids()))

    async def _stop(self, claim_uid: str) -> None:
        log.info("stopping an MPS daemon no prepared claim owns", claim_uid=claim_uid)
        await self._runner.stop(claim_uid)

    async def at_start(self, records: Mapping[str, ClaimRecord]) -> None:
        """A prepared claim whose daemon is gone (with --mps-daemons process, the agent's
        container was restarted, and the daemon with it; in a pod, the daemon died)."""
        for record in records.values():
            if record.entries(ClaimMpsEntry) and not await self._runner.is_running(record.claim.uid):
                log.error(
                    "the MPS daemon of a prepared claim is gone; restart the claim's pods",
                    claim_namespace=record.claim.namespace,
                    claim_name=record.claim.name,
                    claim_uid=record.claim.uid,
                )
