"""The DAG files of the chaos test (:mod:`tests.live.test_chaos`), written into its own DAGs folder.

* ``chaos_clickstream``: the example pipeline in one step, with dead letters, and besides its
  Parquet tables two Delta tables (user totals, upsert; each user's latest event by
  ``sequence_by``, upserted from the events through a filter: many rows per key per
  checkpoint, keys changed in most checkpoints) and a PostgreSQL table (page views, upsert); in
  the same step, clicks with event time (out of order, some late) through tumbling windows
  (``emit="final"``) appended to a Parquet table (:mod:`tests.live.chaos_windows`).
* ``chaos_orders``: two inputs, two steps (orders enriched with customers, through a channel).
* ``chaos_chained``: ``chain=True`` (one task per checkpoint): events appended to PostgreSQL,
  user totals upserted into Delta.
* ``chaos_kafka``: the same tables from a Kafka topic of three partitions (each range read by
  two Spark tasks), with each event's partition and offset appended to PostgreSQL and published,
  exactly once, to a second topic (``KafkaSink``).
"""

DAG_ID = "chaos_clickstream"

CHAOS_DAG = """
import datetime
import os

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate, ParquetTableSink, Transform
from airflow_provider_checkpoint.dataflow import DeltaTableSink, WindowAggregate, tumbling
from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink

BASE = os.environ["CHAOS_DIR"]

with CheckpointedPipeline(
    dag_id="chaos_clickstream",
    schedule=None,
    retained_checkpoints=3,
    inline_state_threshold=0,  # state in files: incremental, deltas and compactions in most checkpoints
    tolerable_failed_checkpoints=10_000,
    step_retries=2,
    finalize_retries=1,
    retry_delay=datetime.timedelta(seconds=1),
    on_malformed="dead_letter",  # to <storage root>/chaos_clickstream/dead_letters/events
) as pipeline:
    events = FileSource(uid="events", path=f"{BASE}/landing", format="json", schema="user STRING, page STRING, ts LONG")
    views = KeyedAggregate(uid="page_views", input=events, keys=["page"],
                           aggs={"views": "count", "last_seen": "max(ts)"})
    ParquetTableSink(uid="page_views_table", input=views, path=f"{BASE}/marts/page_views", mode="upsert",
                     keys=["page"], step="main")
    PostgresTableSink(uid="page_views_pg", input=views, conn_id="chaos_pg", table="chaos.page_views", mode="upsert",
                      keys=["page"], step="main")
    users = KeyedAggregate(uid="user_totals", input=events, keys=["user"],
                           aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"})
    ParquetTableSink(uid="user_totals_table", input=users, path=f"{BASE}/marts/user_totals", mode="upsert",
                     keys=["user"], step="main")
    DeltaTableSink(uid="user_totals_delta", input=users, path=f"{BASE}/lake/user_totals", mode="upsert",
                   keys=["user"], step="main")
    # the landed events (their ts grow with the landing order), not the good lines of the mixed files:
    # sequence_by orders the rows of one checkpoint, and a later checkpoint's row replaces an earlier one
    landed = Transform(uid="landed_events", input=events, fn=lambda df: df.where("ts >= 1000000000"))
    DeltaTableSink(uid="user_last_event_delta", input=landed, path=f"{BASE}/lake/user_last_event", mode="upsert",
                   keys=["user"], sequence_by=["ts", "page"], buckets=4, step="main")
    ParquetTableSink(uid="events_archive", input=events, path=f"{BASE}/marts/events", mode="append", step="main")
    clicks = FileSource(uid="clicks", path=f"{BASE}/clicks", format="json",
                        schema="user STRING, ts TIMESTAMP, amount LONG")
    windows = WindowAggregate(uid="click_windows", input=clicks, keys=["user"], time_column="ts",
                              window=tumbling("2 minutes"), aggs={"clicks": "count", "total": "sum(amount)"},
                              watermark=("ts", "3 minutes"))
    ParquetTableSink(uid="click_windows_table", input=windows, path=f"{BASE}/marts/click_windows", mode="append",
                     step="main")

dag = pipeline.dag
"""

ORDERS_DAG_ID = "chaos_orders"
ORDERS_DAG = """
import datetime
import os

from airflow_provider_checkpoint import (
    Channel, CheckpointedPipeline, DimensionEnrichment, FileSource, KeyedAggregate, ParquetTableSink,
)

BASE = os.environ["CHAOS_DIR"] + "/orders"

with CheckpointedPipeline(
    dag_id="chaos_orders",
    schedule=None,
    retained_checkpoints=3,
    inline_state_threshold=0,
    tolerable_failed_checkpoints=10_000,
    step_retries=2,
    finalize_retries=1,
    retry_delay=datetime.timedelta(seconds=1),
) as pipeline:
    orders = FileSource(uid="orders", path=f"{BASE}/orders", format="json",
                        schema="order_id LONG, customer_id STRING, amount LONG")
    customers = FileSource(uid="customers", path=f"{BASE}/customers", format="csv",
                           schema="customer_id STRING, segment STRING, updated_at LONG, op STRING")
    enriched = DimensionEnrichment(uid="enrich_orders", facts=orders, dimension=customers, keys=["customer_id"],
                                   version="updated_at", columns=["segment"], on_missing="hold",
                                   hold_ttl=datetime.timedelta(days=1))
    channel = Channel(uid="enriched_orders", input=enriched, step="enrich")
    revenue = KeyedAggregate(uid="revenue", input=channel, keys=["segment"],
                             aggs={"revenue": "sum(amount)", "orders": "count"})
    ParquetTableSink(uid="revenue_table", input=revenue, path=f"{BASE}/marts/revenue_by_segment", mode="upsert",
                     keys=["segment"], step="publish")
    ParquetTableSink(uid="orders_archive", input=channel, path=f"{BASE}/marts/enriched_orders", step="publish")

dag = pipeline.dag
"""

CHAINED_DAG_ID = "chaos_chained"
CHAINED_DAG = """
import datetime
import os

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate
from airflow_provider_checkpoint.dataflow import DeltaTableSink
from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink

BASE = os.environ["CHAOS_DIR"] + "/chained"

with CheckpointedPipeline(
    dag_id="chaos_chained",
    schedule=None,
    chain=True,  # trigger, step and finalize in one task; a retry cuts a new barrier
    retained_checkpoints=3,
    inline_state_threshold=0,
    tolerable_failed_checkpoints=10_000,
    step_retries=2,
    retry_delay=datetime.timedelta(seconds=1),
) as pipeline:
    events = FileSource(uid="events", path=f"{BASE}/landing", format="json", schema="user STRING, page STRING, ts LONG")
    PostgresTableSink(uid="events_pg", input=events, conn_id="chaos_pg", table="chaos.chained_events", step="main")
    users = KeyedAggregate(uid="user_totals", input=events, keys=["user"],
                           aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"})
    DeltaTableSink(uid="user_totals_delta", input=users, path=f"{BASE}/lake/user_totals", mode="upsert",
                   keys=["user"], step="main")

dag = pipeline.dag
"""

KAFKA_DAG_ID = "chaos_kafka"
KAFKA_TOPIC = "chaos-events"
KAFKA_OUT_TOPIC = "chaos-events-out"
KAFKA_DAG = """
import datetime
import os

from airflow_provider_checkpoint import CheckpointedPipeline, DeltaTableSink, KafkaSink, KafkaSource, KeyedAggregate
from airflow_provider_checkpoint import PostgresTableSink

BASE = os.environ["CHAOS_DIR"] + "/kafka"

with CheckpointedPipeline(
    dag_id="chaos_kafka",
    schedule=None,
    retained_checkpoints=3,
    inline_state_threshold=0,
    tolerable_failed_checkpoints=10_000,
    step_retries=2,
    finalize_retries=1,
    retry_delay=datetime.timedelta(seconds=1),
) as pipeline:
    events = KafkaSource(uid="events", topics=["chaos-events"], kafka_config_id="chaos_kafka", format="json",
                         schema="user STRING, page STRING, ts LONG", metadata_columns=["partition", "offset"],
                         min_partitions=6)
    PostgresTableSink(uid="events_pg", input=events, conn_id="chaos_pg", table="chaos.kafka_events", step="main")
    KafkaSink(uid="events_out", input=events, topic="chaos-events-out", kafka_config_id="chaos_kafka", key="user",
              step="main")
    users = KeyedAggregate(uid="user_totals", input=events, keys=["user"],
                           aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"})
    DeltaTableSink(uid="user_totals_delta", input=users, path=f"{BASE}/lake/user_totals", mode="upsert",
                   keys=["user"], step="main")

dag = pipeline.dag
"""
CDC_DAG_ID = "chaos_cdc"
CDC_TABLE = "chaos_src.accounts"
CDC_DAG = """
import datetime
import os

from airflow_provider_checkpoint import CheckpointedPipeline, DeltaTableSink, PostgresCdcSource, PostgresTableSink

BASE = os.environ["CHAOS_DIR"] + "/cdc"

with CheckpointedPipeline(
    dag_id="chaos_cdc",
    schedule=None,
    retained_checkpoints=3,
    tolerable_failed_checkpoints=10_000,
    step_retries=2,
    finalize_retries=1,
    retry_delay=datetime.timedelta(seconds=1),
) as pipeline:
    changes = PostgresCdcSource(uid="accounts", tables=["chaos_src.accounts"], postgres_conn_id="chaos_pg")
    DeltaTableSink(uid="accounts_delta", input=changes, path=f"{BASE}/lake/accounts", mode="upsert", keys=["id"],
                   delete_when="deleted", step="main")
    PostgresTableSink(uid="accounts_pg", input=changes, conn_id="chaos_pg", table="chaos.cdc_accounts", mode="upsert",
                      keys=["id"], delete_when="deleted", step="main")

dag = pipeline.dag
"""
DAG_SOURCES = {
    DAG_ID: CHAOS_DAG,
    ORDERS_DAG_ID: ORDERS_DAG,
    CHAINED_DAG_ID: CHAINED_DAG,
    KAFKA_DAG_ID: KAFKA_DAG,
    CDC_DAG_ID: CDC_DAG,
}
ROTATION = (DAG_ID, ORDERS_DAG_ID, CHAINED_DAG_ID, KAFKA_DAG_ID, CDC_DAG_ID)
