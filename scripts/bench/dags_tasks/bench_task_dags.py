"""The tasks mode's DAGs: the object-store benchmark's small pipeline as users run it, three tasks a run.

``bench_s3`` and ``bench_local`` read ``<root>/landing`` and write ``<root>/parquet`` (upsert, 8 buckets)
and ``<root>/delta`` (append), checkpoints under ``<root>/checkpoints``, with ``<root>`` taken from
``BENCH_S3_ROOT`` (an ``s3://`` URL; credentials and endpoint from the AWS environment) and
``BENCH_LOCAL_ROOT`` (``file://``). ``bench_empty``: one task doing nothing, the floor of any task.
``BENCH_CHAIN=1``: each pipeline's checkpoint is one task (``chain=True``: trigger, step and finalize in one
process). ``BENCH_SPARK_CONN_ID``: the ``spark_connect`` connection the steps run through (on a warm Spark
Connect server the benchmark starts); unset, they run embedded.
"""

from __future__ import annotations

import datetime
import os

from airflow.sdk import dag, task

from airflow_provider_checkpoint import (
    CheckpointedPipeline,
    DeltaTableSink,
    FileSource,
    KeyedAggregate,
    ParquetTableSink,
)

SCHEMA = "user STRING, page STRING, ts LONG"


def pipeline(dag_id: str, root: str) -> CheckpointedPipeline:
    with CheckpointedPipeline(
        dag_id=dag_id,
        schedule=None,
        retained_checkpoints=3,
        storage=f"{root}/checkpoints",
        chain=os.environ.get("BENCH_CHAIN") == "1",
        spark_conn_id=os.environ.get("BENCH_SPARK_CONN_ID") or None,
    ) as declared:
        events = FileSource(uid="events", path=f"{root}/landing", format="json", schema=SCHEMA)
        totals = KeyedAggregate(
            uid="totals",
            input=events,
            keys=["user"],
            aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"},
        )
        ParquetTableSink(uid="table", input=totals, path=f"{root}/parquet", mode="upsert", keys=["user"])
        DeltaTableSink(uid="delta", input=totals, path=f"{root}/delta", mode="append")
    return declared


bench_s3 = pipeline("bench_s3", os.environ.get("BENCH_S3_ROOT", "s3://checkpoints/bench")).dag
bench_local = pipeline("bench_local", os.environ.get("BENCH_LOCAL_ROOT", "file:///tmp/checkpoint-bench/tasks")).dag


@dag(
    dag_id="bench_empty",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
)
def bench_empty() -> None:
    @task
    def nothing() -> None:
        """The floor of a task: process, task runner, DAG parse, state updates."""

    nothing()


bench_empty()
