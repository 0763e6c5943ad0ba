"""ParquetTableSink two-phase commit, commit/abort part (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError, UnsafePathError


def stage(table: Path, checkpoint_id: int, name: str, data: bytes) -> str:
    rel = f"_staging/chk-{checkpoint_id}/job/step_t/attempt-1/{name}"
    p = table / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return rel


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return tmp_path / "table"


@pytest.fixture
def sink(table: Path) -> ParquetTableSink:
    return ParquetTableSink("t", Source("src"), str(table))


def visible(table: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in table.glob("part-*.parquet")}


def test_commit_moves_staged_files_and_logs(sink: ParquetTableSink, table: Path) -> None:
    s0 = stage(table, 3, "part-00000.parquet", b"zero")
    s1 = stage(table, 3, "part-00001.parquet", b"one")
    committables = [
        {"checkpoint_id": 3, "moves": [[s0, "part-c0000000003-00000.parquet"], [s1, "part-c0000000003-00001.parquet"]]}
    ]
    assert not sink.is_committed(3)
    sink.commit(3, committables)
    assert visible(table) == {"part-c0000000003-00000.parquet": b"zero", "part-c0000000003-00001.parquet": b"one"}
    assert sink.is_committed(3)
    log = json.loads((table / "_commits/0000000003.json").read_bytes())
    assert sink.commit_record(3) == {"t": {"commit_time": log.pop("commit_time")}}
    assert log == {"checkpoint_id": 3, "files": ["part-c0000000003-00000.parquet", "part-c0000000003-00001.parquet"]}
    assert not (table / "_staging/chk-3").exists()


def test_commit_is_idempotent(sink: ParquetTableSink, table: Path) -> None:
    s0 = stage(table, 3, "part-00000.parquet", b"zero")
    committables = [{"checkpoint_id": 3, "moves": [[s0, "part-c0000000003-00000.parquet"]]}]
    sink.commit(3, committables)
    stage(table, 3, "part-00000.parquet", b"zombie attempt output")
    sink.commit(3, committables)
    assert visible(table) == {"part-c0000000003-00000.parquet": b"zero"}


def test_a_staged_file_reached_through_a_link_is_never_published(sink: ParquetTableSink, table: Path) -> None:
    """Issue #52: a staged file that is a link to a committed file of the table (a duplicate of its rows),
    or one behind a linked directory of the staging, is refused before anything moves."""
    s0 = stage(table, 1, "part-00000.parquet", b"rows of checkpoint 1")
    sink.commit(1, [{"checkpoint_id": 1, "moves": [[s0, "part-c0000000001-00000.parquet"]]}])
    linked = table / stage(table, 2, "part-00000.parquet", b"")
    linked.unlink()
    linked.symlink_to(table / "part-c0000000001-00000.parquet")
    (table / "_staging/chk-3/job").mkdir(parents=True)
    (table / "_staging/chk-3/job/step_t").symlink_to(table / "_staging/chk-2/job/step_t")
    for checkpoint_id in (2, 3):
        staged = f"_staging/chk-{checkpoint_id}/job/step_t/attempt-1/part-00000.parquet"
        target = f"part-c{checkpoint_id:010d}-00000.parquet"
        with pytest.raises(UnsafePathError, match="symbolic link"):
            sink.commit(checkpoint_id, [{"checkpoint_id": checkpoint_id, "moves": [[staged, target]]}])
        assert not sink.is_committed(checkpoint_id)
    assert visible(table) == {"part-c0000000001-00000.parquet": b"rows of checkpoint 1"}


def test_commit_resumes_after_a_partial_commit(sink: ParquetTableSink, table: Path) -> None:
    s0 = stage(table, 4, "part-00000.parquet", b"zero")
    s1 = stage(table, 4, "part-00001.parquet", b"one")
    (table / s0).rename(table / "part-c0000000004-00000.parquet")  # the first move happened, then a crash
    sink.commit(
        4,
        [
            {
                "checkpoint_id": 4,
                "moves": [[s0, "part-c0000000004-00000.parquet"], [s1, "part-c0000000004-00001.parquet"]],
            }
        ],
    )
    assert visible(table) == {"part-c0000000004-00000.parquet": b"zero", "part-c0000000004-00001.parquet": b"one"}


def test_abort_removes_only_that_checkpoints_staging(sink: ParquetTableSink, table: Path) -> None:
    stage(table, 5, "part-00000.parquet", b"five")
    s6 = stage(table, 6, "part-00000.parquet", b"six")
    sink.abort(5)
    sink.abort(5)
    assert not (table / "_staging/chk-5").exists()
    assert (table / s6).read_bytes() == b"six"
    assert visible(table) == {}


def test_definition_errors() -> None:
    src = Source("src")
    with pytest.raises(PipelineDefinitionError):
        ParquetTableSink("a", src, "/x", mode="overwrite")
    with pytest.raises(PipelineDefinitionError):
        ParquetTableSink("b", src, "/x", mode="upsert")
    with pytest.raises(PipelineDefinitionError):
        ParquetTableSink("c", src, "/x", buckets=0)
