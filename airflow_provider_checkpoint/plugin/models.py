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
    """A page of rows, each with ``discarded``: completed, then deleted by retention (not restorable)."""

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
    retained: list[int] = Field(description="Completed checkpoints still in storage (restorable), newest first")
    can_act: bool = Field(description="Whether the user may take savepoints and restore (create runs of the DAG)")


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


# -- Flink's checkpoint views: overview, detail, summary, configuration, in progress ------------
class Counts(BaseModel):
    completed: int
    failed: int = Field(description="Aborted checkpoints")
    in_progress: int
    restored: int = Field(description="Checkpoints that started from a restore request or savepoint")


class CheckpointRef(BaseModel):
    """A checkpoint the overview links to."""

    checkpoint_id: int
    time: float | None = Field(description="Completed: end; failed: abort; savepoint: written; restore: trigger")
    run_id: str
    path: str = Field(description="The _metadata, savepoint or restored snapshot location ('' when unknown)")
    reason: str = Field(description="The abort reason of a failed checkpoint, '' otherwise")


class LatestCheckpoints(BaseModel):
    completed: CheckpointRef | None
    failed: CheckpointRef | None
    savepoint: CheckpointRef | None
    restore: CheckpointRef | None


class Overview(BaseModel):
    counts: Counts
    latest: LatestCheckpoints


class Attempt(BaseModel):
    """One Airflow try of a step's task (TaskInstance and TaskInstanceHistory)."""

    try_number: int
    state: str | None
    start: float | None
    end: float | None
    duration: float | None


class StepDetail(BaseModel):
    """What one step did in the checkpoint (its accepted ack's metrics); unknown values are ``null``."""

    step: str
    attempts: list[Attempt]
    accepted_attempt: int | None = Field(description="The attempt whose ack the checkpoint took")
    records_in: int | None
    records_out: int | None
    state_rows: int | None
    state_bytes: int | None
    state_files: int | None
    incremental: bool | None
    inline: bool | None = Field(description="Its state travels inline in _metadata (written whole)")
    merged_on_driver: bool | None
    seconds: float | None
    input_records: dict[str, int] = Field(description="Records read per source and channel uid")
    alignment_seconds: dict[str, float] = Field(description="Multi-input steps: wait per input uid")


class SinkCommit(BaseModel):
    """What one sink committed for the checkpoint."""

    uid: str
    kind: str = Field(description="parquet, delta, postgres or dead_letters")
    step: str
    target: str = Field(description="Table path or schema.table, credentials redacted")
    rows: int | None
    files: int | None
    bytes: int | None
    delta_version: int | None
    commit_time: float | None
    dead_letters_path: str | None


class CheckpointDetail(BaseModel):
    row: CheckpointRow
    metadata_path: str | None = Field(description="Its _metadata, while retained")
    dag_run_url: str | None = Field(description="Airflow UI path of the DAG run")
    committed_by: str | None = Field(description="finalize, or trigger: the next run's trigger finished the commit")
    committed_by_run_id: str | None
    abort_message: str
    abort_detail: str = Field(description="The full text of the errors behind an abort (empty when none)")
    steps: list[StepDetail]
    sinks: list[SinkCommit]


class Distribution(BaseModel):
    """Of the completed checkpoints' figures; percentiles by nearest rank (always a value that occurred)."""

    min: float | None
    avg: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None


class Summary(BaseModel):
    """Over the completed checkpoints of the history."""

    checkpoints: int
    duration_seconds: Distribution
    state_size: Distribution
    records_in: Distribution
    bytes_written: Distribution


class Configuration(BaseModel):
    """The settings the job's last trigger ran with, the DAG's schedule and chaining, and its topology."""

    schedule: str | None
    checkpoint_timeout_seconds: float | None
    min_pause_seconds: float | None
    tolerable_failed_checkpoints: int | None
    retained_checkpoints: int | None
    storage: str = Field(description="The job's storage URL")
    checkpoint_storage: str | None = Field(description="filesystem or memory")
    inline_state_threshold: int | None
    incremental_state: bool | None
    chain: bool | None
    steps: list[str]
    sinks: list[str]
    sources: list[str]


class StepAck(BaseModel):
    step: str
    acked: bool
    ack_time: float | None
    state: str | None = Field(description="The state of the step's task")
    try_number: int | None = Field(description="Its latest try")


class InProgress(BaseModel):
    """The checkpoint in flight."""

    checkpoint_id: int
    run_id: str
    type: str
    trigger_time: float | None
    lease_holder: str | None = Field(description="The run holding the job's lease")
    lease_expires: float | None
    steps: list[StepAck]
