"""``chain=True``: which pipelines may chain, and what a retry of the chained task finds in storage."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate, ParquetTableSink
from airflow_provider_checkpoint.core.status import AbortReason
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError
from airflow_provider_checkpoint.operators.chained import ChainedCheckpointOperator
from airflow_provider_checkpoint.pipeline import CHAINED_TASK_ID
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from tests.unit.helpers import Env, make_ack


def counts_pipeline(tmp_path: Path, dag_id: str, chain: bool, archive: bool) -> CheckpointedPipeline:
    """Events → counts → table; with ``archive`` a second sink on the raw events (a second step)."""
    with CheckpointedPipeline(dag_id, storage=f"file://{tmp_path}/ckpt", schedule=None, chain=chain) as pipeline:
        events = FileSource(uid="events", path=str(tmp_path / "landing"), format="json", schema="k STRING")
        counts = KeyedAggregate(uid="counts", input=events, keys=["k"], aggs={"n": "count"})
        ParquetTableSink(uid="counts_table", input=counts, path=str(tmp_path / "counts"), mode="upsert", keys=["k"])
        if archive:
            ParquetTableSink(uid="archive", input=events, path=str(tmp_path / "archive"), mode="append")
    return pipeline


def test_chain_of_a_single_step_pipeline_is_one_task_with_the_sink_outlets(tmp_path: Path) -> None:
    pipeline = counts_pipeline(tmp_path, "chained_counts", chain=True, archive=False)
    (task,) = pipeline.dag.tasks
    assert isinstance(task, ChainedCheckpointOperator) and task.task_id == CHAINED_TASK_ID
    assert task.step == "step_counts_table" and task.retries == pipeline.step_retries
    assert [a.uri for a in task.outlets] == [f"file://{tmp_path}/counts"]


def test_default_stays_three_tasks(tmp_path: Path) -> None:
    pipeline = counts_pipeline(tmp_path, "counts", chain=False, archive=False)
    assert sorted(t.task_id for t in pipeline.dag.tasks) == [
        "finalize_checkpoint",
        "step_counts_table",
        "trigger_checkpoint",
    ]


def test_chain_of_a_pipeline_of_two_steps_is_refused_at_parse_time(tmp_path: Path) -> None:
    with pytest.raises(
        PipelineDefinitionError, match=r"chained_two: chain=True needs a pipeline that plans into one step"
    ):
        counts_pipeline(tmp_path, "chained_two", chain=True, archive=True)


def test_retry_of_the_same_run_aborts_its_open_checkpoint_and_cuts_a_new_barrier(env: Env) -> None:
    """A try that died without aborting (killed worker): the retry re-enters the lease, aborts, counts once."""
    first = env.coordinator.trigger("run-1")
    make_ack(env, first)  # the dead try's state and staged output
    retry = env.coordinator.trigger("run-1")
    assert retry.checkpoint_id == first.checkpoint_id + 1
    assert JobRecordStore(env.storage).lease_holder()["run_id"] == "run-1"
    assert not env.chk(first.checkpoint_id).exists(), "the dead try's files are discarded"
    assert not list(env.table.glob(f"_staging/chk-{first.checkpoint_id}/**/*.parquet")), "its staged output too"
    stats = env.stats(first.checkpoint_id)
    assert (stats["status"], stats["reason"], stats["counted"]) == ("ABORTED", AbortReason.ABANDONED.value, True)
    assert env.job_record()["failures"]["failed_ids"] == [first.checkpoint_id]
    env.coordinator.finalize(retry, [make_ack(env, retry, attempt=2)])
    assert env.job_record()["failures"]["failed_ids"] == []
