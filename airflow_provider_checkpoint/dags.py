"""DAGs the provider ships as factories: a file in the DAGs folder exposes one with a line.

The restore DAG (Flink's ``run -s``) rolls a checkpointed job back to a retained checkpoint
or a savepoint. Put this file in the DAGs folder of every scheduler and DAG processor::

    from airflow_provider_checkpoint.dags import restore_from_checkpoint_dag

    dag = restore_from_checkpoint_dag()
"""

from __future__ import annotations

import datetime
import logging
import threading
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, DagRunState, Param, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

RESTORE_DAG_ID = "restore_from_checkpoint"
JOB_LIST_TIMEOUT = 5.0
"""Seconds the DAG file waits for the job list it offers as suggestions; parsing never waits longer."""
log = logging.getLogger(__name__)

RESTORE_DOC = """Restore a checkpointed job from a checkpoint or savepoint (Flink's ``run -s``).

Trigger it with:

* ``job_id`` (required) — the job to restore (the pipeline's ``job_id``, by default its dag_id);
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


def known_job_ids(timeout: float = JOB_LIST_TIMEOUT) -> list[str]:
    """The job ids of the job registry, as suggestions for the trigger form: empty when the storage
    cannot be listed within ``timeout`` seconds or fails (the DAG still parses; any job id can be typed)."""
    found: list[str] = []

    def list_them() -> None:
        from airflow_provider_checkpoint.jobs.registry import list_jobs

        try:
            found.extend(job.job_id for job in list_jobs())
        except Exception as e:  # unreachable or unreadable storage: no suggestions, never a parse error
            log.warning("restore DAG: no job suggestions, the job registry could not be listed: %s", e)

    lister = threading.Thread(target=list_them, name="list-checkpointed-jobs", daemon=True)
    lister.start()
    lister.join(timeout)
    if lister.is_alive():
        log.warning("restore DAG: no job suggestions, listing the job registry took over %.0f s", timeout)
        return []
    return found


def restore_from_checkpoint_dag(dag_id: str = RESTORE_DAG_ID, **dag_kwargs: Any) -> DAG:
    """The restore DAG: ``request_restore`` validates the snapshot and writes the restore request,
    then (``trigger_pipeline``) the pipeline is triggered and waited for. ``dag_kwargs`` go to
    :class:`~airflow.sdk.DAG` (e.g. ``tags``, ``access_control``) over the defaults below."""
    # the known jobs are proposals in the trigger form (JSON schema ``examples``); any job id may be typed
    suggestions: dict[str, Any] = {"examples": jobs} if (jobs := known_job_ids()) else {}
    options: dict[str, Any] = {
        "schedule": None,
        "start_date": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        "catchup": False,
        "max_active_runs": 1,
        "tags": ["checkpoint"],
        "doc_md": RESTORE_DOC,
        **dag_kwargs,
    }
    options["params"] = {
        "job_id": Param(  # required: no default
            type="string",
            pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,249}$",
            title="Job id",
            description="The checkpointed job to restore (a pipeline's job_id, by default its dag_id).",
            **suggestions,
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
        **options.get("params", {}),
    }
    with DAG(dag_id=dag_id, **options) as dag:
        summary = _request_restore()
        gate = _should_trigger(summary)  # type: ignore[arg-type]  # an XComArg, resolved when the task runs
        gate >> TriggerDagRunOperator(
            task_id="trigger_pipeline",
            trigger_dag_id="{{ ti.xcom_pull(task_ids='request_restore')['dag_id'] }}",
            wait_for_completion=True,
            poke_interval=5,
            allowed_states=[DagRunState.SUCCESS],
            failed_states=[DagRunState.FAILED],
        )
    return dag


@task(task_id="request_restore")
def _request_restore() -> dict[str, Any]:
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
        summary = request_restore(storage, pointer, bool(params["allow_non_restored_state"]), bool(params["dry_run"]))
    except (UnsafePathError, RestoreError, CheckpointStorageError, DocumentError) as e:
        raise AirflowFailException(f"restore refused: {e}") from e
    summary["trigger_pipeline"] = bool(params["trigger_pipeline"]) and not params["dry_run"]
    return summary


@task.short_circuit(task_id="should_trigger")
def _should_trigger(summary: dict[str, Any]) -> bool:
    return bool(summary["trigger_pipeline"])
