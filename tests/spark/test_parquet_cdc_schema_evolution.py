"""A Parquet table following a captured table's added column (``ParquetTableSink(schema_evolution="additive")``),
against the real PostgreSQL server, read back with pyarrow (the files' schemas unified) and with Spark
(``mergeSchema``), both compared with psycopg SELECTs of the source.

Upsert: the checkpoint that brings the column rewrites the bucket files it does not touch with the column
null, so every bucket file has it after the commit, and the next checkpoint's merge keeps every key's value.
Append: the new files carry the column, and the checkpoint rewrites the earlier ones with it, null. A
restore to the checkpoint before the ``ADD COLUMN`` replays to the source's state (the replay's input has
the column: its barrier takes the catalog's columns). An int4 → int8 widening is refused naming the table,
the column and both types.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
from airflow_provider_checkpoint.dataflow import ParquetTableSink
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.postgres import PostgresServer, cdc_connection
from tests.spark.test_postgres_cdc_ddl import captured, refused, short

pytestmark = pytest.mark.spark


@pytest.fixture
def pg(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresServer]:
    with cdc_connection(postgres_server, monkeypatch, "cdc_pq_evolve_") as server:
        yield server


def files(path: Path) -> list[Path]:
    return sorted(path.glob("part-*.parquet"))


def unified(path: Path) -> pa.Table:
    """The table's rows read by pyarrow with the union of its files' schemas (a column a file lacks is null)."""
    schema = pa.unify_schemas([pq.read_schema(f) for f in files(path)])
    return ds.dataset([str(f) for f in files(path)], schema=schema, format="parquet").to_table()


def by_key(rows: list[dict[str, Any]], columns: list[str]) -> dict[int, tuple[Any, ...]]:
    found = {r["id"]: tuple(r[c] for c in columns) for r in rows}
    assert len(found) == len(rows), "one row per key"
    return found


def spark_rows(spark: Any, path: Path, columns: list[str]) -> dict[int, tuple[Any, ...]]:
    read = spark.read.option("mergeSchema", "true").parquet(str(path)).select("id", *columns).collect()
    return by_key([r.asDict() for r in read], columns)


def test_an_added_column_reaches_a_parquet_table_read_by_pyarrow_and_spark(
    spark: Any, pg: PostgresServer, tmp_path: Path
) -> None:
    n = uuid.uuid4().hex[:6]
    table, slot, upserts, appends = f"cdc_pq_evolve_{n}", f"cdc_pq_evolve_{n}", tmp_path / "up", tmp_path / "app"
    conn, churn = captured(pg, table, "v text")

    def declare(tmp: Path) -> None:
        changes = PostgresCdcSource("src", [table], postgres_conn_id="cdc_pg", slot_name=slot)
        ParquetTableSink(
            "up", changes, str(upserts), mode="upsert", keys=["id"], delete_when="deleted", buckets=8,
            schema_evolution="additive",
        )  # fmt: skip
        ParquetTableSink("app", changes, str(appends), schema_evolution="additive")

    def same(names: list[str], by_spark: bool = False) -> None:
        expected = churn.select(names)
        assert by_key(unified(upserts).to_pylist(), names) == expected
        assert not by_spark or spark_rows(spark, upserts, names) == expected

    job = make_job(spark, tmp_path, declare, retained_checkpoints=3)
    job.checkpoint()
    same(["n", "v"])
    before = set(files(appends))

    conn.execute(f"ALTER TABLE {table} ADD COLUMN note text")
    key = min(churn.keys)  # one update and one insert: a bucket or two touched, the others filled
    conn.execute(f"UPDATE {table} SET note = 'noted' WHERE id = %s", (key,))
    conn.execute(f"INSERT INTO {table} (id, n, v, note) VALUES (10000, 1, 'w', 'new')")
    job.checkpoint()
    assert len(files(upserts)) > 2 and all("note" in pq.read_schema(f).names for f in files(upserts)), "all filled"
    same(["n", "v", "note"])
    half = sorted(churn.keys)[::2]  # the rows of the other keys are kept from the old files of their buckets
    conn.execute(f"UPDATE {table} SET n = n + 1, note = 'again' WHERE id = ANY(%s)", (half,))
    job.checkpoint()  # merges buckets the column's checkpoint filled: their values stay
    same(["n", "v", "note"], by_spark=True)
    # a restore to checkpoint 1, before the ADD COLUMN: the replay ends where the source is
    request_restore(job.storage, job.storage.url(job.storage.chk_dir(1)), False, False)
    job.checkpoint()
    same(["n", "v", "note"])

    assert before and all("note" in pq.read_schema(f).names for f in files(appends)), "the earlier files filled"
    assert set(files(appends)) > before
    appended = unified(appends)
    merged = spark.read.option("mergeSchema", "true").parquet(str(appends)).toPandas()
    assert appended.num_rows == len(merged) == sum(pq.read_metadata(f).num_rows for f in files(appends))
    notes = {(r["id"], r["note"]) for r in appended.to_pylist() if r["note"] is not None}
    assert {(k, v[0]) for k, v in churn.select(["note"]).items() if v[0] is not None} <= notes
    by_spark = zip(merged["id"], merged["note"], strict=True)
    assert sorted(notes) == sorted((int(i), str(v)) for i, v in by_spark if v is not None)

    # int4 -> int8: Spark's mergeSchema reads no table whose files disagree on a type: refused, naming both
    conn.execute(f"ALTER TABLE {table} ALTER COLUMN n TYPE bigint")
    churn.run(2, {"n": lambda r: 2**40 + r.randrange(9), "v": short, "note": short})
    refused(job, r"Parquet table .*retyped column\(s\) n \(int in the table, bigint in the input\).*mergeSchema")
    assert all(pq.read_schema(f).field("n").type == pa.int32() for f in files(upserts)), "nothing committed"
    conn.close()
