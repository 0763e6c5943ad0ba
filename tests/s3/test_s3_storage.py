"""Job storage on a real S3 server (SeaweedFS): documents, exclusive creates, confinement, listing cost.

No mock stands in for S3: every request goes to the server ``tests/servers/s3.py`` starts.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.core import metadata
from airflow_provider_checkpoint.core.job_record import JobRecord
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, LeaseHeld, UnsafePathError
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.stats import StatsStore
from airflow_provider_checkpoint.storage.writes import create_exclusive
from tests.s3.s3_job import counted_requests
from tests.servers.s3 import S3Server, ThrottlingProxy
from tests.unit.helpers import T0, sample

WRITERS = 6
MAX_REQUESTS = 5 * 4
"""s3fs tries a throttled call 5 times; each is botocore's request with at most 3 retries."""


def new_storage(server: S3Server, job_id: str = "job") -> JobStorage:
    return JobStorage.for_job(server.url(f"root-{uuid.uuid4().hex[:8]}"), job_id, **server.storage_options())


@pytest.fixture
def storage(s3_server: S3Server) -> JobStorage:
    return new_storage(s3_server)


def keys(storage: JobStorage) -> set[str]:
    """Every object under the job, relative to it."""
    return {storage.relative(p) for p in storage.fs.find(storage.job_dir)}


def race(n: int, action: Callable[[int], Any]) -> list[Any]:
    """Run ``action(i)`` in ``n`` threads released together; their results in order of ``i``."""
    start = threading.Barrier(n)

    def run(i: int) -> Any:
        start.wait()
        return action(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


def test_documents_round_trip_without_temporary_objects(storage: JobStorage, s3_server: S3Server) -> None:
    assert storage.url() == f"{s3_server.url(storage.root.split('/', 1)[1])}/job"
    JobRecordStore(storage).save(JobRecord(job_id="job", last_checkpoint_id=4))
    storage.write_atomic("chk-4/_plan.json", b"{}")
    storage.write_atomic("chk-4/step/attempt-1/state.parquet", b"state bytes")
    StatsStore(storage).write(4, {"checkpoint_id": 4, "records_in": 7})
    storage.write_atomic("chk-4/_plan.json", b'{"again": 1}')

    assert JobRecordStore(storage).load().last_checkpoint_id == 4
    assert storage.read_bytes("chk-4/_plan.json") == b'{"again": 1}'
    assert StatsStore(storage).read_all() == [{"checkpoint_id": 4, "records_in": 7}]
    assert storage.checkpoint_ids() == [4]
    handle = storage.handle_for("chk-4/step/attempt-1/state.parquet")
    storage.verify(handle)
    assert keys(storage) == {"_job.json", "_stats/4.json", "chk-4/_plan.json", "chk-4/step/attempt-1/state.parquet"}
    storage.delete("chk-4")
    assert storage.checkpoint_ids() == []
    with pytest.raises(CheckpointStorageError, match="missing file s3://"):
        storage.read_bytes("chk-4/_plan.json")


def test_lease_is_exclusive_and_released_by_its_holder(storage: JobStorage) -> None:
    JobRecordStore(storage).acquire_lease("run-a", 100, now=T0)
    with pytest.raises(LeaseHeld):
        JobRecordStore(storage).acquire_lease("run-b", 100, now=T0 + 50)
    JobRecordStore(storage).release_lease("run-b")
    assert JobRecordStore(storage).lease_holder()["run_id"] == "run-a"
    JobRecordStore(storage).release_lease("run-a")
    JobRecordStore(storage).acquire_lease("run-b", 100, now=T0 + 60)
    assert JobRecordStore(storage).lease_holder()["run_id"] == "run-b"


def test_concurrent_exclusive_creates_have_exactly_one_winner(storage: JobStorage) -> None:
    target = storage.path("flag")
    won = race(WRITERS, lambda i: create_exclusive(storage.fs, target, f"writer {i}".encode()))
    assert won.count(True) == 1, won
    assert storage.read_bytes("flag") == f"writer {won.index(True)}".encode()


def test_concurrent_metadata_commits_have_exactly_one_winner(s3_server: S3Server) -> None:
    storage = new_storage(s3_server, job_id="clicks")
    checkpoints = [replace(sample(), completion_time=T0 + i) for i in range(WRITERS)]
    committed = race(WRITERS, lambda i: CompletedCheckpointStore(storage).commit(checkpoints[i]))
    assert committed.count(True) == 1, committed
    assert CompletedCheckpointStore(storage).load(7) == checkpoints[committed.index(True)]
    assert keys(storage) == {"chk-7/_metadata"}
    assert CompletedCheckpointStore(storage).commit(checkpoints[0]) is False, "a later commit never replaces _metadata"


@pytest.mark.parametrize("relative", ["../job2/x", "chk-1/../../x", "/etc/passwd", "a//b", "./a", "s3://other/x"])
def test_paths_stay_inside_the_job_prefix(storage: JobStorage, relative: str) -> None:
    with pytest.raises(UnsafePathError):
        storage.path(relative)


@pytest.mark.parametrize("outside", ["s3://{bucket}/elsewhere/job/x", "s3://{bucket}/{root}/job2/x", "{root}/jobx"])
def test_relative_refuses_objects_outside_the_job(storage: JobStorage, s3_server: S3Server, outside: str) -> None:
    with pytest.raises(CheckpointStorageError):
        storage.relative(outside.format(bucket=s3_server.bucket, root=storage.root))


def test_listing_checkpoints_costs_the_same_however_many_files_they_hold(storage: JobStorage) -> None:
    """One LIST of the ``chk-*`` directories (a page per 1,000 objects) answers which checkpoints
    completed: no request per checkpoint, none per file."""
    checkpoints = [replace(sample(), job_id="job", checkpoint_id=i) for i in range(1, 4)]

    def listing_cost(state_files: int) -> Counter[str]:
        for c in checkpoints:
            for f in range(state_files):
                storage.write_atomic(f"chk-{c.checkpoint_id}/step/attempt-1/state/part-{f}.parquet", b"x")
            storage.write_atomic(storage.metadata_path(c.checkpoint_id), metadata.encode(c))
        with counted_requests(storage) as counts:
            assert CompletedCheckpointStore(storage).completed_ids() == [1, 2, 3]
        return counts

    few, many = listing_cost(1), listing_cost(40)
    assert few == many, (few, many)
    assert few == Counter({"ListObjectsV2": 1}), few


def test_a_file_of_known_size_is_read_in_one_request(storage: JobStorage) -> None:
    """A state file (its size in its handle) is read by the Python engine with one GET and no HEAD; a
    landing file cut into a barrier too, and one that grew or was replaced since is refused."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_checkpoint.fileio.file_readers import ParquetReader, RecordReader

    table = pa.table({"k": list(range(1000)), "v": [str(i) for i in range(1000)]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=100)
    storage.write_atomic("state.parquet", buffer.getvalue())
    path, size = storage.path("state.parquet"), len(buffer.getvalue())
    with counted_requests(storage) as sized:
        read = pa.Table.from_batches(list(ParquetReader(storage.fs, table.schema, sizes={path: size})(path)))
    with counted_requests(storage) as unsized:
        again = pa.Table.from_batches(list(ParquetReader(storage.fs, table.schema)(path)))
    assert read.equals(table) and again.equals(table)
    assert sized == Counter({"GetObject": 1}) and sum(unsized.values()) > 1, (sized, unsized)

    lines = b'{"a": 1}\n{"a": 2}\n'
    storage.write_atomic("f.json", lines)
    landing = storage.path("f.json")
    schema = pa.schema([("a", pa.int32()), ("_corrupt_record", pa.string())])
    reader = RecordReader(storage.fs, "json", schema, {}, {landing: len(lines)})
    with counted_requests(storage) as counts:
        assert [b.to_pydict()["a"] for b in reader(landing)] == [[1, 2]]
    assert counts == Counter({"GetObject": 1}), counts
    storage.write_atomic("f.json", lines + b'{"a": 3}\n')
    with pytest.raises(OSError, match="cut into the barrier"):
        list(reader(landing))


def test_wrong_secret_names_the_url_and_the_fix_but_not_the_secret(s3_server: S3Server) -> None:
    wrong = f"not-the-secret-{uuid.uuid4().hex}"
    url = s3_server.url("root")
    with pytest.raises(CheckpointStorageError, match="denied.*access key and secret") as info:
        JobStorage.for_job(url, "job", **{**s3_server.storage_options(), "secret": wrong})
    assert url in str(info.value) and wrong not in str(info.value)


def test_missing_bucket_is_named(s3_server: S3Server) -> None:
    with pytest.raises(CheckpointStorageError, match="bucket 'no-such-bucket' of s3://no-such-bucket/root does not"):
        JobStorage.for_job("s3://no-such-bucket/root", "job", **s3_server.storage_options())


def test_unreachable_endpoint_fails_after_bounded_retries(s3_server: S3Server) -> None:
    from tests.servers.s3 import free_ports

    options = {**s3_server.storage_options(), "endpoint_url": f"http://127.0.0.1:{free_ports(1)[0]}"}
    with pytest.raises(CheckpointStorageError, match="cannot reach the object store of s3://.*endpoint_url"):
        JobStorage.for_job(s3_server.url("root"), "job", **options)


def test_an_endpoint_that_never_answers_fails_within_seconds(s3_server: S3Server) -> None:
    """A store that accepts connections but never answers (a hung proxy): the first-contact probe gives
    up within its own short bound and names the endpoint, whatever the (long) timeouts of later requests."""
    import socket

    held: list[socket.socket] = []
    with socket.create_server(("127.0.0.1", 0)) as silent:
        threading.Thread(target=lambda: held.extend(silent.accept()[0] for _ in iter(int, 1)), daemon=True).start()
        options = {
            **s3_server.storage_options(),
            "endpoint_url": f"http://127.0.0.1:{silent.getsockname()[1]}",
            "config_kwargs": {"connect_timeout": 1, "read_timeout": 1},
        }
        started = time.monotonic()
        with pytest.raises(CheckpointStorageError, match="cannot reach the object store of s3://.*(?i:timeout)"):
            JobStorage.for_job(s3_server.url("root"), "job", **options)
        elapsed = time.monotonic() - started
    assert held, "the client never connected"
    assert elapsed < 10, f"{elapsed:.1f}s, {len(held)} connections"


def test_job_storage_takes_credentials_from_the_aws_environment(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow_provider_checkpoint.storage.config import job_storage

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    storage = job_storage("job", s3_server.url(f"env-{uuid.uuid4().hex[:8]}"))
    JobRecordStore(storage).save(JobRecord(job_id="job", last_checkpoint_id=1))
    assert JobRecordStore(storage).load().last_checkpoint_id == 1
    assert s3_server.secret not in repr(storage.url())


def test_throttling_is_retried_a_bounded_number_of_times(
    s3_server: S3Server, throttling_proxy: ThrottlingProxy
) -> None:
    """HTTP 503 SlowDown: two throttled attempts are retried and the write lands once; throttling that
    does not stop fails after a bounded number of requests, and nothing is left that could be taken as written."""
    options = {**s3_server.storage_options(), "endpoint_url": throttling_proxy.endpoint}
    storage = JobStorage.for_job(s3_server.url(f"throttled-{uuid.uuid4().hex[:8]}"), "job", **options)
    throttling_proxy.throttle, throttling_proxy.requests = 2, 0
    assert create_exclusive(storage.fs, storage.path("_lease"), b"held") is True
    assert throttling_proxy.requests == 3 and storage.read_bytes("_lease") == b"held"

    throttling_proxy.throttle, throttling_proxy.requests = 10**6, 0
    started = time.monotonic()
    with pytest.raises(OSError, match="reduce your request rate"):
        storage.write_atomic("_job.json", b"{}")
    attempts, elapsed = throttling_proxy.requests, time.monotonic() - started
    throttling_proxy.throttle = 0
    assert attempts == MAX_REQUESTS, f"{attempts} requests in {elapsed:.1f}s"
    assert elapsed < 60
    assert not storage.exists("_job.json")


def test_restoring_state_checks_each_file_with_one_request(storage: JobStorage) -> None:
    """Before Spark reads a state file on S3, its size, SHA-256 and footer columns are checked from one
    GET; a file altered since its handle was written is refused, naming it."""
    from airflow_provider_checkpoint.exceptions import StateFileError
    from airflow_provider_checkpoint.state.handles import OperatorSnapshot
    from airflow_provider_checkpoint.state.spark_backend import read_state
    from tests.unit.state_files import SCHEMA, state_file

    class Stop(Exception):
        """Raised where Spark would be asked to read the files: every check passed."""

    class NoSpark:
        def __getattr__(self, name: str) -> Any:
            raise Stop(name)

    def snapshot_of(data: bytes) -> tuple[OperatorSnapshot, str]:
        rel = f"chk-1/step/attempt-1/state/counts/kgr=0/part-{uuid.uuid4().hex}.parquet"
        storage.write_atomic(rel, data)
        handle = storage.handle_for(rel, (0, 127))
        return OperatorSnapshot((handle,), SCHEMA, ("k",), 128, rows=1), rel

    good, _ = snapshot_of(state_file("v"))
    with counted_requests(storage) as counts, pytest.raises(Stop):
        read_state(NoSpark(), storage, good, verify=True, uid="counts")  # type: ignore[arg-type]
    assert counts == Counter({"GetObject": 1}), counts

    altered, rel = snapshot_of(state_file("v"))
    storage.write_atomic(rel, state_file("w"))  # same size, other bytes
    with pytest.raises(CheckpointStorageError, match="checksum mismatch for s3://"):
        read_state(NoSpark(), storage, altered, verify=True, uid="counts")  # type: ignore[arg-type]
    other, _ = snapshot_of(pa_file_with_columns())
    with pytest.raises(StateFileError, match="state file s3://"):
        read_state(NoSpark(), storage, other, verify=True, uid="counts")  # type: ignore[arg-type]


def pa_file_with_columns() -> bytes:
    """A Parquet file without the recorded state columns."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"other": [1]}), buffer)
    return buffer.getvalue()
