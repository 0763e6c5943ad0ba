"""Example: a downstream DAG that waits for the clickstream pipeline's next checkpoint.

``CheckpointCompletedSensor`` waits (deferred, in the triggerer) until the
``example_clickstream`` job has committed a checkpoint newer than the latest one when
the sensor started; then ``report`` reads the committed ``page_views`` table, which
already holds that checkpoint's output.
"""

from __future__ import annotations

import datetime
import os

from airflow.sdk import DAG, task

from airflow_provider_checkpoint.sensors.checkpoint import CheckpointCompletedSensor

BASE = os.environ.get("CLICKSTREAM_DIR") or os.path.join(os.environ.get("AIRFLOW_HOME", "."), "clickstream")

with DAG(
    "example_downstream",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    tags=["checkpoint"],
    doc_md=__doc__,
) as dag:
    committed = CheckpointCompletedSensor(
        task_id="wait_for_checkpoint",
        job_id="example_clickstream",
        deferrable=True,
        poke_interval=2,
        timeout=3600,
    )

    @task
    def report(checkpoint: dict) -> dict:
        """Page views as committed by the checkpoint the sensor saw (or a newer one)."""
        import pyarrow.dataset as ds

        table = ds.dataset(f"{BASE}/marts/page_views", format="parquet").to_table().to_pandas()
        return {"checkpoint_id": checkpoint["checkpoint_id"], "pages": len(table), "views": int(table["views"].sum())}

    report(committed.output)
