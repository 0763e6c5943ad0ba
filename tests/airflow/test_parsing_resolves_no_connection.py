"""Parsing a pipeline's DAG file (what the DAG processor does) looks up no connection and opens no storage.

Connections are resolved when a task runs: a DAG file whose storage, sources and sinks all name
connections that are not defined (S3 through an ``aws`` connection, PostgreSQL, Kafka) parses,
and its finalize task's outlets are the tables' URLs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.sdk import BaseHook

from airflow_provider_checkpoint.storage import object_store
from tests.airflow.conftest import load_dag_module

DAG_FILE = """
from airflow_provider_checkpoint import (
    CheckpointedPipeline, DeltaTableSink, FileSource, KafkaSource, KeyedAggregate, ParquetTableSink, PostgresTableSink,
)

lake = {"conn_id": "undefined_lake"}
with CheckpointedPipeline(dag_id="parse_only", schedule=None, storage="s3://bucket/checkpoints",
                          storage_conn_id="undefined_lake", dead_letter_path="s3://bucket/dead") as pipeline:
    files = FileSource("files", "s3://bucket/landing", "json", "user STRING, ts LONG", storage_options=lake)
    stream = KafkaSource("stream", ["clicks"], kafka_config_id="undefined_kafka", schema="user STRING, ts LONG")
    totals = KeyedAggregate("totals", files, keys=["user"], aggs={"n": "count"})
    ParquetTableSink("totals_parquet", totals, "s3a://bucket/marts/totals/", "upsert", ["user"], storage_options=lake)
    DeltaTableSink("totals_delta", totals, "s3://bucket/lake/totals", "upsert", ["user"], storage_options=lake)
    PostgresTableSink("stream_pg", stream, conn_id="undefined_pg", table="public.stream")

dag = pipeline.dag
"""


def test_parsing_resolves_no_connection(airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[str] = []

    def refuse(conn_id: str) -> None:
        looked_up.append(conn_id)
        raise AssertionError(f"connection {conn_id!r} looked up while parsing")

    monkeypatch.setattr(BaseHook, "get_connection", classmethod(lambda cls, conn_id: refuse(conn_id)))
    monkeypatch.setattr(object_store, "_resolve_connection", refuse)
    (tmp_path / "parse_only.py").write_text(DAG_FILE)
    dag = load_dag_module(tmp_path / "parse_only.py").dag
    assert looked_up == []
    outlets = {a.uri for task in dag.tasks for a in task.outlets}
    assert outlets == {"s3://bucket/marts/totals", "s3://bucket/lake/totals"}
