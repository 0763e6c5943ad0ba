"""Example: a Kafka topic into Delta Lake and PostgreSQL, exactly once.

What a Spark Structured Streaming user writes as ``readStream.format("kafka")`` with
``availableNow`` into Delta: click events (JSON values) from the topic ``KAFKA_TOPIC`` (default
``clicks``) → per-user totals as keyed state → a Delta upsert table and a PostgreSQL upsert
table, plus the raw events appended to Delta with their partition and offset. Each DAG run is
one checkpoint: its barrier is every partition's end offset, its steps read exactly the
records since the previous checkpoint, and its finalize commits both tables. A restore
replays from the restored checkpoint's offsets. Once a checkpoint completes, its offsets are
committed to the connection's ``group.id`` (or ``airflow-checkpoint-clicks``), so ordinary
Kafka tooling shows the job's lag.

Connections (parsing this file needs neither):

    export AIRFLOW_CONN_CLICKS_KAFKA='{"conn_type": "kafka", "extra": {"bootstrap.servers": "broker:9092"}}'
    export AIRFLOW_CONN_CLICKS_PG='postgres://loader:secret@db.example.com:5432/analytics'

Tables: Delta under ``$KAFKA_EXAMPLE_DIR/lake`` (default ``$AIRFLOW_HOME/kafka-example``), the
PostgreSQL table ``public.click_totals`` (schema ``KAFKA_PG_SCHEMA``).
"""

from __future__ import annotations

import os

from airflow_provider_checkpoint import (
    CheckpointedPipeline,
    DeltaTableSink,
    KafkaSource,
    KeyedAggregate,
    PostgresTableSink,
)

BASE = os.environ.get("KAFKA_EXAMPLE_DIR") or os.path.join(os.environ.get("AIRFLOW_HOME", "."), "kafka-example")
TOPIC = os.environ.get("KAFKA_TOPIC") or "clicks"
SCHEMA = os.environ.get("KAFKA_PG_SCHEMA") or "public"

with CheckpointedPipeline(dag_id="example_kafka", schedule=None, retained_checkpoints=3, doc_md=__doc__) as pipeline:
    clicks = KafkaSource(
        uid="clicks",
        topics=[TOPIC],
        kafka_config_id="clicks_kafka",
        format="json",
        schema="user STRING, page STRING, ts LONG",
        max_records_per_checkpoint=5_000_000,  # a backlog is worked off over several checkpoints
    )
    totals = KeyedAggregate(
        uid="click_totals",
        input=clicks,
        keys=["user"],
        aggs={"clicks": "count", "last_ts": "max(ts)"},
    )
    DeltaTableSink(
        uid="click_totals_delta", input=totals, path=f"{BASE}/lake/click_totals", mode="upsert", keys=["user"]
    )
    PostgresTableSink(
        uid="click_totals_pg",
        input=totals,
        conn_id="clicks_pg",
        table=f"{SCHEMA}.click_totals",
        mode="upsert",
        keys=["user"],
        undo_checkpoints=3,
    )
    DeltaTableSink(uid="clicks_delta", input=clicks, path=f"{BASE}/lake/clicks", mode="append")

dag = pipeline.dag
