"""Example: orders enriched with a customers changelog → revenue per segment, exactly once, in two steps.

Orders land as JSON Lines in ``orders/``; customer changes (upserts and deletes, one
``updated_at`` version per change) land as CSV in ``customers/``. Every run is one
checkpoint that cuts one barrier across **both** inputs (aligned):

* step ``enrich`` joins the orders of the checkpoint with the customers **as of the end of
  the checkpoint** (an update and an order of the same customer in one checkpoint give the
  updated segment); an order whose customer is not known yet is held in state until the
  customer arrives, at most ``hold_ttl`` (then it goes out without a segment). It passes
  the enriched orders on through a **channel**;
* step ``publish`` reads exactly that channel: revenue per segment (an upsert table) and
  an archive of every enriched order (an append table). If it fails, Airflow retries it
  alone and it reads the same channel — ``enrich`` does not run again.

Paths default to ``$AIRFLOW_HOME/orders``; set ``ORDERS_DIR`` to move them.
"""

from __future__ import annotations

import datetime
import os

from airflow_provider_checkpoint import (
    Channel,
    CheckpointedPipeline,
    DimensionEnrichment,
    FileSource,
    KeyedAggregate,
    ParquetTableSink,
)

BASE = os.environ.get("ORDERS_DIR") or os.path.join(os.environ.get("AIRFLOW_HOME", "."), "orders")

with CheckpointedPipeline(dag_id="example_orders", schedule=None, doc_md=__doc__) as pipeline:
    orders = FileSource(
        uid="orders", path=f"{BASE}/orders", format="json", schema="order_id LONG, customer_id STRING, amount LONG"
    )
    customers = FileSource(
        uid="customers",
        path=f"{BASE}/customers",
        format="csv",
        schema="customer_id STRING, segment STRING, updated_at LONG, op STRING",
    )
    enriched = DimensionEnrichment(
        uid="enrich_orders",
        facts=orders,
        dimension=customers,
        keys=["customer_id"],
        version="updated_at",
        columns=["segment"],
        delete_when="op = 'D'",
        on_missing="hold",
        hold_ttl=datetime.timedelta(hours=1),
    )
    channel = Channel(uid="enriched_orders", input=enriched, step="enrich")

    revenue = KeyedAggregate(
        uid="revenue", input=channel, keys=["segment"], aggs={"revenue": "sum(amount)", "orders": "count"}
    )
    ParquetTableSink(
        uid="revenue_table",
        input=revenue,
        path=f"{BASE}/marts/revenue_by_segment",
        mode="upsert",
        keys=["segment"],
        step="publish",
    )
    ParquetTableSink(uid="orders_archive", input=channel, path=f"{BASE}/marts/enriched_orders", step="publish")

dag = pipeline.dag
