"""A Parquet upsert table's columns are checked by every step: with the default ``schema_evolution="none"``
an input column the table lacks is refused before anything is staged (a merge reading bucket files of two
schemas would keep one schema's columns), the table left as it was (read back with pyarrow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.exceptions import SinkSchemaError
from airflow_provider_checkpoint.storage import JobStorage
from tests.spark.helpers import step_context

pytestmark = pytest.mark.spark


def test_an_added_column_is_refused_by_the_upsert_step_and_nothing_is_staged(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "table"
    sink = ParquetTableSink("out", Source("src"), str(path), "upsert", ["id"], buckets=2, driver_merge_rows=0)
    storage = JobStorage.for_job(str(tmp_path / "jobs"), "job")
    ctx = step_context(spark, storage, 1)
    sink.prepare(ctx)
    sink.commit(1, sink.stage(ctx, spark.createDataFrame([(i, f"v{i}") for i in range(6)], "id long, v string")))

    ctx = step_context(spark, storage, 2)
    sink.prepare(ctx)
    added = spark.createDataFrame([(1, "changed", "x")], "id long, v string, note string")
    with pytest.raises(SinkSchemaError, match="note") as refused:
        sink.stage(ctx, added)
    assert "schema_evolution='additive'" in str(refused.value)
    assert not list((path / "_staging").rglob("*.parquet")) if (path / "_staging").exists() else True
    rows = pads.dataset(str(path), format="parquet").to_table().to_pylist()
    assert sorted((r["id"], r["v"]) for r in rows) == [(i, f"v{i}") for i in range(6)]
    assert {tuple(sorted(r)) for r in rows} == {("id", "v")}
