"""Request and response bodies of the Checkpoints page's JSON endpoints.

The response models spell the JSON that :mod:`airflow_provider_checkpoint.jobs.reports` and the
restore produce and the page's script reads; the row models keep keys they do not
declare (``extra="allow"``), so a field added to a row reaches the page unchanged.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SavepointRequest(BaseModel):
    savepoint_dir: str | None = Field(None, max_length=4096, description="Under an allowed root; empty: default")
    stop: bool = Field(False, description="Set the job STOPPED once the savepoint is written")


class RestoreRequest(BaseModel):
    checkpoint: str = Field(min_length=1, max_length=4096, description="'latest', an id, or a snapshot path")
    allow_non_restored_state: bool = False
    dry_run: bool = False
    trigger_pipeline: bool = Field(False, description="Trigger the pipeline right after the request")


class CheckpointRow(BaseModel):
    """One checkpoint of the history (from its ``_stats/<id>.json``); unknown values are ``null``."""

    model_config = ConfigDict(extra="allow")

    checkpoint_id: int
    type: str
    status: str = Field(description="COMPLETED, ABORTED or UNKNOWN")
    reason: str
    message: str
    run_id: str
    trigger_time: float | None
    end_time: float | None
    duration_seconds: float | None
    records_in: int | None
    state_rows: int | None
    state_size: int | None
    bytes_written: int | None
    files: int | None
    restored_from: int | None
    restored_from_url: str


class HistoryPage(BaseModel):
    total: int
    offset: int
    limit: int
    rows: list[CheckpointRow]


class LatestCompleted(BaseModel):
    checkpoint_id: int
    type: str
    completion_time: float
    url: str


class UnreadableLatest(BaseModel):
    """The latest completed checkpoint's ``_metadata`` could not be read."""

    error: str


class PendingRestore(BaseModel):
    location_url: str | None
    error: str | None


class JobStatus(BaseModel):
    """A job's status (RUNNING / FAILED / STOPPED and why), latest completed checkpoint, last restore."""

    model_config = ConfigDict(extra="allow")

    job_id: str
    dag_id: str
    storage: str
    status: str
    status_reason: str
    failed_checkpoints: list[int]
    last_checkpoint_id: int
    latest_completed: LatestCompleted | UnreadableLatest | None
    last_restore: CheckpointRow | None
    pending_restore: PendingRestore | None


class UnreadableJob(BaseModel):
    """A listed job whose storage refused to be read."""

    job_id: str
    dag_id: str
    status: str = Field(description="UNREADABLE")
    error: str


class Savepoint(BaseModel):
    checkpoint_id: int
    path: str
    time: float | None


class JobDetail(JobStatus):
    savepoints: list[Savepoint] = Field(description="Newest first")


class SavepointConf(BaseModel):
    """The trigger form's savepoint params, as the savepoint run got them."""

    savepoint: bool
    savepoint_dir: str | None
    stop_after_savepoint: bool


class SavepointTriggered(BaseModel):
    dag_id: str
    dag_run_id: str
    conf: SavepointConf


class RestoreSummary(BaseModel):
    """What the restore validated and (unless ``dry_run``) requested; ``dag_run_id`` if it triggered the pipeline."""

    job_id: str
    dag_id: str
    snapshot: str
    checkpoint_id: int
    type: str
    operators_restored: list[str]
    operators_dropped: list[str]
    operators_starting_empty: list[str]
    dry_run: bool
    dag_run_id: str | None = None
