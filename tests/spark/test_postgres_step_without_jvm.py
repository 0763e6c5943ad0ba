"""Into a ``PostgresTableSink``, a step whose source read its rows on the driver starts no Spark session.

A CDC stream checkpoint (``PostgresCdcSource``) and a small Parquet ``FileSource``, each feeding only a
PostgreSQL upsert table, hand their rows to the sink on the driver, which reduces and ``COPY``s them:
their step handle (:class:`~airflow_provider_checkpoint.spark.session.SparkHandle`) is never started. The
CDC source's first checkpoint (its snapshot, read by Spark) starts it, at once: its plan shows it. The
tables are compared with a ``SELECT`` of the source table at the barrier (CDC) and with pandas over the
landed files (Parquet).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink
from airflow_provider_checkpoint.dataflow import FileSource
from airflow_provider_checkpoint.spark.session import SparkHandle, embedded_conf
from airflow_provider_checkpoint.spark.step_reads import spark_on_first_use
from airflow_provider_checkpoint.testing.inprocess import make_job
from tests.servers.postgres import PostgresServer, cdc_connection
from tests.spark.test_parquet_source_on_driver import KEYS, SCHEMA, land, normalized, truth

pytestmark = pytest.mark.spark


@pytest.fixture
def pg(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresServer]:
    monkeypatch.setenv("AIRFLOW_CONN_PG_TARGET", postgres_server.uri())
    with cdc_connection(postgres_server, monkeypatch, "nojvm_") as server:
        yield server


def _rows(server: PostgresServer, query: str) -> list[tuple[Any, ...]]:
    with server.connect() as db:
        return sorted(db.execute(query).fetchall())


def test_driver_read_steps_into_postgres_start_no_session(spark, pg: PostgresServer, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    source_table, cdc_target, files_target = f"nojvm_src_{tag}", f"nojvm_cdc_{tag}", f"nojvm_files_{tag}"
    with pg.connect() as db:
        db.execute(f"CREATE TABLE {source_table} (id bigint PRIMARY KEY, label text, value double precision)")
        db.execute(f"INSERT INTO {source_table} SELECT i, 'l' || i, i / 7.0 FROM generate_series(1, 50) AS i")

    def declare(base: Path) -> None:
        cdc = PostgresCdcSource("changes", [source_table], postgres_conn_id="cdc_pg", slot_name=f"nojvm_{tag}")
        PostgresTableSink("cdc", cdc, "pg_target", cdc_target, "upsert", ["id"], delete_when="deleted")
        files = FileSource("events", f"{base}/landing", "parquet", SCHEMA)
        PostgresTableSink("files", files, "pg_target", files_target, "upsert", KEYS)

    job = make_job(SparkHandle(lambda: spark, embedded_conf(None)), tmp_path, declare)
    landed: list[dict[str, object]] = []
    changes = [  # each checkpoint's row changes (after the first, its snapshot): one transaction each
        [],
        [f"UPDATE {source_table} SET label = label || 'u' WHERE id <= 10", f"DELETE FROM {source_table} WHERE id > 45"],
        [f"INSERT INTO {source_table} VALUES (100, NULL, 1.5)", f"UPDATE {source_table} SET id = 200 WHERE id = 1"],
    ]
    for i, statements in enumerate(changes, start=1):
        with pg.connect() as db, db.transaction():
            for statement in statements:
                db.execute(statement)
        landed += land(tmp_path / "landing", 40, seed=i)
        job.checkpoint()
        started = {step.removeprefix("step_") for (c, step), s in job.started.items() if c == i and s}
        assert started == ({"cdc"} if i == 1 else set()), (i, job.started)  # the snapshot is read by Spark
        assert job.plan is not None
        eager = {step for step in job.graph.steps if not spark_on_first_use(job.graph, step, job.plan)}
        assert eager == ({"step_cdc"} if i == 1 else set()), (i, eager)  # the snapshot's task starts it at once
        columns = "id, label, value"
        assert _rows(pg, f"SELECT {columns} FROM {cdc_target}") == _rows(pg, f"SELECT {columns} FROM {source_table}")
        with pg.connect() as db:
            got = pd.DataFrame(db.execute(f'SELECT "user", page, ts, amount FROM {files_target}').fetchall())
        got.columns = [*KEYS, "ts", "amount"]
        pd.testing.assert_frame_equal(normalized(got), truth(landed), obj=f"files after checkpoint {i}")
