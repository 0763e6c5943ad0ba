"""An upsert sink fed by a keyed aggregate merged on the driver takes its rows from the driver.

The rows carry Spark's hash of the keys, so the sink buckets them exactly as Spark would; a
bucket computed differently would put a key in two files (a duplicate) or leave its old row
behind. Checked against pandas with messy keys (nulls in either key column, repeats, many
more changed keys than the sinks' ``driver_merge_rows``), read back with pyarrow and delta-rs. A
first load above ``driver_merge_rows`` is written by the driver too, collected with Spark's hash.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyspark.sql import DataFrame

from airflow_provider_checkpoint.connectors.base import bucketed
from airflow_provider_checkpoint.connectors.base.bucketed import BucketedUpsert
from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows
from airflow_provider_checkpoint.dataflow import (
    DeltaTableSink,
    FileSource,
    KeyedAggregate,
    ParquetTableSink,
    PostgresTableSink,
)
from airflow_provider_checkpoint.dataflow.driver_rows import LazyFrame
from airflow_provider_checkpoint.state import checkpointing
from airflow_provider_checkpoint.testing.inprocess import Job, make_job

pytestmark = pytest.mark.spark

KEYS = ["user", "page"]


def declare(base: Path) -> None:
    events = FileSource("events", f"{base}/landing", "json", "user STRING, page STRING, ts LONG")
    totals = KeyedAggregate("totals", events, keys=KEYS, aggs={"n": "count", "first": "min(ts)", "last": "max(ts)"})
    options = {"mode": "upsert", "buckets": 8, "driver_merge_rows": 1}  # only held rows fit the driver
    ParquetTableSink("parquet", totals, f"{base}/parquet", keys=KEYS, **options)
    DeltaTableSink("delta", totals, f"{base}/delta", keys=KEYS, **options)
    ParquetTableSink("swapped", totals, f"{base}/swapped", keys=KEYS[::-1], **options)  # another hash


def land(landing: Path, n: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows = [
        {
            "user": rng.choice([None, "", *(f"u{i}" for i in range(60))]),
            "page": rng.choice([None, *(f"/p{i}" for i in range(7))]),
            "ts": seed * 100_000 + rng.randrange(50_000),
        }
        for _ in range(n)
    ]
    landing.mkdir(parents=True, exist_ok=True)
    (landing / f".e{seed}").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (landing / f".e{seed}").rename(landing / f"events-{seed:03d}.json")
    return rows


def truth(events: list[dict[str, object]]) -> pd.DataFrame:
    df = pd.DataFrame(events)
    grouped = df.groupby(KEYS, dropna=False).agg(n=("ts", "size"), first=("ts", "min"), last=("ts", "max"))
    return normalized(grouped.reset_index())


def normalized(df: pd.DataFrame) -> pd.DataFrame:
    df = df[[*KEYS, "n", "first", "last"]].astype({"n": "int64", "first": "int64", "last": "int64"})
    df = df.astype({k: object for k in KEYS}).where(df.notna(), None)
    return df.sort_values(KEYS, key=lambda c: c.map(repr)).reset_index(drop=True)


def test_held_rows_upsert_like_spark(spark, tmp_path: Path, monkeypatch) -> None:
    from deltalake import DeltaTable

    through_spark: list[str] = []  # sinks whose input went through Spark (a collect or a Spark merge)
    for method in ("collect", "frame"):
        original = getattr(UpsertRows, method)

        def spy(self, *args, _original=original, **kwargs):
            through_spark.append(self.uid)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(UpsertRows, method, spy)
    first_loads: list[str] = []  # sinks whose first load (above driver_merge_rows) the driver wrote
    first_load_in_driver = BucketedUpsert.first_load_in_driver

    def first_load_spy(self: BucketedUpsert, rows: UpsertRows) -> pa.Table | None:
        collected = first_load_in_driver(self, rows)
        first_loads.extend([] if collected is None else [self.uid])
        return collected

    monkeypatch.setattr(BucketedUpsert, "first_load_in_driver", first_load_spy)
    made, checked = LazyFrame.frame, []

    def made_as_declared(self: LazyFrame) -> DataFrame:  # the sinks read the columns before the DataFrame is made
        df = made(self)
        assert df.schema == self.schema, (df.schema, self.schema)
        checked.append(df)
        return df

    monkeypatch.setattr(LazyFrame, "frame", made_as_declared)
    monkeypatch.setattr(bucketed, "FIRST_LOAD_FACTOR", 1000)  # the first load, ~400 rows, fits the driver
    monkeypatch.setattr(checkpointing, "first_version_on_driver", lambda *args: None)  # the first state by Spark
    job = make_job(spark, tmp_path, declare, inline_state_threshold=0)
    events: list[dict[str, object]] = []
    merged_on_driver = []
    for i, n in enumerate([400, 60, 90, 300, 40, 5], start=1):
        events += land(tmp_path / "landing", n, seed=i)
        through_spark.clear()
        first_loads.clear()
        completed = job.checkpoint()
        on_driver = any(m.get("state_merged_on_driver") for m in completed.stats["steps"].values())
        merged_on_driver.append(on_driver)
        expected = truth(events)
        tables = {
            "parquet": ds.dataset(str(tmp_path / "parquet"), format="parquet").to_table().to_pandas(),
            "delta": pa.table(DeltaTable(str(tmp_path / "delta")).scan()).to_pandas(),  # deletion vectors applied
            "swapped": ds.dataset(str(tmp_path / "swapped"), format="parquet").to_table().to_pandas(),
        }
        for name, table in tables.items():
            pd.testing.assert_frame_equal(normalized(table), expected, obj=f"{name} after checkpoint {i}")
        # rows merged on the driver are taken as they are, except by the sink whose keys hash in another
        # order; otherwise (a full version) every sink's input goes through Spark
        assert sorted(set(through_spark)) == (["swapped"] if on_driver else ["delta", "parquet", "swapped"]), i
        assert sorted(first_loads) == (["delta", "parquet", "swapped"] if i == 1 else []), (i, first_loads)
    assert merged_on_driver.count(True) >= 4, merged_on_driver
    assert checked  # "swapped" made the DataFrame of the merged rows (their hash is of other keys)


@pytest.fixture
def python_jobs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The functions given to ``mapInArrow`` (each a Spark job run by Python workers) while the test runs."""
    from pyspark.sql.classic.dataframe import DataFrame

    called: list[str] = []
    original = DataFrame.mapInArrow

    def spy(self, *args, **kwargs):
        called.append(repr(args[0])[:80])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DataFrame, "mapInArrow", spy)
    return called


def run_held_checkpoints(
    job: Job,
    landing: Path,
    python_jobs: list[str] | None,
    check: Callable[[int, list[dict[str, object]], pd.DataFrame], None],
) -> None:
    """Five checkpoints of messy events (one with none); after each, ``check(checkpoint, every event,
    every checkpoint's changed totals appended)``. At least three are merged on the driver, and with
    ``python_jobs`` (:func:`python_jobs`), those run no ``mapInArrow``."""
    events: list[dict[str, object]] = []
    appended: list[pd.DataFrame] = []
    merged_on_driver = []
    for i, n in enumerate([300, 40, 0, 90, 25], start=1):
        new = land(landing, n, seed=i)
        events += new
        if python_jobs is not None:
            python_jobs.clear()
        completed = job.checkpoint()
        on_driver = any(m.get("state_merged_on_driver") for m in completed.stats["steps"].values())
        merged_on_driver.append(on_driver)
        if new:
            appended.append(truth(events).merge(truth(new)[KEYS], on=KEYS))
        check(i, events, normalized(pd.concat(appended)))
        if on_driver and python_jobs is not None:
            assert python_jobs == [], (i, python_jobs)
    assert merged_on_driver.count(True) >= 3, merged_on_driver


def declare_appends(base: Path) -> None:
    events = FileSource("events", f"{base}/landing", "json", "user STRING, page STRING, ts LONG")
    totals = KeyedAggregate("totals", events, keys=KEYS, aggs={"n": "count", "first": "min(ts)", "last": "max(ts)"})
    ParquetTableSink("parquet", totals, f"{base}/parquet", "append")
    DeltaTableSink("delta", totals, f"{base}/delta", "append", partition_by=["page"])


def test_held_rows_append_from_the_driver_with_the_python_engine(spark, tmp_path: Path, python_jobs: list[str]) -> None:
    """With the Python file engine (an object store's), a checkpoint merged on the driver reads its small
    input there and writes its append sinks from the rows it holds: no ``mapInArrow`` (no Python worker);
    each table holds every checkpoint's changed totals once (pyarrow, delta-rs against pandas)."""
    from deltalake import DeltaTable

    from airflow_provider_checkpoint.fileio.writes import ENGINE_CONF

    spark.conf.set(ENGINE_CONF, "python")
    try:
        job = make_job(spark, tmp_path, declare_appends, inline_state_threshold=0)

        def check(i: int, events: list[dict[str, object]], appended: pd.DataFrame) -> None:
            parquet = ds.dataset(str(tmp_path / "parquet"), format="parquet").to_table().to_pandas()
            delta = pa.table(DeltaTable(str(tmp_path / "delta")).scan()).to_pandas()
            for name, table in (("parquet", parquet), ("delta", delta)):
                pd.testing.assert_frame_equal(normalized(table), appended, obj=f"{name} after checkpoint {i}")

        run_held_checkpoints(job, tmp_path / "landing", python_jobs, check)
    finally:
        spark.conf.unset(ENGINE_CONF)


def declare_postgres(base: Path) -> None:
    events = FileSource("events", f"{base}/landing", "json", "user STRING, page STRING, ts LONG")
    totals = KeyedAggregate("totals", events, keys=KEYS, aggs={"n": "count", "first": "min(ts)", "last": "max(ts)"})
    PostgresTableSink("pg_append", totals, "pg_test", f"{base.name}.appended", "append")
    PostgresTableSink("pg_upsert", totals, "pg_test", f"{base.name}.totals", "upsert", keys=KEYS)


def test_held_rows_load_postgres_from_the_driver(
    spark, tmp_path: Path, postgres_server, monkeypatch, python_jobs: list[str]
) -> None:
    """A checkpoint merged on the driver loads the PostgreSQL sinks' staging tables from the rows it holds:
    no ``mapInArrow`` (no Python worker); the append table holds every checkpoint's changed totals once and
    the upsert table the totals (psycopg against pandas), with messy keys (nulls, empty strings)."""
    monkeypatch.setenv("AIRFLOW_CONN_PG_TEST", postgres_server.uri())
    schema = f"held_{tmp_path.name.lower()}"
    base = tmp_path / schema
    with postgres_server.connect() as db:
        db.execute(f'CREATE SCHEMA "{schema}"')

    def table(name: str) -> pd.DataFrame:
        with postgres_server.connect() as db:
            rows = db.execute(f'SELECT "user", page, n, first, last FROM "{schema}".{name}').fetchall()
        return normalized(pd.DataFrame(rows, columns=[*KEYS, "n", "first", "last"]))

    def check(i: int, events: list[dict[str, object]], appended: pd.DataFrame) -> None:
        pd.testing.assert_frame_equal(table("appended"), appended, obj=f"append after {i}")
        pd.testing.assert_frame_equal(table("totals"), truth(events), obj=f"upsert after {i}")

    job = make_job(spark, base, declare_postgres, inline_state_threshold=0)
    run_held_checkpoints(job, base / "landing", python_jobs, check)


def test_held_rows_of_several_per_key_reach_a_postgres_upsert_reduced(
    spark, tmp_path: Path, postgres_server, monkeypatch
):
    """An upsert on fewer keys than the aggregate's (``user`` of ``(user, page)``) gets several held rows per
    key: they are reduced by ``sequence_by`` before staging, never staged as they are (a key staged twice
    fails the step). The table holds each user's totals of the page with the latest event (psycopg against
    pandas), with a null user one key."""
    monkeypatch.setenv("AIRFLOW_CONN_PG_TEST", postgres_server.uri())
    schema = f"reduced_{tmp_path.name.lower()}"
    base = tmp_path / schema
    with postgres_server.connect() as db:
        db.execute(f'CREATE SCHEMA "{schema}"')

    def declare(base: Path) -> None:
        events = FileSource("events", f"{base}/landing", "json", "user STRING, page STRING, ts LONG")
        aggs = {"n": "count", "first": "min(ts)", "last": "max(ts)"}
        totals = KeyedAggregate("totals", events, keys=KEYS, aggs=aggs)
        sequence = ["last", "page"]  # (user, page) is unique: no tie
        PostgresTableSink(
            "pg_latest", totals, "pg_test", f"{schema}.latest", "upsert", keys=["user"], sequence_by=sequence
        )

    def check(i: int, events: list[dict[str, object]], appended: pd.DataFrame) -> None:
        # each checkpoint's events are later than every earlier one's: a user's latest changed row is its latest
        totals = truth(events)
        rank = totals.assign(has_page=totals["page"].notna(), page_or=totals["page"].fillna(""))
        rank = rank.sort_values(["last", "has_page", "page_or"]).groupby("user", dropna=False).tail(1)
        with postgres_server.connect() as db:
            rows = db.execute(f'SELECT "user", page, n, first, last FROM "{schema}".latest').fetchall()
        table = normalized(pd.DataFrame(rows, columns=[*KEYS, "n", "first", "last"]))
        pd.testing.assert_frame_equal(table, normalized(rank), obj=f"upsert on user after {i}")

    job = make_job(spark, base, declare, inline_state_threshold=0)
    run_held_checkpoints(job, base / "landing", None, check)
