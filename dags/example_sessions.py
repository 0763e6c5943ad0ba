"""Example: user sessions of a clickstream by event time, with late data, into Delta, exactly once.

Click events land as JSON Lines with an ISO-8601 time. A user's session is their clicks with
no gap of 30 minutes or more between them; it is final once the watermark (the greatest
event time seen, minus 10 minutes of allowed out-of-orderness) passes its end, and it is then
appended to the Delta table ``marts/sessions`` once, by the checkpoint that closes it. A click
that arrives after its session was closed is dropped and counted (``late_rows_dropped`` in
the checkpoint's stats). See docs/event-time.md.

Paths default to ``$AIRFLOW_HOME/sessions``; set ``SESSIONS_DIR`` to move them.
"""

from __future__ import annotations

import os

from airflow_provider_checkpoint import CheckpointedPipeline, DeltaTableSink, FileSource, WindowAggregate, session

BASE = os.environ.get("SESSIONS_DIR") or os.path.join(os.environ.get("AIRFLOW_HOME", "."), "sessions")

with CheckpointedPipeline(dag_id="example_sessions", schedule=None, retained_checkpoints=3, doc_md=__doc__) as pipeline:
    clicks = FileSource(
        uid="clicks", path=f"{BASE}/landing", format="json", schema="user STRING, page STRING, ts TIMESTAMP"
    )
    sessions = WindowAggregate(
        uid="sessions",
        input=clicks,
        keys=["user"],
        time_column="ts",
        window=session("30 minutes"),
        aggs={"clicks": "count", "first_click": "min(ts)", "last_click": "max(ts)"},
        watermark=("ts", "10 minutes"),
    )
    DeltaTableSink(uid="sessions_table", input=sessions, path=f"{BASE}/marts/sessions", mode="append")

dag = pipeline.dag
