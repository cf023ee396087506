"""The HAMi-core directory keeps the side-effect contract (effects/contract.py) like every other
effect: `apply` makes it from its action, `undo` removes it, safe to repeat and for a claim that
never had one, and start-up finds it by claim UID for any record to own, since no entry names
it (`recorded` False, so `entries` leaves it out)."""

import asyncio
from collections.abc import Awaitable
from pathlib import Path, PurePosixPath

from dra_driver.claims.edits.vgpu_edits import HamiCore, HostDirectory, HostFile
from dra_driver.claims.effects.hami_core import HamiCoreDirectories, HamiCoreHostEntries
from dra_driver.claims.identity import ClaimRef
from dra_driver.claims.records import ClaimRecord

UID = "3f1c7a52-9c1e-4e43-9d57-4c6f3f1e2a10"
REF = ClaimRef("default", "vgpu", UID)


async def _awaited(pending: Awaitable[set[str]]) -> set[str]:
    return await pending


def action(hami: HamiCore) -> HamiCoreHostEntries:
    claim_dir = hami.claim_dir(UID)
    return HamiCoreHostEntries(
        (
            HostDirectory(claim_dir, 0o755),
            HostFile(claim_dir / "ld.so.preload", "/usr/local/vgpu/libvgpu.so\n", 0o644),
            HostDirectory(claim_dir / "cache", 0o777),
        )
    )


def test_apply_makes_the_directory_undo_removes_it_and_start_up_finds_it_by_uid(tmp_path: Path) -> None:
    hami = HamiCore(PurePosixPath(tmp_path / "libvgpu.so"), PurePosixPath(tmp_path / "vgpu"))
    effect = HamiCoreDirectories(hami)
    claim_dir = Path(hami.claim_dir(UID))
    record = ClaimRecord(claim=REF, devices=())

    assert effect.mine([action(hami), object()]) == [action(hami)]
    assert asyncio.run(effect.apply(REF, [action(hami)])) == {}
    assert (claim_dir / "ld.so.preload").read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert (claim_dir / "cache").is_dir()
    leftovers = effect.leftovers()
    assert asyncio.run(_awaited(leftovers.claim_uids())) == {UID}
    assert leftovers.owned_by(record), "any record of the claim owns it"

    assert asyncio.run(effect.undo(record)) == record
    assert not claim_dir.exists()
    asyncio.run(effect.undo(record))  # again, and for a claim that never had one
    assert asyncio.run(_awaited(leftovers.claim_uids())) == set()
    assert not HamiCoreDirectories.recorded
