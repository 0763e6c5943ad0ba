"""What a person can do to a job from the CLI or the Checkpoints page, validated the same way as the DAGs.

* a savepoint run: the conf of the pipeline's trigger form, its ``savepoint_dir`` confined
  to the allowed roots exactly as the trigger task confines it;
* a restore request: what the ``restore_from_checkpoint`` DAG's first task does.

Refusals raise a :class:`~airflow_provider_checkpoint.exceptions.CheckpointError`; their message is what
the DAGs log.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_checkpoint.exceptions import UnsafePathError
from airflow_provider_checkpoint.jobs.registry import JobLocation, find_job, list_jobs
from airflow_provider_checkpoint.restore.requests import request_restore, resolve_pointer
from airflow_provider_checkpoint.storage.paths import resolve_under_roots


def job_of_dag(dag_id: str) -> JobLocation | None:
    """The checkpointed job a pipeline DAG runs, if it has run (or is under the default root)."""
    return next((job for job in list_jobs() if job.dag_id == dag_id), None)


def savepoint_conf(location: JobLocation | None, savepoint_dir: str | None, stop: bool) -> dict[str, Any]:
    """The trigger-form conf of a savepoint run; ``savepoint_dir`` is checked before anything runs."""
    if savepoint_dir:
        try:
            resolve_under_roots(savepoint_dir, location.allowed_roots() if location else _default_roots())
        except UnsafePathError as e:
            raise UnsafePathError(f"savepoint_dir refused: {e}") from e
    return {"savepoint": True, "savepoint_dir": savepoint_dir or None, "stop_after_savepoint": stop}


def _default_roots() -> list[str]:
    from airflow_provider_checkpoint.storage.config import allowed_roots

    return allowed_roots()


def restore_job(job_id: str, checkpoint: str, allow_non_restored_state: bool, dry_run: bool) -> dict[str, Any]:
    """Validate and (unless ``dry_run``) request a restore of ``job_id``, wherever it lives; a summary."""
    location = find_job(job_id)
    storage = location.storage()
    pointer = resolve_pointer(storage, checkpoint, location.allowed_roots())
    return request_restore(storage, pointer, allow_non_restored_state, dry_run)
