"""The scheduler mode's DAGs over one landing directory (``BENCH_DIR``, set by the benchmark).

``bench_ours``: the provider's pipeline (``FileSource`` → ``KeyedAggregate`` → upsert
``ParquetTableSink``), one checkpoint per run in three tasks; ``bench_chained``: the same with
``chain=True`` (trigger, step and finalize in one task). ``bench_ss``: one ``@task`` running the same job
as a Structured Streaming query with ``availableNow`` on the RocksDB state store with changelog
checkpointing, in the provider's embedded session (``get_spark``: same JVM options).

With a warm Spark Connect server (``--connect``: the benchmark starts one for the whole run and sets
``BENCH_CONNECT_URL`` and the ``bench_spark_connect`` connection): ``bench_connect``, ``bench_ours`` whose
steps run on that server (``spark_conn_id``), ``bench_connect_chained``, the same in one task (``chain=True``),
and ``bench_ss_connect``, ``bench_ss``'s query on it.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

from airflow.sdk import dag, task

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate, ParquetTableSink

BASE = Path(os.environ.get("BENCH_DIR", "/tmp/checkpoint-bench/scheduler"))
SCHEMA = "user STRING, page STRING, ts LONG"
CONNECT_CONN_ID = "bench_spark_connect"


def pipeline(dag_id: str, chain: bool, spark_conn_id: str | None = None) -> CheckpointedPipeline:
    """The benchmark's pipeline as DAG ``dag_id``, writing the table ``<BENCH_DIR>/<dag_id without bench_>/table``."""
    with CheckpointedPipeline(
        dag_id=dag_id, schedule=None, retained_checkpoints=3, chain=chain, spark_conn_id=spark_conn_id
    ) as declared:
        events = FileSource(uid="events", path=str(BASE / "landing"), format="json", schema=SCHEMA)
        totals = KeyedAggregate(
            uid="user_totals",
            input=events,
            keys=["user"],
            aggs={"events": "count", "first_seen": "min(ts)", "last_seen": "max(ts)"},
        )
        ParquetTableSink(
            uid="user_totals_table",
            input=totals,
            path=str(BASE / dag_id.removeprefix("bench_") / "table"),
            mode="upsert",
            keys=["user"],
        )
    return declared


bench_ours = pipeline("bench_ours", chain=False).dag
bench_chained = pipeline("bench_chained", chain=True).dag
bench_connect = pipeline("bench_connect", chain=False, spark_conn_id=CONNECT_CONN_ID).dag
bench_connect_chained = pipeline("bench_connect_chained", chain=True, spark_conn_id=CONNECT_CONN_ID).dag


def streaming_dag(dag_id: str, remote_env: str | None) -> None:
    """DAG ``dag_id``: SS's query in an embedded session, or on the Spark Connect server at ``$remote_env``."""

    @dag(
        dag_id=dag_id,
        schedule=None,
        start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        catchup=False,
        max_active_runs=1,
    )
    def streaming() -> None:
        @task
        def streaming_query(increment: str) -> dict[str, Any]:
            """Run the query to completion on what has landed; its figures as XCom."""
            from bench.sides import Streaming

            from airflow_provider_checkpoint.spark.session import get_spark

            spark = get_spark(remote=os.environ[remote_env] if remote_env else None)
            root = BASE / dag_id.removeprefix("bench_")
            result = Streaming(spark, root, BASE / "landing", "rocksdb").run(int(increment))
            return {"seconds": result.seconds, "records_in": result.records_in, "bytes_chk": result.bytes_chk}

        streaming_query("{{ dag_run.conf['increment'] }}")

    streaming()


streaming_dag("bench_ss", None)
streaming_dag("bench_ss_connect", "BENCH_CONNECT_URL")
