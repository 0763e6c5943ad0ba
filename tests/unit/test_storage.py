"""JobStorage on the real local filesystem: atomic writes, the lease, verification, layout."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from airflow_provider_checkpoint.core.job_record import JobRecord
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, LeaseHeld
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.stats import StatsStore
from airflow_provider_checkpoint.storage.writes import create_exclusive

T0 = 1_700_000_000.0


@pytest.fixture
def storage(tmp_path: Path) -> JobStorage:
    return JobStorage.for_job(str(tmp_path), "job")


def job_dir(tmp_path: Path) -> Path:
    return tmp_path / "job"


def all_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


# -- layout ---------------------------------------------------------------------------
def test_paths_and_urls(storage: JobStorage, tmp_path: Path) -> None:
    assert storage.job_dir == f"{tmp_path}/job"
    assert storage.path("chk-3/_metadata") == f"{tmp_path}/job/chk-3/_metadata"
    assert storage.url("chk-3/_metadata") == f"file://{tmp_path}/job/chk-3/_metadata"
    assert storage.relative(f"file://{tmp_path}/job/chk-3/x") == "chk-3/x"
    assert storage.relative(f"{tmp_path}/job/chk-3/x") == "chk-3/x"
    assert JobStorage.attempt_dir(3, "step_a", 2) == "chk-3/step_a/attempt-2"
    assert JobStorage.metadata_path(3) == "chk-3/_metadata"


def test_file_url_root_is_accepted(tmp_path: Path) -> None:
    storage = JobStorage.for_job(f"file://{tmp_path}/", "job")
    assert storage.job_dir == f"{tmp_path}/job"


@pytest.mark.parametrize("outside", ["/etc/passwd", "{tmp}/job2/x", "{tmp}/jobx"])
def test_relative_rejects_paths_outside_the_job(storage: JobStorage, tmp_path: Path, outside: str) -> None:
    with pytest.raises(CheckpointStorageError):
        storage.relative(outside.format(tmp=tmp_path))


# -- atomic writes --------------------------------------------------------------------
def test_write_atomic_leaves_no_temporary_file(storage: JobStorage, tmp_path: Path) -> None:
    storage.write_atomic("deep/dir/file.json", b"one")
    storage.write_atomic("deep/dir/file.json", b"two, longer")
    assert (job_dir(tmp_path) / "deep/dir/file.json").read_bytes() == b"two, longer"
    assert all_files(job_dir(tmp_path)) == {"deep/dir/file.json"}
    assert [p.name for p in (job_dir(tmp_path) / "deep/dir").iterdir()] == ["file.json"]


def test_create_exclusive_creates_only_once(storage: JobStorage, tmp_path: Path) -> None:
    target = f"{tmp_path}/x/flag"
    assert create_exclusive(storage.fs, target, b"first") is True
    assert create_exclusive(storage.fs, target, b"second") is False
    assert Path(target).read_bytes() == b"first"


def test_read_bytes_of_missing_file_names_it(storage: JobStorage) -> None:
    with pytest.raises(CheckpointStorageError, match="chk-9/nothing"):
        storage.read_bytes("chk-9/nothing")


def test_delete_is_recursive_and_tolerates_absence(storage: JobStorage, tmp_path: Path) -> None:
    storage.write_atomic("chk-1/a/b/c", b"x")
    storage.write_atomic("chk-2/keep", b"x")
    storage.delete("chk-1")
    storage.delete("chk-1")
    storage.delete("never-there")
    assert all_files(job_dir(tmp_path)) == {"chk-2/keep"}


# -- lease ----------------------------------------------------------------------------
def test_lease_is_exclusive(storage: JobStorage) -> None:
    JobRecordStore(storage).acquire_lease("run-a", 100, now=T0)
    with pytest.raises(LeaseHeld) as info:
        JobRecordStore(storage).acquire_lease("run-b", 100, now=T0 + 50)
    assert info.value.holder["run_id"] == "run-a"
    assert "run-a" in str(info.value)
    assert JobRecordStore(storage).lease_holder()["run_id"] == "run-a"


def test_lease_is_reentrant_for_the_same_run(storage: JobStorage) -> None:
    JobRecordStore(storage).acquire_lease("run-a", 100, now=T0)
    JobRecordStore(storage).acquire_lease("run-a", 100, now=T0 + 60)
    holder = JobRecordStore(storage).lease_holder()
    assert holder["run_id"] == "run-a"
    assert holder["expires_at"] == T0 + 160, "re-entering renews the lease"
    with pytest.raises(LeaseHeld):
        JobRecordStore(storage).acquire_lease("run-b", 100, now=T0 + 120)


def test_expired_lease_of_another_run_is_broken(storage: JobStorage) -> None:
    JobRecordStore(storage).acquire_lease("run-a", 100, now=T0)
    JobRecordStore(storage).acquire_lease("run-b", 100, now=T0 + 101)
    holder = JobRecordStore(storage).lease_holder()
    assert holder["run_id"] == "run-b"
    assert holder["expires_at"] == T0 + 201
    with pytest.raises(LeaseHeld):
        JobRecordStore(storage).acquire_lease("run-a", 100, now=T0 + 102)


def test_release_only_by_the_holder(storage: JobStorage) -> None:
    JobRecordStore(storage).acquire_lease("run-a", 100, now=T0)
    JobRecordStore(storage).release_lease("run-b")
    assert JobRecordStore(storage).lease_holder()["run_id"] == "run-a"
    JobRecordStore(storage).release_lease("run-a")
    assert JobRecordStore(storage).lease_holder() is None
    JobRecordStore(storage).acquire_lease("run-b", 100, now=T0 + 1)
    assert JobRecordStore(storage).lease_holder()["run_id"] == "run-b"


def test_unreadable_lease_is_never_broken(storage: JobStorage, tmp_path: Path) -> None:
    """It may be another trigger's lease; the message says how to clear a genuinely stale one."""
    job_dir(tmp_path).mkdir()
    (job_dir(tmp_path) / "_lease").write_bytes(b"{not json")
    with pytest.raises(LeaseHeld, match="delete .*_lease if no checkpoint runs"):
        JobRecordStore(storage).acquire_lease("run-a", 100, now=T0 + 10**9)
    assert (job_dir(tmp_path) / "_lease").read_bytes() == b"{not json"


# -- handles and verification ----------------------------------------------------------
def write(tmp_path: Path, rel: str, data: bytes) -> Path:
    p = job_dir(tmp_path) / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


REL = "chk-4/step_a/attempt-1/state/counts/kgr=0/part-0.parquet"


def test_handle_for_records_size_and_sha256(storage: JobStorage, tmp_path: Path) -> None:
    data = b"some state bytes" * 1000
    write(tmp_path, REL, data)
    handle = storage.handle_for(REL, (0, 63))
    assert handle.path == REL
    assert handle.size == len(data)
    assert handle.checksum == "sha256:" + hashlib.sha256(data).hexdigest()
    assert handle.key_groups == (0, 63)
    storage.verify(handle)


def test_verify_detects_missing_file(storage: JobStorage, tmp_path: Path) -> None:
    p = write(tmp_path, REL, b"abc")
    handle = storage.handle_for(REL)
    p.unlink()
    with pytest.raises(CheckpointStorageError, match="missing") as info:
        storage.verify(handle)
    assert REL in str(info.value)


def test_verify_detects_size_change(storage: JobStorage, tmp_path: Path) -> None:
    p = write(tmp_path, REL, b"abcdef")
    handle = storage.handle_for(REL)
    p.write_bytes(b"abcdefg")
    with pytest.raises(CheckpointStorageError) as info:
        storage.verify(handle)
    assert REL in str(info.value)
    assert "7" in str(info.value) and "6" in str(info.value)


def test_verify_detects_same_size_byte_flip(storage: JobStorage, tmp_path: Path) -> None:
    data = bytearray(b"x" * 4096)
    p = write(tmp_path, REL, bytes(data))
    handle = storage.handle_for(REL)
    data[2048] ^= 0x01
    p.write_bytes(bytes(data))
    assert p.stat().st_size == handle.size
    with pytest.raises(CheckpointStorageError, match="checksum") as info:
        storage.verify(handle)
    assert REL in str(info.value)


# -- checkpoints and records -------------------------------------------------------------
def test_checkpoint_ids_are_numeric_and_sorted(storage: JobStorage, tmp_path: Path) -> None:
    assert storage.checkpoint_ids() == []
    for name in ("chk-10", "chk-9", "chk-2", "chk-x", "chk-", "xchk-3", "_stats"):
        (job_dir(tmp_path) / name).mkdir(parents=True)
    write(tmp_path, "chk-11", b"a file, not a directory; still named like one")
    write(tmp_path, "chk-9/_metadata", b"{}")
    write(tmp_path, "chk-2/_metadata", b"{}")
    assert storage.checkpoint_ids() == [2, 9, 10, 11]
    assert CompletedCheckpointStore(storage).completed_ids() == [2, 9]
    assert CompletedCheckpointStore(storage).is_completed(9)
    assert not CompletedCheckpointStore(storage).is_completed(10)


def test_job_record_round_trip_and_default(storage: JobStorage) -> None:
    assert JobRecordStore(storage).load() == JobRecord("job")
    record = JobRecord("job", last_checkpoint_id=7)
    JobRecordStore(storage).save(record)
    assert JobRecordStore(storage).load() == record


def test_stats_are_read_in_id_order(storage: JobStorage) -> None:
    for cid in (10, 2, 9):
        StatsStore(storage).write(cid, {"checkpoint_id": cid, "status": "COMPLETED"})
    assert [s["checkpoint_id"] for s in StatsStore(storage).read_all()] == [2, 9, 10]
    assert json.loads(storage.read_bytes("_stats/9.json")) == {"checkpoint_id": 9, "status": "COMPLETED"}
