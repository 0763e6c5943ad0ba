"""ParquetTableSink two-phase commit, commit/abort part (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError


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
