"""Checkpoints of a keyed aggregate run over a Spark Connect server, in a process of their own (a classic and a
remote session do not mix in one process): ``python -m tests.spark.connect_steps <sc://url> <base> <checkpoints>
[spark]`` (``spark``: no input is small enough for the driver merge, so every state is written by Spark jobs).

Each checkpoint lands events (:func:`~airflow_provider_checkpoint.testing.clickstream.land_events`), runs
trigger, step and finalize in this process on the remote session, and prints one JSON line: the checkpoint's
step metrics and, for the landing directory, Spark's size estimate as the driver sees it
(:func:`~airflow_provider_checkpoint.dataflow.driver_rows.estimated_bytes`) beside the files' bytes, and its
row estimate (:func:`~airflow_provider_checkpoint.state.spark_backend.estimated_rows`) and the server's task slots
(:func:`~airflow_provider_checkpoint.dataflow.driver_rows.task_slots`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from airflow_provider_checkpoint.dataflow import FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.dataflow.driver_rows import estimated_bytes, task_slots
from airflow_provider_checkpoint.state.spark_backend import estimated_rows
from airflow_provider_checkpoint.testing.clickstream import land_events
from airflow_provider_checkpoint.testing.inprocess import make_job

SCHEMA = "user STRING, page STRING, ts LONG"
EVENTS, USERS = 400, 300


def declare(base: Path) -> None:
    events = FileSource("events", str(base / "landing"), "json", SCHEMA)
    totals = KeyedAggregate(
        "user_totals", events, keys=["user"], aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"}
    )
    ParquetTableSink("user_totals_table", totals, str(base / "table"), mode="upsert", keys=["user"])


def main(url: str, base: Path, checkpoints: int, spark_only: bool) -> None:
    from pyspark.sql import SparkSession

    from airflow_provider_checkpoint.state import driver_merge

    if spark_only:  # no input is within the driver's bounds (driver_merge.within_driver_bounds)
        driver_merge.DRIVER_INPUT_BYTES = driver_merge.FIRST_STATE_INPUT_BYTES = -1

    spark = SparkSession.builder.remote(url).create()
    try:
        job = make_job(spark, base, declare, inline_state_threshold=0)  # state files, not inline: incremental
        for i in range(1, checkpoints + 1):
            land_events(base / "landing", f"events-{i}.json", EVENTS, i, users=USERS)
            completed = job.checkpoint()
            landing = spark.read.schema(SCHEMA).json(str(base / "landing"))
            files = sum(p.stat().st_size for p in (base / "landing").glob("events-*.json"))
            line = {"checkpoint": completed.checkpoint_id, "steps": completed.stats["steps"]}
            line |= {"estimated_bytes": estimated_bytes(landing), "estimated_rows": estimated_rows(landing)}
            line["task_slots"] = task_slots(spark)
            print(json.dumps({**line, "file_bytes": files}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] == ["spark"])
