"""``DeltaTableSink(schema_evolution="additive")`` given an input lacking a column of the table: written as
Delta Lake writes it (delta-spark is the oracle in ``test_delta_spark_reads_ours.py``): an appended row and a
new key null in it, an updated key keeping its value, whether that value is in a bucket file or an update
file; read back by delta-rs, DuckDB and our Spark read (deletion vectors applied) against a dict model. A NOT
NULL column lacking is refused naming the table and the column, nothing committed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_provider_checkpoint.dataflow import DeltaSource, DeltaTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import SinkSchemaError
from airflow_provider_checkpoint.storage import JobStorage
from tests.spark.helpers import step_context
from tests.spark.sink_model import delta_rows, duckdb_delta_rows

pytestmark = pytest.mark.spark

COLUMNS = ["k", "v", "w"]
FULL, LACKING = "k long, v string, w string", "v string, k long"


def read_back(spark: Any, path: Path) -> dict[str, list[tuple[Any, ...]]]:
    spark_rows = DeltaSource("read", str(path)).read_version(spark).select(*COLUMNS).collect()
    return {
        "delta-rs": delta_rows(path, COLUMNS),
        "duckdb": duckdb_delta_rows(path, COLUMNS),
        "spark": sorted((tuple(r) for r in spark_rows), key=repr),
    }


def test_an_input_lacking_a_column_appends_it_null_and_upserts_keep_each_key_value(spark: Any, tmp_path: Path) -> None:
    storage = JobStorage.for_job(str(tmp_path / "jobs"), "job")
    inputs: list[tuple[str, list[tuple[Any, ...]]]] = [
        (FULL, [(i, f"v{i}", f"w{i}" if i % 2 else None) for i in range(8)]),
        (FULL, [(1, "u1", "w1-u"), (9, "v9", "w9")]),  # key 1's value now in an update file
        (LACKING, [("x1", 1), ("x3", 3), ("x4", 4), ("x20", 20)]),
        (LACKING, [("y3", 3), ("y21", 21)]),
    ]
    appended = DeltaTableSink("log", Source("src"), str(tmp_path / "log"), schema_evolution="additive")
    upserted = DeltaTableSink(
        "latest", Source("src"), str(tmp_path / "latest"), "upsert", ["k"], buckets=2, schema_evolution="additive"
    )
    log: list[tuple[Any, ...]] = []
    latest: dict[int, tuple[Any, ...]] = {}
    for checkpoint_id, (schema, rows) in enumerate(inputs, start=1):
        for sink in (appended, upserted):
            ctx = step_context(spark, storage, checkpoint_id)
            sink.commit(checkpoint_id, sink.stage(ctx, spark.createDataFrame(rows, schema)))
        for row in (dict(zip([c.split()[0] for c in schema.split(", ")], r, strict=True)) for r in rows):
            log.append((row["k"], row["v"], row.get("w")))
            kept = latest.get(row["k"], (None, None, None))[2]  # Delta's MERGE … UPDATE SET * with evolution
            latest[row["k"]] = (row["k"], row["v"], row.get("w", kept))
        if checkpoint_id < 3:  # the two tables are others' tables so far
            continue
        for path, model in ((tmp_path / "log", log), (tmp_path / "latest", list(latest.values()))):
            for reader, got in read_back(spark, path).items():
                assert got == sorted(model, key=repr), f"checkpoint {checkpoint_id}: {reader} reads {path.name}"
    assert latest[1] == (1, "x1", "w1-u") and latest[3] == (3, "y3", "w3") and latest[20] == (20, "x20", None)


def test_a_not_null_column_lacking_is_refused_naming_the_table_and_the_column(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    storage = JobStorage.for_job(str(tmp_path / "jobs"), "job")
    path = tmp_path / "t"
    sink = DeltaTableSink("t", Source("src"), str(path), "upsert", ["k"], schema_evolution="additive")
    first = spark.createDataFrame([(1, "a")], "k long not null, w string not null")
    sink.commit(1, sink.stage(step_context(spark, storage, 1), first))
    with pytest.raises(SinkSchemaError, match=r"^Delta table .*: the input lacks column\(s\) \['w'\], which the table"):
        sink.stage(step_context(spark, storage, 2), spark.createDataFrame([(1,)], "k long"))
    assert DeltaTable(str(path)).version() == 1 and not list(path.glob("chk-2/**/*.parquet"))
