"""Example: click events landing as JSON Lines → page views and user totals, exactly once.

Every run of this DAG is one checkpoint: it cuts a barrier across the landing directory,
runs one Spark job per step (page views, user totals, raw archive), and commits the
three Parquet tables with two-phase commit. Keyed state (the running counts) is carried
from checkpoint to checkpoint.

Paths default to ``$AIRFLOW_HOME/clickstream``; set ``CLICKSTREAM_DIR`` to move them. The
checkpoints go under ``[checkpoint] storage_root`` unless ``CLICKSTREAM_STORAGE`` names a
storage root of this pipeline's own (``storage=``).
"""

from __future__ import annotations

import os

from airflow_provider_checkpoint import (
    CheckpointedPipeline,
    FileSource,
    KeyedAggregate,
    ParquetTableSink,
)

BASE = os.environ.get("CLICKSTREAM_DIR") or os.path.join(os.environ.get("AIRFLOW_HOME", "."), "clickstream")
EVENT_SCHEMA = "user STRING, page STRING, ts LONG"

with CheckpointedPipeline(
    dag_id="example_clickstream",
    schedule=None,
    storage=os.environ.get("CLICKSTREAM_STORAGE") or None,
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
    ParquetTableSink(
        uid="page_views_table", input=page_views, path=f"{BASE}/marts/page_views", mode="upsert", keys=["page"]
    )

    user_totals = KeyedAggregate(
        uid="user_totals",
        input=events,
        keys=["user"],
        aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"},
    )
    ParquetTableSink(
        uid="user_totals_table", input=user_totals, path=f"{BASE}/marts/user_totals", mode="upsert", keys=["user"]
    )

    ParquetTableSink(uid="events_archive", input=events, path=f"{BASE}/marts/events", mode="append")

dag = pipeline.dag
