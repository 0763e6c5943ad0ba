"""ParquetTableSink's commit, abort and rollback on a real S3 server (SeaweedFS): the guarantees, and the
requests they take (issue #35: a few per checkpoint, no HEAD of what a listing or the writer told)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from airflow_provider_checkpoint.connectors.base import table_files
from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Source
from tests.s3.s3_job import counted_requests, s3fs_of
from tests.servers.s3 import S3Server


@pytest.fixture
def sink(s3_server: S3Server) -> ParquetTableSink:
    url = s3_server.url(f"table-{uuid.uuid4().hex[:8]}")
    sink = ParquetTableSink("t", Source("src"), url, storage_options=s3_server.storage_options())
    sink.bind_job("job")
    return sink


def stage(sink: ParquetTableSink, checkpoint_id: int, files: dict[str, bytes]) -> list[JsonDict]:
    """Stage ``files`` (target name → content) as an attempt of ``checkpoint_id`` does; its committables."""
    table = sink.table()
    moves = []
    for i, (target, data) in enumerate(sorted(files.items())):
        staged = f"_staging/chk-{checkpoint_id}/job/step_t/attempt-1/part-{i:05d}.parquet"
        table.fs.pipe_file(table.path(staged), data)
        moves.append([staged, target])
    return [{"checkpoint_id": checkpoint_id, "moves": moves}]


def visible(sink: ParquetTableSink) -> dict[str, bytes]:
    table = sink.table()
    names = table.fs.find(table.base, maxdepth=1, prefix="part-")
    return {n.rsplit("/", 1)[1]: table.fs.cat_file(n) for n in names}


def leftovers(server: S3Server, sink: ParquetTableSink, under: str) -> list[str]:
    """Everything a fresh client lists under ``under`` in the table, directories (markers) too."""
    fs = s3fs_of(server)
    return fs.find(f"{sink.table().base}/{under}", withdirs=True)  # type: ignore[no-any-return]


def target(checkpoint_id: int, n: int) -> str:
    return f"part-c{checkpoint_id:010d}-{n:05d}.parquet"


def test_commit_publishes_in_one_copy_per_file_and_cleans_up(s3_server: S3Server, sink: ParquetTableSink) -> None:
    committables = stage(sink, 3, {target(3, 0): b"zero", target(3, 1): b"one"})
    with counted_requests(sink.table()) as counts:
        sink.commit(3, committables)
        assert sink.commit_record(3)["t"]["commit_time"] is not None
    assert visible(sink) == {target(3, 0): b"zero", target(3, 1): b"one"}
    assert sink.is_committed(3)
    assert leftovers(s3_server, sink, "_staging") == []
    assert counts == {"HeadObject": 1, "ListObjectsV2": 1, "CopyObject": 2, "PutObject": 1, "DeleteObjects": 1}


def test_a_commit_stopped_half_way_completes_on_retry(
    s3_server: S3Server, sink: ParquetTableSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    committables = stage(sink, 4, {target(4, 0): b"zero", target(4, 1): b"one"})

    def crash_after_one(fs: Any, moves: list[tuple[str, int, str]]) -> None:
        table_files.publish(fs, *moves[0])
        raise OSError("the finalize task died")

    monkeypatch.setattr("airflow_provider_checkpoint.connectors.files.parquet_sink.publish_all", crash_after_one)
    with pytest.raises(OSError, match="died"):
        sink.commit(4, committables)
    assert not sink.is_committed(4) and len(visible(sink)) == 1
    monkeypatch.undo()
    sink.commit(4, committables)
    sink.commit(4, committables)  # committed: skipped
    assert visible(sink) == {target(4, 0): b"zero", target(4, 1): b"one"}
    assert leftovers(s3_server, sink, "_staging") == []


def test_abort_deletes_that_checkpoints_staging_only(s3_server: S3Server, sink: ParquetTableSink) -> None:
    stage(sink, 5, {target(5, 0): b"five"})
    stage(sink, 6, {target(6, 0): b"six"})
    with counted_requests(sink.table()) as counts:
        sink.abort(5)
        sink.abort(5)
    assert leftovers(s3_server, sink, "_staging/chk-5") == []
    assert [p.rsplit("/", 1)[1] for p in leftovers(s3_server, sink, "_staging/chk-6") if p.endswith(".parquet")]
    assert counts == {"ListObjectsV2": 2, "DeleteObjects": 1}


def test_a_rolled_back_checkpoint_commits_again_from_its_parked_files(
    s3_server: S3Server, sink: ParquetTableSink
) -> None:
    first, second = stage(sink, 1, {target(1, 0): b"one"}), stage(sink, 2, {target(2, 0): b"two"})
    sink.commit(1, first)
    sink.commit(2, second)
    sink.rollback(1)
    assert visible(sink) == {target(1, 0): b"one"} and not sink.is_committed(2)
    sink.commit(2, second)  # restored to checkpoint 2: its staged files are gone, its parked ones are not
    assert visible(sink) == {target(1, 0): b"one", target(2, 0): b"two"}
    assert leftovers(s3_server, sink, "_rolled_back") == []


def test_files_lacking_an_added_column_are_filled_at_once_one_get_and_one_put_each(
    s3_server: S3Server, sink: ParquetTableSink
) -> None:
    """``schema_evolution="additive"`` rewrites every file lacking a new column (:func:`.filled_files`): on S3
    one GET and one PUT per file, no HEAD, the files' requests in flight together; each copy holds its rows
    and the column null, as pyarrow reads it back from the server."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_checkpoint.connectors.files import parquet_schema

    table = sink.table()
    committed = {}
    for n in range(6):
        out = io.BytesIO()
        pq.write_table(pa.table({"k": [f"k{n}-{i}" for i in range(n + 1)], "v": list(range(n + 1))}), out)
        table.fs.pipe_file(table.path(target(1, n)), out.getvalue())
        committed[target(1, n)] = (table.path(target(1, n)), len(out.getvalue()))
    added = pa.schema([pa.field("w", pa.string())])
    in_flight, most = 0, 0
    events = table.fs.s3.meta.events

    def start(**_: Any) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)

    def end(**_: Any) -> None:
        nonlocal in_flight
        in_flight -= 1

    events.register("before-call.s3", start)
    events.register("after-call.s3", end)
    try:
        with counted_requests(table) as counts:
            filled = parquet_schema.filled_files(table.fs, table.path("_staging/filled"), added, committed)
    finally:
        events.unregister("before-call.s3", start)
        events.unregister("after-call.s3", end)
    assert counts == {"GetObject": 6, "PutObject": 6}
    assert most > 1, "the files' requests overlap"
    for n in range(6):
        path, rows, _ = filled[target(1, n)]
        got = pq.read_table(io.BytesIO(table.fs.cat_file(path)))
        assert rows == n + 1 and got.column_names == ["k", "v", "w"]
        assert got.to_pylist() == [{"k": f"k{n}-{i}", "v": i, "w": None} for i in range(n + 1)]
