"""Restore a checkpointed job from a checkpoint or savepoint (Flink's ``run -s``).

Trigger it from the Airflow UI with:

* ``job_id`` — the job to restore (the pipeline's ``job_id``, by default its dag_id);
* ``checkpoint`` — ``latest``, a checkpoint id, or the path of a checkpoint or savepoint
  directory (or its ``_metadata``) under ``[checkpoint] savepoint_roots`` or the storage root;
* ``allow_non_restored_state`` — drop state of operators the pipeline no longer has;
* ``dry_run`` — validate only, write nothing;
* ``trigger_pipeline`` — trigger the pipeline right away and wait for its checkpoint.

It validates the snapshot (format and version, every file's presence and checksum, the
job, the operator uids and keys) and writes a restore request that the pipeline's next
checkpoint takes: that checkpoint restores the state and source positions of the
snapshot, continues the id counter and records ``restored_from``. A FAILED or STOPPED
job is set RUNNING again.
"""

from __future__ import annotations

import datetime
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, DagRunState, Param, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

with DAG(
    dag_id="restore_from_checkpoint",
    schedule=None,
    start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    catchup=False,
    max_active_runs=1,
    tags=["checkpoint"],
    doc_md=__doc__,
    params={
        "job_id": Param(
            "example_clickstream",
            type="string",
            pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,249}$",
            title="Job id",
            description="The checkpointed job to restore (a pipeline's job_id, by default its dag_id).",
        ),
        "checkpoint": Param(
            "latest",
            type="string",
            minLength=1,
            title="Checkpoint or savepoint",
            description="'latest', a checkpoint id, or the path of a checkpoint or savepoint directory "
            "(or its _metadata) under an allowed root.",
        ),
        "allow_non_restored_state": Param(
            False,
            type="boolean",
            title="Allow non-restored state",
            description="Drop state of operators the pipeline no longer has instead of refusing the restore.",
        ),
        "dry_run": Param(False, type="boolean", title="Dry run", description="Validate only; write nothing."),
        "trigger_pipeline": Param(
            True,
            type="boolean",
            title="Trigger the pipeline",
            description="Trigger the pipeline after the restore request and wait for its checkpoint.",
        ),
    },
) as dag:

    @task
    def request_restore() -> dict[str, Any]:
        from airflow_provider_checkpoint.exceptions import (
            CheckpointStorageError,
            DocumentError,
            RestoreError,
            UnsafePathError,
        )
        from airflow_provider_checkpoint.jobs.registry import find_job
        from airflow_provider_checkpoint.restore.requests import request_restore, resolve_pointer

        params = get_current_context()["params"]
        try:
            job = find_job(params["job_id"])  # under its own storage root if the pipeline sets one
            storage = job.storage()
            pointer = resolve_pointer(storage, params["checkpoint"], job.allowed_roots())
            summary = request_restore(
                storage, pointer, bool(params["allow_non_restored_state"]), bool(params["dry_run"])
            )
        except (UnsafePathError, RestoreError, CheckpointStorageError, DocumentError) as e:
            raise AirflowFailException(f"restore refused: {e}") from e
        summary["trigger_pipeline"] = bool(params["trigger_pipeline"]) and not params["dry_run"]
        return summary

    @task.short_circuit
    def should_trigger(summary: dict[str, Any]) -> bool:
        return bool(summary["trigger_pipeline"])

    summary = request_restore()
    gate = should_trigger(summary)
    gate >> TriggerDagRunOperator(
        task_id="trigger_pipeline",
        trigger_dag_id="{{ ti.xcom_pull(task_ids='request_restore')['dag_id'] }}",
        wait_for_completion=True,
        poke_interval=5,
        allowed_states=[DagRunState.SUCCESS],
        failed_states=[DagRunState.FAILED],
    )
