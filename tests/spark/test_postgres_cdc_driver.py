"""PostgresCdcSource's rows to an upsert sink from the driver (:mod:`.cdc_driver`) and through Spark: the same tables.

One random change stream (inserts, updates, key changes, deletes, TOASTed values left unchanged, single- and
multi-row transactions, the same keys changed again and again, nulls) on the real server, read by four
sources of one job, each with its own slot: one hands its rows to a Delta upsert table from the driver,
one is forced through Spark (``driver_read_bytes=0``) into another, two go into PostgreSQL upsert tables
from the driver (deletes removing their key, and soft deletes keeping it marked). After every checkpoint
each table, read by delta-rs or psycopg, equals the source table as a plain ``SELECT`` saw it at the
barrier (the soft-deleted table: its rows not marked deleted). Then Hypothesis varies the change rows
themselves: the driver's rows equal ``createDataFrame(...).toArrow()``, and their reduction and bucketing
equal Spark's and a plain Python "the last change of each key" oracle.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_checkpoint.connectors.base.upsert_rule import UpsertRows
from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
from airflow_provider_checkpoint.connectors.postgres.cdc_driver import source_rows
from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink
from airflow_provider_checkpoint.dataflow import DeltaTableSink
from airflow_provider_checkpoint.fileio.frames import arrow_frame
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.postgres import PostgresServer, cdc_connection
from tests.spark.test_postgres_cdc import COLUMNS, DDL, Workload, _normal

pytestmark = pytest.mark.spark
_runs = itertools.count()


@pytest.fixture
def pg(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresServer]:
    """The server through Airflow connections ``cdc_pg`` (the sources) and ``pg_target`` (the sink); the
    test's slots are dropped after it."""
    monkeypatch.setenv("AIRFLOW_CONN_PG_TARGET", postgres_server.uri())
    with cdc_connection(postgres_server, monkeypatch, "cdc_") as server:
        yield server


class MovingWorkload(Workload):
    """:class:`Workload` whose updates also change keys (pgoutput: the old key's delete, then the new row)."""

    def change(self, cur: Any) -> int:
        if self.keys and self.rng.random() < 0.15:
            old, new = self.rng.choice(sorted(self.keys)), self.next_id
            self.next_id += 1
            cur.execute(f"UPDATE {self.table} SET id = %s WHERE id = %s", (new, old))
            self.keys.discard(old)
            self.keys.add(new)
            return 2  # two rows: the delete of the old key, the new key's row
        return super().change(cur)


def _delta(path: Path) -> dict[int, tuple[Any, ...]]:
    from deltalake import DeltaTable

    rows = pa.table(DeltaTable(str(path)).scan()).select(COLUMNS).to_pylist()
    found = {r["id"]: _normal(tuple(r[c] for c in COLUMNS)) for r in rows}
    assert len(found) == len(rows), "one row per key"
    return found


def _log_checkpointed(path: Path) -> bool:
    """Whether the Delta table's latest version has its log checkpoint (finalize's housekeeping wrote it)."""
    log = path / "_delta_log"
    latest = max(int(p.stem) for p in log.glob("*.json") if p.stem.isdigit())
    return (log / f"{latest:020d}.checkpoint.parquet").exists()


def _postgres(server: PostgresServer, table: str, where: str = "true") -> dict[int, tuple[Any, ...]]:
    with server.connect() as db:
        rows = db.execute(f"SELECT {', '.join(COLUMNS)} FROM {table} WHERE {where}").fetchall()
    found = {r[0]: _normal(r) for r in rows}
    assert len(found) == len(rows), "one row per key"
    return found


def test_the_driver_path_and_spark_give_the_source_tables(spark, pg, tmp_path, monkeypatch) -> None:
    n = next(_runs)
    table, tag = f"cdc_drv_{n}_{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:6]
    target = f"cdc_drv_target_{tag}"
    work = MovingWorkload(pg, table, seed=100 + n)
    work.conn.execute(DDL.format(t=table))
    work.transactions(20)

    def declare(root: Path) -> None:
        sinks = {"delta_driver": {}, "delta_spark": {"driver_read_bytes": 0}, "postgres": {}, "postgres_soft": {}}
        for name, options in sinks.items():
            source = PostgresCdcSource(
                f"cdc_{name}", [table], postgres_conn_id="cdc_pg", slot_name=f"cdc_test_{name}_{tag}", **options
            )
            if name == "postgres":
                PostgresTableSink(name, source, "pg_target", target, "upsert", ["id"], delete_when="deleted")
            elif name == "postgres_soft":  # the deleted keys kept, marked
                soft = {"delete_when": "deleted", "deletes": "soft", "deleted_column": "gone"}
                PostgresTableSink(name, source, "pg_target", f"{target}_soft", "upsert", ["id"], **soft)
            else:
                DeltaTableSink(name, source, str(root / name), "upsert", ["id"], delete_when="deleted", buckets=4)

    from_source: list[str] = []
    original = UpsertRows._from_source

    def spy(self: UpsertRows, *args: Any, **kwargs: Any) -> pa.Table | None:
        rows = original(self, *args, **kwargs)
        from_source.extend([] if rows is None else [self.uid])
        return rows

    monkeypatch.setattr(UpsertRows, "_from_source", spy)
    job = make_job(spark, tmp_path, declare)
    seen: dict[int, tuple[Any, ...]] = {}

    def during() -> None:
        seen.clear()
        seen.update(work.state())
        work.transactions(5)  # after the barrier: the next checkpoint's

    for checkpoint in range(3):
        from_source.clear()
        job.checkpoint(during=during)
        assert _delta(tmp_path / "delta_driver") == seen, checkpoint
        assert _delta(tmp_path / "delta_spark") == seen, checkpoint
        assert _log_checkpointed(tmp_path / "delta_driver") and _log_checkpointed(tmp_path / "delta_spark")
        assert _postgres(pg, target) == seen, checkpoint
        assert _postgres(pg, f"{target}_soft", "NOT gone") == seen, checkpoint
        on_driver = [] if checkpoint == 0 else ["delta_driver", "postgres", "postgres_soft"]
        assert sorted(from_source) == on_driver, (checkpoint, from_source)
        work.transactions(25)


KEY_VALUES = st.sampled_from([None, "", "a", "b", "é"])


@st.composite
def changes(draw: st.DrawFn) -> pa.Table:
    """Change rows as the source decodes them: a two-column key (nulls, empty strings, repeats), values,
    ``deleted``, a commit ``lsn`` shared by a transaction's rows, and its commit time."""
    n = draw(st.integers(0, 40))
    lsns = sorted(draw(st.lists(st.integers(1, 6), min_size=n, max_size=n)))
    start = datetime(2025, 1, 1, tzinfo=UTC)
    return pa.table(
        {
            "k": pa.array(draw(st.lists(KEY_VALUES, min_size=n, max_size=n)), pa.string()),
            "part": pa.array(draw(st.lists(st.sampled_from([None, 1, 2]), min_size=n, max_size=n)), pa.int32()),
            "v": pa.array(draw(st.lists(st.none() | st.integers(-5, 5), min_size=n, max_size=n)), pa.int64()),
            "deleted": pa.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), pa.bool_()),
            "lsn": pa.array(lsns, pa.int64()),
            "commit_time": pa.array([start + timedelta(microseconds=x) for x in lsns], pa.timestamp("us", tz="UTC")),
            "seq": pa.array(list(range(n)), pa.int64()),  # the row's place in source order, for the oracle
        }
    )


def session_conf(spark: Any) -> Any:
    """The session's settings as :meth:`SparkHandle.conf` gives them."""
    return lambda key: str(spark.conf.get(key))


def _sorted(rows: pa.Table) -> list[dict[str, Any]]:
    return sorted(rows.to_pylist(), key=lambda r: r["seq"])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=changes(), sequence_by=st.sampled_from([[], ["lsn"]]))
def test_the_driver_rows_reduce_and_bucket_as_spark_does(spark, data: pa.Table, sequence_by: list[str]) -> None:
    from pyspark.sql import functions as F

    keys = ["k", "part"]
    spark_df = arrow_frame(spark, data)
    held = source_rows(session_conf(spark), data, lambda: spark_df)
    assert held.rows.equals(spark_df.toArrow()), "the rows as createDataFrame(...).toArrow() gives them"
    assert held.schema == spark_df.schema

    driver = UpsertRows("sink", None, keys, sequence_by, True, count=data.num_rows, read=held)
    reduced = driver.collect(1000, ("b", 4))
    assert reduced is not None
    spark_rows = UpsertRows("sink", spark_df, keys, sequence_by, True).frame()
    bucketed = spark_rows.withColumn("b", F.pmod(F.xxhash64(*[F.col(k) for k in keys]), F.lit(4))).toArrow()
    assert _sorted(reduced) == _sorted(bucketed)

    last: dict[tuple[Any, ...], dict[str, Any]] = {}  # the oracle: source order (by lsn, then source order)
    for row in data.to_pylist():
        key = (row["k"], row["part"])
        if key not in last or not sequence_by or row["lsn"] >= last[key]["lsn"]:
            last[key] = row
    assert [{k: v for k, v in r.items() if k != "b"} for r in _sorted(reduced)] == sorted(
        last.values(), key=lambda r: r["seq"]
    )


def test_a_sink_falling_back_to_spark_builds_the_frame_only_then(spark) -> None:
    data = pa.table({"k": ["a", "b", "a", None], "v": [1, 2, 3, 4], "deleted": [False, False, True, False]})
    built: list[int] = []

    def build() -> Any:
        built.append(1)
        return arrow_frame(spark, data)

    held = source_rows(session_conf(spark), data, build)
    rows = UpsertRows("sink", None, ["k"], [], True, count=4, read=held)
    assert rows.collect(2) is not None and not built  # more than the limit: the driver holds them already
    assert rows.collect(0) is None and not built  # a sink that never merges on the driver (driver_merge_rows=0)
    assert sorted(rows.frame().toArrow().to_pylist(), key=repr) == sorted(
        [
            {"k": "a", "v": 3, "deleted": True},
            {"k": "b", "v": 2, "deleted": False},
            {"k": None, "v": 4, "deleted": False},
        ],
        key=repr,
    )
    assert built == [1]
