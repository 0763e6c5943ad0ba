"""The job record: id counter that only grows, and its codec."""

from __future__ import annotations

import json

import pytest

from airflow_provider_checkpoint.core.job_record import JobRecord
from airflow_provider_checkpoint.core.status import AbortReason, JobStatus
from airflow_provider_checkpoint.exceptions import JobRecordError


def test_allocated_ids_strictly_increase() -> None:
    job = JobRecord("j")
    assert [job.allocate_checkpoint_id() for _ in range(5)] == [1, 2, 3, 4, 5]


def test_observe_never_lowers_the_counter() -> None:
    job = JobRecord("j")
    for _ in range(4):
        job.allocate_checkpoint_id()
    job.observe_checkpoint_id(2)
    assert job.allocate_checkpoint_id() == 5


def test_observe_higher_id_skips_past_it() -> None:
    job = JobRecord("j")
    job.allocate_checkpoint_id()
    job.observe_checkpoint_id(41)
    assert job.allocate_checkpoint_id() == 42
    job.observe_checkpoint_id(42)
    assert job.allocate_checkpoint_id() == 43


def test_ids_never_reused_across_encode_decode() -> None:
    job = JobRecord("j")
    used = {job.allocate_checkpoint_id() for _ in range(3)}
    job = JobRecord.decode(job.encode())
    assert job.allocate_checkpoint_id() not in used


def test_round_trip() -> None:
    job = JobRecord("clicks", topology={"nodes": {"a": {"kind": "source"}}}, status=JobStatus.FAILED)
    job.status_reason = "too many failures"
    job.observe_checkpoint_id(9)
    job.failures.on_complete(7)
    job.failures.on_abort(8, AbortReason.DECLINED)
    job.keep_housekeeping({"lake": range(1, 30), "gone": []})
    assert job.housekeeping == {"lake": list(range(20, 30))}, "the newest ten of a sink; none: no entry"
    back = JobRecord.decode(job.encode())
    assert back == job
    job.keep_housekeeping({})
    assert "housekeeping" not in json.loads(job.encode()), "a record without failed housekeeping is as before"


@pytest.mark.parametrize(
    "data",
    [
        b"garbage",
        b"[]",
        json.dumps({"version": 1}).encode(),
        json.dumps({"version": 1, "job_id": "j", "status": "EXPLODED"}).encode(),
        *(
            json.dumps({"version": 1, "job_id": "j", "housekeeping": {"lake": ids}}).encode()
            for ids in ([0], [True], ["1"], list(range(1, 12)), 3)
        ),
        json.dumps({"version": 1, "job_id": "j", "housekeeping": {"../x": [1]}}).encode(),
    ],
)
def test_unreadable_records_are_refused(data: bytes) -> None:
    with pytest.raises(JobRecordError):
        JobRecord.decode(data)


def test_unsupported_version_is_refused() -> None:
    with pytest.raises(JobRecordError, match="99"):
        JobRecord.decode(json.dumps({"version": 99, "job_id": "j"}).encode())
