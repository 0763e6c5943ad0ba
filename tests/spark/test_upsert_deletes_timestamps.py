"""Upsert sinks merging by Spark with deletes over rows holding a timestamp, as every CDC source's rows
do (``commit_time``): a bucket whose every row is deleted is replaced by an empty file of the table's
schema, timestamps included. Read back with pyarrow and delta-rs, compared with plain Python."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from deltalake import DeltaTable

from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink
from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.storage import JobStorage
from tests.spark.helpers import step_context

pytestmark = pytest.mark.spark

SCHEMA = "id long, v string, at timestamp, deleted boolean"
UTC = dt.UTC


def _at(i: int) -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(minutes=i)


@pytest.mark.parametrize("kind", ["parquet", pytest.param("delta", marks=pytest.mark.full)])
def test_a_bucket_emptied_by_deletes_in_a_spark_merge_keeps_the_timestamp_column(
    spark: Any, tmp_path: Path, kind: str
) -> None:
    options: dict[str, Any] = {"keys": ["id"], "delete_when": "deleted", "buckets": 2, "driver_merge_rows": 0}
    cls = ParquetTableSink if kind == "parquet" else DeltaTableSink
    sink = cls("out", Source("src"), str(tmp_path / "table"), "upsert", **options)
    storage = JobStorage.for_job(str(tmp_path / "jobs"), "job")
    truth: dict[int, tuple[str, dt.datetime]] = {}
    batches = [
        [(i, f"v{i}", _at(i), False) for i in range(8)],
        [(i, None, _at(100 + i), True) for i in range(8) if i != 3] + [(3, "changed", _at(103), False)],
        [(i, "back", _at(200 + i), False) for i in (0, 5)] + [(3, None, _at(203), True)],
    ]
    for checkpoint_id, batch in enumerate(batches, start=1):
        ctx = step_context(spark, storage, checkpoint_id)
        sink.prepare(ctx)
        sink.commit(checkpoint_id, sink.stage(ctx, spark.createDataFrame(batch, SCHEMA)))
        for i, v, at, deleted in batch:
            if deleted:
                truth.pop(i, None)
            else:
                truth[i] = (v, at)
        if kind == "parquet":
            read = pads.dataset(str(tmp_path / "table"), format="parquet").to_table(columns=["id", "v", "at"])
        else:
            read = pa.table(DeltaTable(str(tmp_path / "table")).scan()).select(["id", "v", "at"])  # DVs applied
        read = read.set_column(2, "at", read["at"].cast(pa.timestamp("us", tz="UTC")))  # Spark writes UTC instants
        got = {r["id"]: (r["v"], r["at"]) for r in read.to_pylist()}
        assert got == truth, f"checkpoint {checkpoint_id}"
