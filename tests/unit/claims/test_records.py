import json
import os
import time
from pathlib import Path

import pytest
from msgspec.structs import replace

from dra_driver.claims.effect_entries import ClaimMpsEntry, ComputeModeEntry, MigInstanceEntry
from dra_driver.claims.identity import claim_ref
from dra_driver.claims.record_codec import record_from_json, record_to_json
from dra_driver.claims.record_store import ABANDONED_WRITE_SECONDS, ClaimRecordStore
from dra_driver.claims.records import ClaimRecord, CorruptRecord, DeviceFacts, PreparedDevice

UID = "3f9c1e52-7a4b-4d2e-9b61-0c8d5e2f4a17"
RECORD = ClaimRecord(
    claim=claim_ref("default", "c", UID),
    devices=(
        PreparedDevice(
            request_names=("gpu",), pool="n", device="gpu-0", cdi_device_ids=(f"k8s.x/claim={UID}-gpu-0",)
        ),
    ),
)


def test_records_round_trip_through_files(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.save(RECORD)

    records, quarantined = ClaimRecordStore(tmp_path).load_all()

    assert records == {UID: RECORD}
    assert quarantined == []
    assert oct((tmp_path / "claims" / f"{UID}.json").stat().st_mode & 0o777) == "0o600"


def test_deleting_twice_is_fine(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.save(RECORD)
    store.delete(UID)
    store.delete(UID)
    assert store.load_all() == ({}, [])


def test_unreadable_records_are_set_aside_and_named(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.save(RECORD)
    other = "0e5a4b1c-2d3e-4f50-8a6b-7c8d9e0f1a2b"
    (store.directory / f"{other}.json").write_text('{"version": 1, "claim": {"namespace": "x"')
    wrong_name = record_to_json(RECORD)
    (store.directory / "0e5a4b1c-0000-4f50-8a6b-7c8d9e0f1a2b.json").write_text(json.dumps(wrong_name))
    bad_version = {**record_to_json(RECORD), "version": 99}
    (store.directory / "11111111-2222-4333-8444-555555555555.json").write_text(json.dumps(bad_version))

    records, quarantined = store.load_all()

    assert records == {UID: RECORD}
    problems = {q.path.name: q.problem for q in quarantined}
    assert set(problems) == {
        f"{other}.json.corrupt",
        "0e5a4b1c-0000-4f50-8a6b-7c8d9e0f1a2b.json.corrupt",
        "11111111-2222-4333-8444-555555555555.json.corrupt",
    }
    assert (
        problems["11111111-2222-4333-8444-555555555555.json.corrupt"]
        == "version: expected one of (1, 2, 3), got 99"
    )
    assert "does not match claim UID" in problems["0e5a4b1c-0000-4f50-8a6b-7c8d9e0f1a2b.json.corrupt"]
    assert store.load_all() == ({UID: RECORD}, [])  # set aside once, not reported forever


def test_leftovers_of_an_interrupted_write_are_cleaned(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.directory.mkdir(parents=True)
    leftover = store.directory / f".{UID}.json.1a2b3c4d.tmp"
    leftover.write_text('{"version": 1, "cla')
    abandoned = time.time() - ABANDONED_WRITE_SECONDS - 1
    os.utime(leftover, (abandoned, abandoned))

    assert store.load_all() == ({}, [])
    assert not leftover.exists()


def test_a_young_temporary_file_may_be_a_peer_writing_and_stays(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.directory.mkdir(parents=True)
    in_flight = store.directory / f".{UID}.json.1a2b3c4d.tmp"
    in_flight.write_text('{"version": 1, "cla')

    assert store.load_all() == ({}, [])
    assert in_flight.exists()


def test_read_sees_what_another_store_on_the_directory_wrote(tmp_path: Path) -> None:
    mine, peer = ClaimRecordStore(tmp_path), ClaimRecordStore(tmp_path)
    mine.load_all()
    assert mine.read(UID) is None
    peer.save(RECORD)
    assert mine.read(UID) == RECORD
    assert mine.read_all() == {UID: RECORD}
    peer.delete(UID)
    assert mine.read(UID) is None and mine.read_all() == {}


@pytest.mark.parametrize("flush", [True, False])
async def test_a_record_this_store_wrote_is_read_back_as_on_disk_after_a_peer_replaced_or_damaged_it(
    tmp_path: Path, flush: bool
) -> None:
    """The store keeps what it wrote, to skip decoding the same bytes again: a change by another
    process is still read, and a record damaged on disk is still reported."""
    mine, peer = ClaimRecordStore(tmp_path, flush=flush), ClaimRecordStore(tmp_path, flush=flush)
    mine.load_all()
    await mine.create(RECORD)
    assert mine.read(UID) == RECORD
    preparing = replace(RECORD, state="preparing")
    peer.save(preparing)
    assert mine.read(UID) == preparing
    await mine.write(RECORD)
    assert mine.read(UID) == RECORD
    path = mine.directory / f"{UID}.json"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(CorruptRecord, match=UID):
        mine.read(UID)
    peer.delete(UID)
    assert mine.read(UID) is None


def test_a_preparing_record_round_trips_with_its_reserved_devices(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.load_all()
    reservation = ClaimRecord(claim=RECORD.claim, devices=(), state="preparing", reserved=("gpu-0", "gpu-1"))
    store.save(reservation)
    assert store.read(UID) == reservation
    assert reservation.exclusive_keys == ("gpu-0", "gpu-1")


def test_read_of_an_unreadable_record_names_the_claim(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.load_all()
    (store.directory / f"{UID}.json").write_text("{not json")
    with pytest.raises(CorruptRecord, match=UID):
        store.read(UID)
    assert store.read_all() == {}


def test_a_save_replaces_the_whole_file(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.save(RECORD)
    inode_before = (store.directory / f"{UID}.json").stat().st_ino
    store.save(RECORD)
    # Renamed over, never rewritten in place.
    assert (store.directory / f"{UID}.json").stat().st_ino != inode_before
    assert sorted(p.name for p in store.directory.iterdir()) == [f"{UID}.json"]


def test_two_phase_records_round_trip_with_their_mig_instances_and_version_1_still_reads(
    tmp_path: Path,
) -> None:
    store = ClaimRecordStore(tmp_path)
    preparing = replace(
        RECORD,
        state="preparing",
        effects=(MigInstanceEntry("GPU-1", profile_id=19, placement_start=3, placement_size=1),),
    )
    store.save(preparing)
    assert store.load_all() == ({RECORD.claim.uid: preparing}, [])

    old = {
        key: value for key, value in record_to_json(RECORD).items() if key not in ("state", "migInstances")
    }
    assert record_from_json({**old, "version": 1}) == RECORD
    with pytest.raises(CorruptRecord, match=r'state: "half" is not one of preparing, prepared$'):
        record_from_json({**record_to_json(RECORD), "state": "half"})
    with pytest.raises(CorruptRecord, match=r"migInstances\[0\].profileId: expected a non-negative integer"):
        record_from_json(
            {
                **record_to_json(preparing),
                "migInstances": [{**record_to_json(preparing)["migInstances"][0], "profileId": True}],
            }
        )


def test_a_new_boot_id_is_noticed_once(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)

    assert store.boot_changed("boot-a") is False  # first start: nothing to compare with
    assert store.boot_changed("boot-a") is False
    assert store.boot_changed("boot-b") is True
    assert store.boot_changed("boot-b") is False


def test_records_of_an_earlier_boot_are_not_read_before_start_up_drops_them(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    assert store.read_all_of_boot("boot-a") == {}  # nothing written yet
    store.boot_changed("boot-a")
    store.save(RECORD)

    assert store.read_all_of_boot("boot-a") == {UID: RECORD}
    assert store.read_all_of_boot("boot-b") == {}
    assert store.boot_changed("boot-b") is True  # reading changed nothing


async def test_a_first_record_is_created_and_never_replaces_one_there(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.load_all()
    await store.create(RECORD)
    assert store.read(UID) == RECORD
    other = replace(RECORD, state="preparing")
    with pytest.raises(FileExistsError):
        await store.create(other)
    assert ClaimRecordStore(tmp_path).read(UID) == RECORD
    assert list(store.directory.glob(".*.tmp")) == []


def test_the_compute_modes_to_restore_round_trip_and_a_bad_one_is_named(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.load_all()
    record = ClaimRecord(
        claim=RECORD.claim,
        devices=(),
        state="preparing",
        effects=(
            ClaimMpsEntry(),
            ComputeModeEntry("GPU-a", "Default"),
            ComputeModeEntry("GPU-b", "Prohibited"),
        ),
    )
    store.save(record)
    assert store.read(UID) == record
    assert record.without((ClaimMpsEntry(),)).has_side_effects
    data = record_to_json(record)
    data["computeModes"][1]["restore"] = "Exclusive"
    with pytest.raises(
        CorruptRecord,
        match=r'computeModes\[1\]\.restore: "Exclusive" is not one of Default, ExclusiveThread, ',
    ):
        record_from_json(data)


def test_the_devices_facts_and_the_claims_generation_round_trip_and_older_records_lack_them(
    tmp_path: Path,
) -> None:
    store = ClaimRecordStore(tmp_path)
    store.load_all()
    facts = DeviceFacts("mig", "GPU-a", 3, mig_profile="1g.10gb", mig_device_uuid="MIG-b")
    device = replace(RECORD.devices[0], facts=facts)
    record = replace(RECORD, devices=(device,), generation=2)
    store.save(record)
    assert store.read(UID) == record
    data = record_to_json(record)
    assert data["devices"][0]["facts"] == {
        "type": "mig",
        "gpuUUID": "GPU-a",
        "gpuIndex": 3,
        "migProfile": "1g.10gb",
        "migDeviceUUID": "MIG-b",
    }
    older = record_to_json(record)
    del older["devices"][0]["facts"], older["claimGeneration"]
    assert record_from_json(older) == RECORD
    data["devices"][0]["facts"]["gpuIndex"] = "3"
    with pytest.raises(
        CorruptRecord, match=r"devices\[0\]\.facts\.gpuIndex: expected a non-negative integer"
    ):
        record_from_json(data)
    with pytest.raises(CorruptRecord, match="claimGeneration: expected a non-negative integer"):
        record_from_json({**record_to_json(RECORD), "claimGeneration": -1})


async def test_unflushed_records_are_written_whole_and_never_flushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_flush(fd: int) -> None:
        raise AssertionError("an unflushed store flushed")

    monkeypatch.setattr(os, "fsync", no_flush)
    store = ClaimRecordStore(tmp_path, flush=False)
    store.load_all()
    await store.create(RECORD)
    preparing = replace(RECORD, state="preparing")
    with pytest.raises(FileExistsError):
        await store.create(preparing)
    assert ClaimRecordStore(tmp_path).read(UID) == RECORD  # the record there is left as it was
    await store.write(preparing)
    assert ClaimRecordStore(tmp_path).read(UID) == preparing
    assert list(store.directory.glob(".*.tmp")) == []
    await store.erase(UID)
    await store.erase(UID)
    assert store.load_all() == ({}, [])


@pytest.mark.parametrize("flush", [True, False], ids=["flushed", "unflushed"])
def test_after_a_reboot_records_are_dropped_unread_and_quarantined_ones_kept(
    tmp_path: Path, flush: bool
) -> None:
    store = ClaimRecordStore(tmp_path, flush=flush)
    store.load_all()
    store.save(RECORD)
    # What a power loss can leave of writes that were never flushed: an empty record, a temporary.
    (store.directory / "0e5a4b1c-2d3e-4f50-8a6b-7c8d9e0f1a2b.json").write_bytes(b"")
    (store.directory / f".{UID}.json.0a1b2c3d.tmp").write_bytes(b"{")
    (store.directory / "aside.json.corrupt").write_text("kept for the operator")

    assert store.drop_all() == 2
    assert sorted(p.name for p in store.directory.iterdir()) == ["aside.json.corrupt"]
    assert store.load_all() == ({}, [])
