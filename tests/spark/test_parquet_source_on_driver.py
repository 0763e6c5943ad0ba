"""Small Parquet inputs of an upsert sink read on the driver: no Spark job in the step, the same tables.

``FileSource(format="parquet")`` feeding only a ``DeltaTableSink`` or ``ParquetTableSink`` in upsert mode
is read by pyarrow on the driver and merged there, keys bucketed by the driver's copy of Spark's hash.
Checked against pandas (the later row in source order wins per key, null keys included; files by name),
read back with delta-rs and pyarrow, over checkpoints that read on the driver (one of a file naming a
column in another case, matched as Spark matches it) and one that Spark reads (a BIGINT column of dates,
which Spark reads as their days and the driver does not read), a first load above ``driver_merge_rows``
written by the driver from the source's rows, and an upsert above it merged on the driver too (that bound is
for rows collected out of Spark).
"""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows
from airflow_provider_checkpoint.dataflow import DeltaTableSink, FileSource, ParquetTableSink
from airflow_provider_checkpoint.testing.inprocess import make_job

pytestmark = pytest.mark.spark

KEYS = ["user", "page"]
SCHEMA = "user STRING, page INT, ts BIGINT, amount DECIMAL(10,2)"


def declare(base: Path) -> None:
    for name, sink, merge_rows in (("delta", DeltaTableSink, 100), ("parquet", ParquetTableSink, 1000)):
        source = FileSource(f"events_{name}", f"{base}/landing", "parquet", SCHEMA)
        sink(name, source, f"{base}/{name}", mode="upsert", keys=KEYS, buckets=4, driver_merge_rows=merge_rows)


def land(
    landing: Path, n: int, seed: int, ts_name: str = "ts", ts_type: pa.DataType | None = None
) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows = [
        {
            "user": rng.choice([None, "", *(f"u{i}" for i in range(30))]),
            "page": rng.choice([None, *range(5)]),
            "ts": seed * 1000 + i,
            "amount": rng.choice([None, Decimal(rng.randrange(-(10**6), 10**6)) / 100]),
        }
        for i in range(n)
    ]
    types = {"user": pa.string(), "page": pa.int32(), "ts": ts_type or pa.int64(), "amount": pa.decimal128(10, 2)}
    table = pa.table({k if k != "ts" else ts_name: pa.array([r[k] for r in rows], t) for k, t in types.items()})
    landing.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, landing / f".e{seed}")
    (landing / f".e{seed}").rename(landing / f"events-{seed:03d}.parquet")
    return rows


def normalized(df: pd.DataFrame) -> pd.DataFrame:
    df = df[[*KEYS, "ts", "amount"]].astype(object)
    df = df.where(df.notna(), None)
    return df.sort_values(KEYS, key=lambda c: c.map(repr)).reset_index(drop=True)


def truth(events: list[dict[str, object]]) -> pd.DataFrame:
    latest = {(e["user"], e["page"]): e for e in events}  # the later row in source order wins
    return normalized(pd.DataFrame(list(latest.values())))


def test_small_parquet_inputs_upsert_from_the_driver(spark, tmp_path: Path, monkeypatch) -> None:
    from deltalake import DeltaTable

    from_source: list[str] = []
    original = UpsertRows._from_source

    def spy(self, *args, **kwargs):
        rows = original(self, *args, **kwargs)
        from_source.extend([] if rows is None else [self.uid])
        return rows

    monkeypatch.setattr(UpsertRows, "_from_source", spy)
    tracker = spark.sparkContext.statusTracker()
    job = make_job(spark, tmp_path, declare)
    events: list[dict[str, object]] = []
    # delta collects at most 100 rows out of Spark: its first load of 300 (at most 8 times that) and its upsert
    # of 120 are merged by the driver from the source's rows; a BIGINT column of dates: Spark reads the files
    checkpoints = [
        (300, "ts", pa.int64(), ["delta", "parquet"]),
        (80, "TS", pa.int64(), ["delta", "parquet"]),
        (50, "ts", pa.date32(), []),
        (120, "ts", pa.int64(), ["delta", "parquet"]),
    ]
    for i, (n, ts_name, ts_type, on_driver) in enumerate(checkpoints, start=1):
        events += land(tmp_path / "landing", n, seed=i, ts_name=ts_name, ts_type=ts_type)
        from_source.clear()
        before = set(tracker.getJobIdsForGroup())
        job.checkpoint()
        jobs = set(tracker.getJobIdsForGroup()) - before
        expected = truth(events)
        tables = {
            "delta": pa.table(DeltaTable(str(tmp_path / "delta")).scan()).to_pandas(),
            "parquet": ds.dataset(str(tmp_path / "parquet"), format="parquet").to_table().to_pandas(),
        }
        for name, table in tables.items():
            pd.testing.assert_frame_equal(normalized(table), expected, obj=f"{name} after checkpoint {i}")
        assert sorted(from_source) == on_driver, (i, from_source)
        assert bool(jobs) != (len(on_driver) == 2), (i, sorted(jobs))  # Spark reads what a sink does not take
