"""Example: the clickstream aggregates written to PostgreSQL, exactly once.

The same pipeline as ``example_clickstream`` (click events landing as JSON Lines → page views
and user totals, keyed state carried from checkpoint to checkpoint), with its tables in
PostgreSQL instead of Parquet: two upsert tables (one row per page, one per user) and the raw
events appended. Each DAG run is one checkpoint; its finalize moves the rows each step staged
into the three tables, each in one short transaction.

The server comes from the Airflow connection ``CLICKSTREAM_PG_CONN`` (default
``clickstream_pg``, of type ``postgres``), for example::

    export AIRFLOW_CONN_CLICKSTREAM_PG='postgres://loader:secret@db.example.com:5432/analytics'

The tables go to the schema ``CLICKSTREAM_PG_SCHEMA`` (default ``public``), created beforehand.
Parsing this file needs neither the connection nor the server: a run checks them before any
Spark work. Landing directory: ``$CLICKSTREAM_DIR/landing`` (as ``example_clickstream``).
"""

from __future__ import annotations

import os

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate, PostgresTableSink

BASE = os.environ.get("CLICKSTREAM_DIR") or os.path.join(os.environ.get("AIRFLOW_HOME", "."), "clickstream")
CONN_ID = os.environ.get("CLICKSTREAM_PG_CONN") or "clickstream_pg"
SCHEMA = os.environ.get("CLICKSTREAM_PG_SCHEMA") or "public"
EVENT_SCHEMA = "user STRING, page STRING, ts LONG"

with CheckpointedPipeline(
    dag_id="example_postgres",
    schedule=None,
    storage=os.environ.get("CLICKSTREAM_PG_STORAGE") or None,
    retained_checkpoints=3,
    doc_md=__doc__,
) as pipeline:
    events = FileSource(uid="events", path=f"{BASE}/landing", format="json", schema=EVENT_SCHEMA)

    page_views = KeyedAggregate(
        uid="page_views",
        input=events,
        keys=["page"],
        aggs={"views": "count", "last_seen": "max(ts)"},
    )
    PostgresTableSink(
        uid="page_views_pg",
        input=page_views,
        conn_id=CONN_ID,
        table=f"{SCHEMA}.page_views",
        mode="upsert",
        keys=["page"],
        undo_checkpoints=3,  # a restore can return to any retained checkpoint
    )

    user_totals = KeyedAggregate(
        uid="user_totals",
        input=events,
        keys=["user"],
        aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"},
    )
    PostgresTableSink(
        uid="user_totals_pg",
        input=user_totals,
        conn_id=CONN_ID,
        table=f"{SCHEMA}.user_totals",
        mode="upsert",
        keys=["user"],
        undo_checkpoints=3,
    )

    PostgresTableSink(uid="events_pg", input=events, conn_id=CONN_ID, table=f"{SCHEMA}.events")  # append

dag = pipeline.dag
