"""A Parquet append table whose input gains, loses or retypes a column while the job runs (a CDC source's DDL):
with the default ``schema_evolution="none"`` every step refuses it before anything is staged (naming the table,
the column and ``schema_evolution='additive'``); with ``"additive"`` an added column is written from its
checkpoint on and the table read back by pyarrow ``dataset``, DuckDB, Spark taking one file's schema and Spark
with ``mergeSchema`` (readers we did not write) equals a model of every checkpoint's rows, null in it before;
a missing nullable column is written null and a retyped one refused. Across a rollback to a checkpoint before
a column too (the replay of input from before it)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.storage import JobStorage
from tests.spark.helpers import refused_stage, staged_and_committed

pytestmark = pytest.mark.spark

COLUMNS = ("k", "v", "w", "x")
"""Every column any checkpoint's input has: a row of the model holds null in the ones its input lacked."""


def read_back(spark: Any, path: Path) -> dict[str, Counter[tuple[Any, ...]]]:
    """The table's rows (of :data:`COLUMNS`, null where a reader has no such column) as pyarrow ``dataset``,
    DuckDB, Spark (each taking one file's schema) and Spark with ``mergeSchema`` read it."""

    def rows(found: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
        return Counter(tuple(r.get(c) for c in COLUMNS) for r in found)

    scan = duckdb.connect().sql(f"SELECT * FROM read_parquet('{path}/part-*.parquet')")
    return {
        "pyarrow": rows(pads.dataset(str(path), format="parquet").to_table().to_pylist()),
        "duckdb": rows([dict(zip(scan.columns, row, strict=True)) for row in scan.fetchall()]),
        "spark": rows([r.asDict() for r in spark.read.parquet(str(path)).collect()]),
        "spark mergeSchema": rows(
            [r.asDict() for r in spark.read.option("mergeSchema", "true").parquet(str(path)).collect()]
        ),
    }


def assert_holds(spark: Any, path: Path, model: list[tuple[Any, ...]]) -> None:
    for reader, got in read_back(spark, path).items():
        assert got == Counter(model), f"{reader} reads the table unlike the model"


def test_none_refuses_an_added_missing_or_retyped_column_before_anything_is_staged(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "table"
    storage = JobStorage.for_job(str(tmp_path / "jobs"), "job")
    sink = ParquetTableSink("out", Source("src"), str(path))
    staged_and_committed(spark, sink, storage, 1, [("a", 1), ("b", 2)], "k string, v long")
    before = pads.dataset(str(path), format="parquet").to_table()
    for checkpoint_id, (rows, schema, problem) in enumerate(
        [
            ([("c", 3, "w")], "k string, v long, w string", r"added column\(s\) \['w'\].*schema_evolution='additive'"),
            ([("c",)], "k string", r"missing column\(s\) \['v'\]"),
            ([("c", 3)], "k string, v int", r"retyped column\(s\) v \(bigint in the table, int in the input\)"),
        ],
        start=2,
    ):
        refused = refused_stage(spark, sink, storage, checkpoint_id, rows, schema, problem)
        assert f"Parquet table {sink.asset_uri()}" in refused
    assert pads.dataset(str(path), format="parquet").to_table().equals(before), "the table unchanged"
    assert {p.name[:17] for p in path.glob("part-*")} == {"part-c0000000001-"}, "checkpoint 1's files alone"


def test_additive_writes_an_added_column_that_every_reader_sees(spark: Any, tmp_path: Path) -> None:
    """Checkpoint 3 brings ``w``, 5 brings ``x``, 4 writes nothing (an empty input), 6 appends again, 7 lacks
    ``w`` (written null); a retyped column is refused, nothing staged."""
    path = tmp_path / "table"
    storage = JobStorage.for_job(str(tmp_path / "jobs"), "job")
    sink = ParquetTableSink("out", Source("src"), str(path), schema_evolution="additive")
    inputs: list[tuple[list[tuple[Any, ...]], str]] = [
        ([("a", 1), ("b", 2)], "k string, v long"),
        ([("c", 3)], "k string, v long"),
        ([("d", 4, "w-d"), ("e", 5, None)], "k string, v long, w string"),
        ([], "k string, v long, w string"),
        ([("f", 6, "w-f", 1.5)], "k string, v long, w string, x double"),
        ([("g", 7, None, 2.5), ("h", 8, "w-h", None)], "k string, v long, w string, x double"),
        ([(2.5, "i", 9), (None, "j", 10)], "x double, k string, v long"),
    ]
    model: list[tuple[Any, ...]] = []
    for checkpoint_id, (rows, schema) in enumerate(inputs, start=1):
        staged_and_committed(spark, sink, storage, checkpoint_id, rows, schema)
        named = [dict(zip([c.split()[0] for c in schema.split(", ")], r, strict=True)) for r in rows]
        model += [tuple(r.get(c) for c in COLUMNS) for r in named]
        if checkpoint_id in (3, 5, 7):  # a column added: checkpoint 2's files lack it, 3's lack x; 7 lacks w
            assert_holds(spark, path, model)
        assert not list(path.glob("_staging/**/*.parquet")), "nothing left staged"
    assert {tuple(pq.read_schema(f).names) for f in path.glob("part-*.parquet")} == {COLUMNS}, "the table's order"
    refused = [("i", 9, "w", 1)], "k string, v long, w string, x long", r"retyped column\(s\) x \(double in the table"
    refused_stage(spark, sink, storage, len(inputs) + 1, *refused)
    assert_holds(spark, path, model)


def test_a_rollback_to_before_an_added_column_keeps_it_as_an_upsert_table_does(spark: Any, tmp_path: Path) -> None:
    """Checkpoint 2 brings ``w`` (checkpoint 1's file rewritten with it); a rollback to 1 parks checkpoint 2's
    files and keeps the column: every reader reads checkpoint 1's rows with ``w`` null, a replay of input from
    before the column (without ``w``) appends with it null, with ``"none"`` it is refused; then ``w`` again."""
    path = tmp_path / "table"
    storage = JobStorage.for_job(str(tmp_path / "jobs"), "job")
    sink = ParquetTableSink("out", Source("src"), str(path), schema_evolution="additive")
    staged_and_committed(spark, sink, storage, 1, [("a", 1)], "k string, v long")
    staged_and_committed(spark, sink, storage, 2, [("b", 2, "w-b")], "k string, v long, w string")
    sink.rollback(1)
    assert_holds(spark, path, [("a", 1, None, None)])
    assert {tuple(pq.read_schema(f).names) for f in path.glob("part-*.parquet")} == {("k", "v", "w")}
    strict = ParquetTableSink("out", Source("src"), str(path))
    refused_stage(spark, strict, storage, 3, [("b", 2)], "k string, v long", r"missing column\(s\) \['w'\]")
    staged_and_committed(spark, sink, storage, 3, [("b", 2)], "k string, v long")
    staged_and_committed(spark, sink, storage, 4, [("c", 3, "w-c")], "k string, v long, w string")
    assert_holds(spark, path, [("a", 1, None, None), ("b", 2, None, None), ("c", 3, "w-c", None)])
    assert {tuple(pq.read_schema(f).names) for f in path.glob("part-*.parquet")} == {("k", "v", "w")}
