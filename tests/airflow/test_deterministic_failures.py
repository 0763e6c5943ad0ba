"""A step that fails the same way on every try is not retried; a transient fault is (real `dag.test()`, Spark).

A ``Transform`` naming a column its input lacks is a mistake only Spark sees: the step fails once (try 1, no
retry), and the abort reason names Spark's error class, with the full text in the checkpoint's detail (the
trigger's pipeline check, which finds this typo before any step, is off here to reach the step's path). Fixed,
the same pipeline with an injected fault before the ack is retried and completes.
"""

from __future__ import annotations

import json

import pytest

from tests.airflow.conftest import own_dags_folder
from tests.airflow.test_cli_and_own_storage import cli

pytestmark = pytest.mark.airflow
JOB = "deterministic_failures"
DAG_FILE = """
import datetime
import os

from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, ParquetTableSink
from airflow_provider_checkpoint.dataflow import Transform

BASE = os.environ["DETERMINISTIC_DIR"]

with CheckpointedPipeline(
    dag_id="deterministic_failures",
    schedule=None,
    step_retries=2,
    retry_delay=datetime.timedelta(seconds=1),
    check_versions=False,  # the trigger's pipeline check would refuse the typo first (test_pipeline_check.py)
) as pipeline:
    clicks = FileSource(uid="clicks", path=f"{BASE}/landing", format="json", schema="user STRING, ts LONG")
    picked = Transform(uid="picked", input=clicks, fn=lambda df: df.select("user", os.environ["PICKED_COLUMN"]))
    ParquetTableSink(uid="picked_table", input=picked, path=f"{BASE}/picked")

dag = pipeline.dag
"""


def test_an_analysis_error_fails_once_and_a_transient_fault_is_retried(airflow_db, tmp_path, monkeypatch, capsys):
    base = tmp_path / "data"
    (base / "landing").mkdir(parents=True)
    (base / "landing" / "1.json").write_text('{"user": "a", "ts": 1}\n{"user": "b", "ts": 2}\n')
    monkeypatch.setenv("DETERMINISTIC_DIR", str(base))
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    module = own_dags_folder(tmp_path, monkeypatch, JOB, DAG_FILE)
    job_dir = tmp_path / "checkpoints" / JOB

    monkeypatch.setenv("PICKED_COLUMN", "tss")  # a typo only Spark's analysis sees
    run = module.dag.test()
    assert run.state == "failed"
    (step,) = [ti for ti in run.get_task_instances() if ti.task_id.startswith("step_")]
    assert (step.state, step.try_number) == ("failed", 1), "a deterministic failure is not retried"
    record = json.loads((job_dir / "_stats" / "1.json").read_text())
    assert record["status"] == "ABORTED" and record["reason"] == "declined"
    assert "AnalysisException [UNRESOLVED_COLUMN" in record["message"], record["message"]
    assert "`tss`" in record["message"] and "tss" in record["detail"]
    code, out, _ = cli(capsys, "show", JOB, "1", "--output", "json")
    shown = json.loads(out)
    assert code == 0 and "AnalysisException [UNRESOLVED_COLUMN" in shown["abort_message"]
    assert shown["abort_detail"].startswith(f"{step.task_id}: AnalysisException")

    monkeypatch.setenv("PICKED_COLUMN", "ts")
    monkeypatch.setenv("CHECKPOINT_FAULTS", "step.before_ack:attempt=1")  # a transient fault: retried
    run = module.dag.test()
    assert run.state == "success"
    (step,) = [ti for ti in run.get_task_instances() if ti.task_id.startswith("step_")]
    assert step.try_number == 2, "the injected fault was retried"
    import pandas as pd

    picked = pd.read_parquet(base / "picked").sort_values("user").reset_index(drop=True)
    assert picked.to_dict("records") == [{"user": "a", "ts": 1}, {"user": "b", "ts": 2}]
