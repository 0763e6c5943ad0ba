"""Example: enrich and aggregate a Kafka topic into two other topics, exactly once.

Orders (JSON values, keyed by user) from the topic ``ORDERS_TOPIC`` (default ``orders``) are
enriched (an order of 100 or more is ``big``) and produced to ``ENRICHED_TOPIC`` (default
``orders-enriched``) with their key and headers; per-user totals, kept as keyed state, go to
``TOTALS_TOPIC`` (default ``user-totals``) keyed by user: each checkpoint produces the users whose
totals changed, so the latest record of a key is its current total (a compacted topic keeps just
that). Each DAG run is one checkpoint: its barrier is every input partition's end offset, and its
finalize produces both outputs in one Kafka transaction each, with a marker that makes a retry
publish nothing twice. Read the outputs with ``isolation.level=read_committed``.

Connection (parsing this file needs none; the three topics must exist):

    export AIRFLOW_CONN_ORDERS_KAFKA='{"conn_type": "kafka", "extra": {"bootstrap.servers": "broker:9092"}}'
"""

from __future__ import annotations

import os

from airflow_provider_checkpoint import CheckpointedPipeline, KafkaSink, KafkaSource, KeyedAggregate, Transform

ORDERS = os.environ.get("ORDERS_TOPIC") or "orders"
ENRICHED = os.environ.get("ENRICHED_TOPIC") or "orders-enriched"
TOTALS = os.environ.get("TOTALS_TOPIC") or "user-totals"


def enrich(df):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    return df.withColumn("big", F.col("amount") >= 100)


with CheckpointedPipeline(
    dag_id="example_kafka_to_kafka", schedule=None, retained_checkpoints=3, doc_md=__doc__
) as pipeline:
    orders = KafkaSource(
        uid="orders",
        topics=[ORDERS],
        kafka_config_id="orders_kafka",
        schema="order_id LONG, user STRING, amount LONG",
        metadata_columns=("headers",),
        max_records_per_checkpoint=1_000_000,
    )
    enriched = Transform(uid="enriched", input=orders, fn=enrich)
    KafkaSink(
        uid="enriched_out",
        input=enriched,
        topic=ENRICHED,
        kafka_config_id="orders_kafka",
        key="user",
        value_columns=["order_id", "user", "amount", "big"],
        headers_column="headers",
        step="publish",
    )
    totals = KeyedAggregate(
        uid="user_totals",
        input=enriched,
        keys=["user"],
        aggs={"orders": "count", "spent": "sum(amount)", "biggest": "max(amount)"},
    )
    KafkaSink(uid="totals_out", input=totals, topic=TOTALS, kafka_config_id="orders_kafka", key="user", step="publish")

dag = pipeline.dag
