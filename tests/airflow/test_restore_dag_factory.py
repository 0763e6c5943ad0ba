"""The restore DAG the provider ships: a required job id proposing the registry's jobs; a DAG file that always parses.

Running it (restore requests, refusals, the pipeline it triggers) is tested with the pipelines in
test_savepoint_restore.py and its neighbours, and from an installed wheel in tests/live/test_installed_wheel.py.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from airflow.sdk.definitions.param import ParamValidationError

from airflow_provider_checkpoint import dags
from airflow_provider_checkpoint.jobs import registry


def test_job_id_is_required_and_proposes_the_registered_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}")
    (tmp_path / "_registry").mkdir()
    for job in ("orders", "clicks"):
        (tmp_path / "_registry" / f"{job}.json").write_text(json.dumps({"version": 1, "job_id": job, "dag_id": job}))

    dag = dags.restore_from_checkpoint_dag()
    assert dag.dag_id == "restore_from_checkpoint"
    assert [t.task_id for t in dag.topological_sort()] == ["request_restore", "should_trigger", "trigger_pipeline"]
    job_id = dag.params.get_param("job_id")
    assert not job_id.has_value, "no default job: a run must name one"
    assert job_id.schema["examples"] == ["clicks", "orders"]
    with pytest.raises(ParamValidationError, match="No value passed"):
        dag.params.validate()
    assert job_id.resolve("orders") == "orders" and job_id.resolve("not/listed", suppress_exception=True) is None
    assert dag.params.get_param("checkpoint").value == "latest"

    custom = dags.restore_from_checkpoint_dag("restore_jobs", tags=["ops"], max_active_runs=2)
    assert (custom.dag_id, set(custom.tags), custom.max_active_runs) == ("restore_jobs", {"ops"}, 2)


def test_no_proposals_when_the_registry_cannot_be_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}")
    release = threading.Event()
    monkeypatch.setattr(registry, "list_jobs", lambda: release.wait(30) and [])  # storage that does not answer
    try:
        assert dags.known_job_ids(timeout=0.1) == []
    finally:
        release.set()

    def refused() -> list[registry.JobLocation]:
        raise OSError("connection refused")

    monkeypatch.setattr(registry, "list_jobs", refused)
    dag = dags.restore_from_checkpoint_dag()
    assert "examples" not in dag.params.get_param("job_id").schema and not dag.params.get_param("job_id").has_value
