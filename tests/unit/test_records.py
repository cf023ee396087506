import json
from pathlib import Path

from dra_driver.claims.identity import claim_ref
from dra_driver.claims.records import ClaimRecord, ClaimRecordStore, PreparedDevice

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
    wrong_name = RECORD.to_json()
    (store.directory / "0e5a4b1c-0000-4f50-8a6b-7c8d9e0f1a2b.json").write_text(json.dumps(wrong_name))
    bad_version = {**RECORD.to_json(), "version": 99}
    (store.directory / "11111111-2222-4333-8444-555555555555.json").write_text(json.dumps(bad_version))

    records, quarantined = store.load_all()

    assert records == {UID: RECORD}
    problems = {q.path.name: q.problem for q in quarantined}
    assert set(problems) == {
        f"{other}.json.corrupt",
        "0e5a4b1c-0000-4f50-8a6b-7c8d9e0f1a2b.json.corrupt",
        "11111111-2222-4333-8444-555555555555.json.corrupt",
    }
    assert problems["11111111-2222-4333-8444-555555555555.json.corrupt"] == "version: expected 1, got 99"
    assert "does not match claim UID" in problems["0e5a4b1c-0000-4f50-8a6b-7c8d9e0f1a2b.json.corrupt"]
    assert store.load_all() == ({UID: RECORD}, [])  # set aside once, not reported forever


def test_leftovers_of_an_interrupted_write_are_cleaned(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.directory.mkdir(parents=True)
    leftover = store.directory / f".{UID}.json.1a2b3c4d.tmp"
    leftover.write_text('{"version": 1, "cla')

    assert store.load_all() == ({}, [])
    assert not leftover.exists()


def test_a_save_replaces_the_whole_file(tmp_path: Path) -> None:
    store = ClaimRecordStore(tmp_path)
    store.save(RECORD)
    inode_before = (store.directory / f"{UID}.json").stat().st_ino
    store.save(RECORD)
    # Renamed over, never rewritten in place.
    assert (store.directory / f"{UID}.json").stat().st_ino != inode_before
    assert sorted(p.name for p in store.directory.iterdir()) == [f"{UID}.json"]
