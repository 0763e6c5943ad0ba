"""The tasks-upsert mode's DAGs: the Delta upsert sink against delta-rs ``MERGE`` of the same rows, as tasks.

``bench_delta_upsert``: ``<root>/landing`` (Parquet files of ``user``, ``total``, ``label``) → ``DeltaTableSink``
upsert by ``user`` into ``<root>/upsert``, three tasks a run (trigger, step, finalize). ``bench_delta_merge``: one
task that reads the run's landed file (``conf["file"]``) with pyarrow, then merges it into ``<root>/merge``
with delta-rs (``write_deltalake`` the first time, then ``MERGE ... when_matched_update_all()
.when_not_matched_insert_all()``), as a user without this provider would; it logs the merge's own seconds
and the read's. ``<root>``: ``BENCH_UPSERT_ROOT``; ``BENCH_DRIVER_READ_BYTES``: the source's ``driver_read_bytes``.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from typing import Any

from airflow.sdk import dag, task

if profile_dir := os.environ.get("BENCH_TASK_PROFILE"):
    from bench.task_profile import install

    install(profile_dir)

from airflow_provider_checkpoint import CheckpointedPipeline, DeltaTableSink, FileSource

ROOT = os.environ.get("BENCH_UPSERT_ROOT", "/tmp/checkpoint-bench/upsert")

with CheckpointedPipeline(
    dag_id="bench_delta_upsert", schedule=None, retained_checkpoints=3, storage=f"{ROOT}/checkpoints"
) as declared:
    rows = FileSource(
        "rows",
        f"{ROOT}/landing",
        "parquet",
        "user LONG, total LONG, label STRING",
        **({"driver_read_bytes": int(v)} if (v := os.environ.get("BENCH_DRIVER_READ_BYTES")) is not None else {}),
    )
    DeltaTableSink(uid="upsert", input=rows, path=f"{ROOT}/upsert", mode="upsert", keys=["user"])
bench_delta_upsert = declared.dag


@dag(
    dag_id="bench_delta_merge",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
)
def bench_delta_merge() -> None:
    @task
    def merge(**context: Any) -> None:
        """delta-rs ``MERGE`` of the run's landed file into ``<root>/merge`` (the first run writes the table)."""
        import pyarrow.parquet as pq
        from deltalake import DeltaTable, write_deltalake

        read = time.perf_counter()
        source = pq.read_table(f"{ROOT}/landing/{context['dag_run'].conf['file']}")
        path, started = f"{ROOT}/merge", time.perf_counter()
        if not os.path.exists(f"{path}/_delta_log"):
            write_deltalake(path, source)
        else:
            (
                DeltaTable(path)
                .merge(source, "t.user = s.user", source_alias="s", target_alias="t")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
        logging.getLogger(__name__).info(
            "merge: %d rows in %.3fs (read %.3fs)", source.num_rows, time.perf_counter() - started, started - read
        )

    merge()


bench_delta_merge()
