"""The tasks-nojvm mode's jobs: two small upsert jobs whose steps read and merge on the driver.

``bench_files_<side>``: Parquet files landed under ``<root>/<side>/landing`` → ``DeltaTableSink`` upsert by
``user``; ``bench_cdc_<side>``: ``PostgresCdcSource`` of table ``nojvm_rows`` (connection ``bench_nojvm_pg``,
its own slot) → ``DeltaTableSink`` upsert by ``id`` (deletes by ``deleted``). Three tasks a run each (trigger,
step, finalize). ``<side>``: ``lazy`` (``dags_nojvm/bench_nojvm_dags.py``) or ``eager``
(``dags_nojvm/bench_nojvm_eager_dags.py``: the same jobs, whose step tasks start their JVM before the step,
``CHECKPOINT_STEP_SPARK=eager``, as every step did before). ``<root>``: ``BENCH_NOJVM_ROOT``.
"""

from __future__ import annotations

import os

from airflow_provider_checkpoint import CheckpointedPipeline, DeltaTableSink, FileSource, PostgresCdcSource

ROOT = os.environ.get("BENCH_NOJVM_ROOT", "/tmp/checkpoint-bench/nojvm")
CONN_ID = "bench_nojvm_pg"
TABLE = "nojvm_rows"


def declare(side: str) -> dict[str, object]:
    """The two DAGs of ``side``, by DAG id."""
    with CheckpointedPipeline(
        dag_id=f"bench_files_{side}", schedule=None, retained_checkpoints=3, storage=f"{ROOT}/{side}/checkpoints"
    ) as files:
        rows = FileSource("rows", f"{ROOT}/{side}/landing", "parquet", "user LONG, total LONG, label STRING")
        DeltaTableSink(uid="upsert", input=rows, path=f"{ROOT}/{side}/files_table", mode="upsert", keys=["user"])
    with CheckpointedPipeline(
        dag_id=f"bench_cdc_{side}", schedule=None, retained_checkpoints=3, storage=f"{ROOT}/{side}/checkpoints"
    ) as cdc:
        changes = PostgresCdcSource("changes", [TABLE], postgres_conn_id=CONN_ID)
        DeltaTableSink("lake", changes, f"{ROOT}/{side}/cdc_table", "upsert", ["id"], delete_when="deleted")
    return {files.dag.dag_id: files.dag, cdc.dag.dag_id: cdc.dag}
