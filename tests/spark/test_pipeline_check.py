"""The pipeline check (a dry run on empty input) with real Spark, a real Parquet table and a real Delta table.

One checkpoint of a first version writes both tables; later versions of the same job are checked
against them. Expected problems are stated from what each version declares (columns, types), never
taken from the check; the check must write nothing anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.dataflow import (
    Channel,
    DeltaTableSink,
    FileSource,
    KeyedAggregate,
    ParquetTableSink,
    PipelineGraph,
    Transform,
)
from airflow_provider_checkpoint.dataflow.graph import collecting
from airflow_provider_checkpoint.spark.dry_run import check_graph
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.spark.helpers import write_json

pytestmark = pytest.mark.spark

JOB = "multi"  # the job id make_job gives


def declare(tmp: Path, transform: Callable[[Any], Any] = lambda df: df, schema: str = "user STRING, n LONG") -> None:
    """A version of the pipeline: events → transform → the Parquet table and the Delta table."""
    events = FileSource("events", str(tmp / "landing"), "json", schema)
    shaped = Transform("shape", events, transform)
    ParquetTableSink("parquet_out", shaped, str(tmp / "parquet"))
    DeltaTableSink("delta_out", shaped, str(tmp / "delta"))


def graph_of(tmp: Path, **version: Any) -> PipelineGraph:
    with collecting() as nodes:
        declare(tmp, **version)
    return PipelineGraph(nodes)


def files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def written(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both tables written by one checkpoint of the first version (``user STRING, n LONG``)."""
    tmp = tmp_path_factory.mktemp("check")
    write_json(tmp / "landing" / "a.json", [{"user": "u1", "n": 1}, {"user": "u2", "n": 2}])
    job = make_job(spark, tmp, declare)
    job.checkpoint()
    assert (tmp / "parquet" / "_commits").exists() and (tmp / "delta" / "_delta_log").exists()
    return tmp


def test_a_clean_version_passes_and_the_check_writes_nothing(spark: Any, written: Path) -> None:
    before = files(written)
    with collecting() as nodes:
        declare(written, transform=lambda df: df.where("n > 0"))
        ParquetTableSink("fresh", nodes[0], str(written / "fresh"))  # a table the first stage would create
    assert check_graph(spark, PipelineGraph(nodes), JOB) == []
    assert files(written) == before and not (written / "fresh").exists()


def test_a_transform_referencing_a_missing_column_is_named_with_its_input(spark: Any, written: Path) -> None:
    (problem,) = check_graph(spark, graph_of(written, transform=lambda df: df.select("usr", "n")), JOB)
    assert problem.uid == "shape"  # the sinks downstream are not checked: their input cannot be built
    assert problem.message.startswith("AnalysisException [UNRESOLVED_COLUMN") and "`usr`" in problem.message
    assert "events <user:string,n:bigint>" in problem.fix


def test_sinks_whose_existing_tables_do_not_fit_are_each_named(spark: Any, written: Path) -> None:
    def retyped(df: Any) -> Any:
        return df.selectExpr("user", "CAST(n AS STRING) AS n", "1.5 AS extra")

    problems = {p.uid: p for p in check_graph(spark, graph_of(written, transform=retyped), JOB)}
    assert sorted(problems) == ["delta_out", "parquet_out"]
    parquet, delta = problems["parquet_out"].message, problems["delta_out"].message
    assert parquet.startswith(f"SinkSchemaError: Parquet table file://{written / 'parquet'}: the input does not match")
    assert "retyped column(s) n (bigint in the table, string in the input)" in parquet
    assert "added column(s) ['extra']" in parquet
    assert delta.startswith(f"SinkSchemaError: Delta table file://{written / 'delta'}: the input does not match")
    assert "retyped column(s) n (long in the table, string in the input)" in delta and "['extra']" in delta
    assert all("user:string,n:string,extra:decimal(2,1)" in p.fix for p in problems.values())


def test_another_job_s_tables_are_named(spark: Any, written: Path) -> None:
    claimed = check_graph(spark, graph_of(written), "another_job")
    assert sorted(p.uid for p in claimed) == ["delta_out", "parquet_out"]
    assert all(f"'job_id': '{JOB}'" in p.message and "no other job" in p.fix for p in claimed)


def test_a_channel_hands_its_columns_to_the_step_that_reads_it(spark: Any, tmp_path: Path) -> None:
    with collecting() as nodes:
        events = FileSource("events", str(tmp_path / "landing"), "json", "user STRING, n LONG")
        handed = Channel("handed", Transform("renamed", events, lambda df: df.withColumnRenamed("n", "amount")))
        totals = KeyedAggregate("totals", handed, keys=["user"], aggs={"total": "sum(n)"})
        ParquetTableSink("totals_out", totals, str(tmp_path / "totals"), mode="upsert", keys=["user"])
    graph = PipelineGraph(nodes)
    assert len(graph.steps) == 2
    (problem,) = check_graph(spark, graph, JOB)
    assert problem.uid == "totals" and "`n`" in problem.message and "handed <user:string,amount:bigint>" in problem.fix
    assert not (tmp_path / "totals").exists()
