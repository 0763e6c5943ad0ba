"""Example: a lakehouse of two checkpointed pipelines chained through a Delta table, exactly once.

* ``example_lakehouse_ingest``: click events landing as JSON Lines → events and last
  activity per user → the Delta table ``lake/user_totals``, upserted by ``user`` (one Delta
  commit per checkpoint).
* ``example_lakehouse_tiers``: scheduled on that table's Asset, reads its changes with
  ``DeltaSource(change_data_feed=True)`` and keeps users and events per activity tier in
  the Delta table ``lake/tiers``. A user's update arrives as a pre-image (counted −1 in its
  old tier) and a post-image (+1 in the new one), so the tiers stay equal to the user totals
  however many upstream commits one run reads.

Each commit of ``user_totals`` is read by exactly one completed checkpoint of the second
job: its barrier records the table version. Paths default to ``$AIRFLOW_HOME/lakehouse``;
set ``LAKEHOUSE_DIR`` to move them.
"""

from __future__ import annotations

import os

from airflow.sdk import Asset

from airflow_provider_checkpoint import CheckpointedPipeline, DeltaSource, FileSource, KeyedAggregate, Transform
from airflow_provider_checkpoint.dataflow import DeltaTableSink

BASE = os.environ.get("LAKEHOUSE_DIR") or os.path.join(os.environ.get("AIRFLOW_HOME", "."), "lakehouse")
USER_TOTALS = f"{BASE}/lake/user_totals"
TIER = "CASE WHEN events >= 20 THEN 'heavy' WHEN events >= 10 THEN 'regular' ELSE 'light' END"
SIGN = "CASE WHEN _change_type IN ('insert', 'update_postimage') THEN 1 ELSE -1 END"

with CheckpointedPipeline(dag_id="example_lakehouse_ingest", schedule=None, doc_md=__doc__) as ingest:
    events = FileSource(uid="events", path=f"{BASE}/landing", format="json", schema="user STRING, page STRING, ts LONG")
    user_totals = KeyedAggregate(
        uid="user_totals", input=events, keys=["user"], aggs={"events": "count", "last_seen": "max(ts)"}
    )
    user_totals_table = DeltaTableSink(
        uid="user_totals_table", input=user_totals, path=USER_TOTALS, mode="upsert", keys=["user"]
    )

with CheckpointedPipeline(
    dag_id="example_lakehouse_tiers", schedule=[Asset(user_totals_table.asset_uri())], doc_md=__doc__
) as tiers_pipeline:
    changes = DeltaSource(uid="user_totals_changes", path=USER_TOTALS, change_data_feed=True)
    signed = Transform(
        uid="signed",
        input=changes,
        fn=lambda df: df.selectExpr(f"{TIER} AS tier", f"{SIGN} AS sign", f"({SIGN}) * events AS signed_events"),
    )
    tiers = KeyedAggregate(
        uid="tiers", input=signed, keys=["tier"], aggs={"users": "sum(sign)", "events": "sum(signed_events)"}
    )
    DeltaTableSink(uid="tiers_table", input=tiers, path=f"{BASE}/lake/tiers", mode="upsert", keys=["tier"])

ingest_dag = ingest.dag
tiers_dag = tiers_pipeline.dag
