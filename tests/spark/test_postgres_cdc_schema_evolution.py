"""Sinks that follow a captured table's schema in their own commit (``schema_evolution="additive"``), against
the real PostgreSQL server: a Delta upsert table read back with delta-rs and DuckDB's ``delta_scan`` and a
PostgreSQL upsert table read with psycopg, both compared with psycopg SELECTs of the source after every checkpoint.

An ``ADD COLUMN`` on the source between checkpoints: a fault before ``_metadata`` leaves both targets without
the column; a fault inside the PostgreSQL commit transaction (the column added, the rows moved) leaves it
without the column too, and the recovery's commit adds it once, with the rows. A restore to the checkpoint
before the column keeps it (null in the rows put back) and replays. An int4 → int8 widening is followed by
the PostgreSQL table and refused by the Delta sink naming table, column and both types.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
from airflow_provider_checkpoint.dataflow import DeltaTableSink, PostgresTableSink
from airflow_provider_checkpoint.exceptions import CheckpointAborted, InjectedFault
from airflow_provider_checkpoint.restore.requests import request_restore
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.postgres import PostgresServer, cdc_connection
from tests.spark.sink_model import duckdb_delta_rows, sort_rows
from tests.spark.test_postgres_cdc_ddl import NUMBER, Churn, captured, delta, refused, short

pytestmark = pytest.mark.spark


@pytest.fixture
def pg(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresServer]:
    with cdc_connection(postgres_server, monkeypatch, "cdc_evolve_") as server:
        yield server


def columns(conn: Any, table: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def copied(conn: Any, table: str, names: list[str]) -> dict[int, tuple[Any, ...]]:
    rows = conn.execute(f"SELECT id, {', '.join(names)} FROM {table}").fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def test_an_added_column_reaches_delta_and_postgres_in_the_commit_of_its_rows(spark, pg, tmp_path, monkeypatch):
    n = uuid.uuid4().hex[:6]
    table, copy, slot, path = f"cdc_evolve_{n}", f"cdc_evolve_{n}_copy", f"cdc_evolve_{n}", tmp_path / "lake"
    conn, churn = captured(pg, table, "v text")
    number = NUMBER

    def declare(tmp: Path) -> None:
        changes = PostgresCdcSource("src", [table], postgres_conn_id="cdc_pg", slot_name=slot)
        evolve = {"mode": "upsert", "keys": ["id"], "delete_when": "deleted", "schema_evolution": "additive"}
        DeltaTableSink("lake", changes, str(path), **evolve)
        PostgresTableSink(f"copy_{n}", changes, "cdc_pg", copy, undo_checkpoints=6, **evolve)

    def same(names: list[str]) -> None:
        expected = churn.select(names)
        assert delta(path, names) == expected  # delta-rs
        assert duckdb_delta_rows(path, ["id", *names]) == sort_rows((k, *v) for k, v in expected.items())
        assert copied(conn, copy, names) == expected

    job = make_job(spark, tmp_path, declare, retained_checkpoints=6)
    job.checkpoint()
    same(["n", "v"])

    churn.run(4, {**number, "v": short})
    conn.execute(f"ALTER TABLE {table} ADD COLUMN note text")
    churn.run(4, {**number, "v": short, "note": lambda r: f"note{r.randrange(99)}"})
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.before_metadata")
    with pytest.raises(CheckpointAborted, match="finalize.before_metadata"):  # staged into both, nothing committed
        job.checkpoint()
    assert "note" not in DeltaTable(str(path)).schema().to_arrow().names
    assert "note" not in columns(conn, copy)

    monkeypatch.setenv("CHECKPOINT_FAULTS", f"finalize.inside_sink_commit:sink=copy_{n}")
    with pytest.raises(InjectedFault):  # the PostgreSQL commit added the column and moved the rows, then died
        job.checkpoint()
    assert "note" not in columns(conn, copy), "the failed commit transaction left no column"
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    churn.run(4, {**number, "v": short, "note": short})
    job.checkpoint()  # the recovery commits the checkpoint (adding the column once), then the next one
    assert list(columns(conn, copy))[-1] == "note" and columns(conn, copy)["note"] == "text"
    same(["n", "v", "note"])

    request_restore(job.storage, job.storage.url("chk-1"), False, False)  # before the column: it stays
    churn.run(3, {**number, "v": short, "note": short})
    replayed = job.checkpoint()
    assert replayed.restored_from == 1
    assert "note" in columns(conn, copy)
    same(["n", "v", "note"])

    # int4 -> int8: the PostgreSQL table follows in its commit, the Delta table refuses naming both types
    conn.execute(f"ALTER TABLE {table} ALTER COLUMN n TYPE bigint")
    churn.run(2, {"n": lambda r: 2**40 + r.randrange(9), "v": short, "note": short})
    refused(job, r"lake.*retyped column\(s\) n \(integer in the table, long in the input\)")
    assert columns(conn, copy)["n"] == "integer", "the refused checkpoint committed nothing"
    conn.close()


def test_a_widened_number_column_is_widened_in_the_postgres_commit(spark, pg, tmp_path):
    n = uuid.uuid4().hex[:6]
    table, copy, slot = f"cdc_evolve_w{n}", f"cdc_evolve_w{n}_copy", f"cdc_evolve_w{n}"
    conn = pg.connect()
    conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, n int, x real)")
    churn = Churn(conn, table)
    small = {"n": lambda r: r.randrange(-1000, 1000), "x": lambda r: float(r.randrange(100)) / 4}
    churn.run(6, small)

    def declare(tmp: Path) -> None:
        changes = PostgresCdcSource("src", [table], postgres_conn_id="cdc_pg", slot_name=slot)
        PostgresTableSink(
            f"wide_{n}", changes, "cdc_pg", copy, mode="upsert", keys=["id"], delete_when="deleted",
            schema_evolution="additive",
        )  # fmt: skip

    job = make_job(spark, tmp_path, declare, retained_checkpoints=3)
    job.checkpoint()
    assert copied(conn, copy, ["n", "x"]) == churn.select(["n", "x"])
    conn.execute(f"ALTER TABLE {table} ALTER COLUMN n TYPE bigint, ALTER COLUMN x TYPE double precision")
    churn.run(6, {"n": lambda r: 2**40 + r.randrange(9), "x": lambda r: 1 / 3 + r.randrange(9)})
    job.checkpoint()
    assert (columns(conn, copy)["n"], columns(conn, copy)["x"]) == ("bigint", "double precision")
    assert copied(conn, copy, ["n", "x"]) == churn.select(["n", "x"])
    conn.close()
