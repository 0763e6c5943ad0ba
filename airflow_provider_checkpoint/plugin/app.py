"""JSON endpoints of the Checkpoints page, and the page itself (static HTML, JS and CSS).

Every endpoint uses Airflow's auth dependencies: without a valid token (bearer header or
the UI's ``_token`` cookie) it answers 401; reading a job needs read access to its DAG,
taking a savepoint or requesting a restore needs the right to create runs of it (403
otherwise). Write actions validate exactly as the trigger form and the restore DAG do
(same functions, same messages); a refusal answers 400 and changes nothing. Every string
an endpoint answers (a refusal's detail, a job's status) has URL credentials redacted
(:func:`~airflow_provider_checkpoint.exceptions.redact`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Path, Query
from fastapi.staticfiles import StaticFiles

from airflow_provider_checkpoint.exceptions import CheckpointError, redact, redact_values
from airflow_provider_checkpoint.jobs import reports, views
from airflow_provider_checkpoint.jobs.actions import job_of_dag, restore_job, savepoint_conf
from airflow_provider_checkpoint.jobs.registry import JobLocation, list_jobs
from airflow_provider_checkpoint.jobs.runs import dag_paused
from airflow_provider_checkpoint.plugin.models import (
    CheckpointDetail,
    Configuration,
    HistoryPage,
    InProgress,
    JobDetail,
    JobStatus,
    Overview,
    RestoreRequest,
    RestoreSummary,
    SavepointRequest,
    SavepointTriggered,
    Summary,
    UnreadableJob,
)
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore

STATIC = FilePath(__file__).parent / "static"


def _job(dag_id: str) -> JobLocation:
    job = job_of_dag(dag_id)
    if job is None:
        paused = " Its DAG is paused: unpause it in Airflow to let it run." if dag_paused(dag_id) else ""
        raise HTTPException(
            404, f"DAG {dag_id} has no checkpointed job yet (it has never triggered a checkpoint).{paused}"
        )
    return job


def _refused(e: Exception, prefix: str = "") -> HTTPException:
    return HTTPException(400, redact(f"{prefix}{e}"))


def _report(build: Callable[..., Any], *args: Any) -> Any:
    """What ``build`` reports, every string redacted; an unreadable job answers 400 naming the document."""
    try:
        return redact_values(build(*args))
    except CheckpointError as e:
        raise _refused(e) from e


def _may_create_runs(dag_id: str, user: Any) -> bool:
    """Whether ``user`` may create runs of ``dag_id`` (take a savepoint, restore), as the write routes check."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.models.dag import DagModel

    details = DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id))
    return bool(
        get_auth_manager().is_authorized_dag(
            method="POST", access_entity=DagAccessEntity.RUN, details=details, user=user
        )
    )


def _trigger(dag_id: str, conf: dict[str, Any], user: Any) -> str:
    """A manual run of ``dag_id`` by ``user``, as the REST API creates it."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    run = trigger_dag(
        dag_id,
        triggered_by=DagRunTriggeredByType.REST_API,
        triggering_user_name=user.get_name(),
        conf=conf,
    )
    if run is None:
        raise HTTPException(409, f"no run of {dag_id} was created")
    return str(run.run_id)


def create_app() -> FastAPI:
    """The plugin's app (route annotations resolve against this module's globals)."""
    app = FastAPI(title="Checkpoints", description="Checkpoint status, history and actions of checkpointed jobs")
    read = [Depends(requires_access_dag("GET"))]
    create_run = [Depends(requires_access_dag("POST", DagAccessEntity.RUN))]

    @app.get("/api/jobs")
    def jobs(user: GetUserDep) -> list[JobStatus | UnreadableJob]:
        """Every job whose DAG the user may read, with its status."""
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.models.dag import DagModel

        manager = get_auth_manager()
        out: list[JobStatus | UnreadableJob] = []
        for job in list_jobs():
            details = DagDetails(id=job.dag_id, team_name=DagModel.get_team_name(job.dag_id))
            if manager.is_authorized_dag(method="GET", details=details, user=user):
                try:
                    out.append(JobStatus.model_validate(redact_values(reports.job_status(job))))
                except CheckpointError as e:
                    error = redact(str(e))
                    out.append(UnreadableJob(job_id=job.job_id, dag_id=job.dag_id, status="UNREADABLE", error=error))
        return out

    @app.get("/api/dags/{dag_id}/status", dependencies=read)
    def job_status(dag_id: str, user: GetUserDep) -> JobDetail:
        """The job's status, its savepoints, its retained checkpoints and whether ``user`` may act on it."""
        job = _job(dag_id)
        try:
            storage = job.storage()
            found = {
                **reports.job_status(job),
                "savepoints": reports.savepoints(storage),
                "retained": sorted(CompletedCheckpointStore(storage).completed_ids(), reverse=True),
                "can_act": _may_create_runs(dag_id, user),
            }
            return JobDetail.model_validate(redact_values(found))
        except CheckpointError as e:
            raise _refused(e) from e

    @app.get("/api/dags/{dag_id}/history", dependencies=read)
    def history(
        dag_id: str,
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=reports.MAX_PAGE)] = 20,
        status: Annotated[str | None, Query(max_length=20)] = None,
        kind: Annotated[str | None, Query(max_length=20)] = None,
        sort: Annotated[str, Query(max_length=20)] = "id",
        order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    ) -> HistoryPage:
        """A page of the history, filtered by status and kind, sorted by id, trigger time or duration (400
        naming the allowed values otherwise)."""
        try:
            found = reports.history(
                _job(dag_id).storage(), offset, limit, status=status, kind=kind, sort=sort, descending=order == "desc"
            )
            return HistoryPage.model_validate(redact_values(found))
        except CheckpointError as e:
            raise _refused(e) from e

    @app.get("/api/dags/{dag_id}/overview", dependencies=read)
    def overview(dag_id: str) -> Overview:
        """Counts of completed, failed, in-progress and restored checkpoints; the latest of each kind."""
        return Overview.model_validate(_report(views.overview_of, _job(dag_id)))

    @app.get("/api/dags/{dag_id}/checkpoints/{checkpoint_id}", dependencies=read)
    def checkpoint(dag_id: str, checkpoint_id: Annotated[int, Path(ge=1, le=2**63 - 1)]) -> CheckpointDetail:
        """One checkpoint: per step its attempts and figures, per sink what it committed."""
        job = _job(dag_id)
        detail = _report(views.detail_of, job, checkpoint_id)
        if detail is None:
            raise HTTPException(404, f"job {job.job_id} has no checkpoint {checkpoint_id}")
        return CheckpointDetail.model_validate(detail)

    @app.get("/api/dags/{dag_id}/summary", dependencies=read)
    def summary(dag_id: str) -> Summary:
        """Min / average / p50 / p90 / p99 / max over the completed checkpoints of the history."""
        return Summary.model_validate(_report(views.summary_of, _job(dag_id)))

    @app.get("/api/dags/{dag_id}/configuration", dependencies=read)
    def configuration(dag_id: str) -> Configuration:
        return Configuration.model_validate(_report(views.configuration_of, _job(dag_id)))

    @app.get("/api/dags/{dag_id}/in-progress", dependencies=read)
    def in_progress(dag_id: str) -> InProgress | None:
        """The checkpoint in flight with its acks per step and the lease holder; ``null`` when none is."""
        found = _report(views.in_progress_of, _job(dag_id))
        return None if found is None else InProgress.model_validate(found)

    @app.post("/api/dags/{dag_id}/savepoint", dependencies=create_run)
    def savepoint(dag_id: str, body: SavepointRequest, user: GetUserDep) -> SavepointTriggered:
        """Trigger a savepoint run (the trigger form's conf), optionally stopping the job after it."""
        try:
            conf = savepoint_conf(_job(dag_id), body.savepoint_dir, body.stop)
        except CheckpointError as e:
            raise _refused(e) from e
        return SavepointTriggered.model_validate(
            {"dag_id": dag_id, "dag_run_id": _trigger(dag_id, conf, user), "conf": conf}
        )

    @app.post("/api/dags/{dag_id}/restore", dependencies=create_run, response_model_exclude_unset=True)
    def restore(dag_id: str, body: RestoreRequest, user: GetUserDep) -> RestoreSummary:
        """What the restore DAG's first task does; then, if asked, trigger the pipeline."""
        job = _job(dag_id)
        try:
            summary = restore_job(job.job_id, body.checkpoint, body.allow_non_restored_state, body.dry_run)
        except CheckpointError as e:
            raise _refused(e, "restore refused: ") from e
        if body.trigger_pipeline and not body.dry_run:
            summary["dag_run_id"] = _trigger(dag_id, {}, user)
        return RestoreSummary.model_validate(redact_values(summary))

    app.mount("/ui", StaticFiles(directory=STATIC, html=True), name="ui")
    return app
