"""Subsumed pending checkpoints, and every trigger checking the restore point against the pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
from airflow_provider_checkpoint.connectors.files.source import FileSource
from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.exceptions import RestoreError
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from tests.unit.helpers import T0, make_env, run_checkpoint


def test_an_older_pending_checkpoint_is_subsumed_not_counted(tmp_path: Path) -> None:
    env = make_env(tmp_path, tolerable=0)
    run_checkpoint(env, "run-1", T0)
    run_checkpoint(env, "run-2", T0 + 10)
    # a pending checkpoint older than the latest completed one (e.g. from another deployment)
    stale = env.job_dir / "chk-1"
    (stale / "_metadata").unlink()
    (stale / "_plan.json").write_text("{}")
    plan = env.coordinator.trigger("run-3", now=T0 + 20)
    assert plan.checkpoint_id == 3 and not stale.exists()
    stats = json.loads((env.job_dir / "_stats" / "1.json").read_text())
    assert (stats["status"], stats["reason"], stats["counted"]) == ("ABORTED", "subsumed", False)
    assert json.loads((env.job_dir / "_job.json").read_text())["status"] == "RUNNING"


def test_every_trigger_refuses_state_of_an_operator_the_pipeline_lost(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    run_checkpoint(env, "run-1", T0)
    source = FileSource("events", str(env.landing), "json", "k INT")
    sink = ParquetTableSink("table", source, str(env.table), mode="append")
    without_counts = CheckpointCoordinator(env.storage, PipelineGraph([source, sink]), CheckpointSettings())
    before = sorted(p.name for p in env.job_dir.iterdir())
    with pytest.raises(RestoreError, match="operator 'counts'.*allow_non_restored_state"):
        without_counts.trigger("run-2", now=T0 + 10)
    assert sorted(p.name for p in env.job_dir.iterdir()) == before, "nothing new is written"
    assert JobRecordStore(env.storage).lease_holder() is None, "the lease is released"
    recorded = json.loads((env.job_dir / "_job.json").read_text())["topology"]["nodes"]
    assert "counts" not in recorded, "the deployed topology is recorded for the restore DAG to validate against"
