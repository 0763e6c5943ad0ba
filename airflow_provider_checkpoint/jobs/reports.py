"""What the CLI and the Checkpoints page show about a job: status, history, savepoints (the overview,
summary, configuration, in-progress checkpoint and a checkpoint's detail are in the modules beside
this one, wired to storage and Airflow's database by :mod:`.views`).

Everything here is read from the job's storage (``_job.json``, ``_stats/*.json``,
``_metadata``, ``_restore.json``), documents that are untrusted: every value shown is
type-checked and a malformed document becomes a row that says so, never a crash.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_checkpoint.core import stats
from airflow_provider_checkpoint.exceptions import (
    CheckpointStorageError,
    MetadataError,
    RefusedInputError,
)
from airflow_provider_checkpoint.jobs.checkpoint_detail import is_restore
from airflow_provider_checkpoint.jobs.registry import JobLocation
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.stats import StatsStore

JsonDict = dict[str, Any]
MAX_PAGE = 500


def checkpoint_stats(storage: JobStorage, checkpoint_id: int) -> JsonDict | None:
    """The history row of one checkpoint, ``None`` without (valid) stats."""
    return stats.history_row(StatsStore(storage).load(checkpoint_id))


def all_rows(storage: JobStorage) -> list[JsonDict]:
    """Every history row of the job (one per valid stats record), newest first."""
    rows = [r for r in map(stats.history_row, StatsStore(storage).read_all()) if r is not None]
    return sorted(rows, key=lambda r: int(r["checkpoint_id"]), reverse=True)


HISTORY_SORTS = {"id": "checkpoint_id", "time": "trigger_time", "duration": "duration_seconds"}
HISTORY_STATUSES = ("COMPLETED", "ABORTED", "UNKNOWN")
HISTORY_KINDS = ("checkpoint", "savepoint", "restore")


def _kind_of(row: JsonDict) -> str:
    """``restore`` when the checkpoint started from a restore, else its type (checkpoint or savepoint)."""
    return "restore" if is_restore(row) else str(row["type"])


def history(
    storage: JobStorage,
    offset: int = 0,
    limit: int = 20,
    *,
    status: str | None = None,
    kind: str | None = None,
    sort: str = "id",
    descending: bool = True,
) -> JsonDict:
    """A page of the job's checkpoint history and the number of rows that match; a completed checkpoint
    retention deleted is marked ``discarded``.

    ``status`` (COMPLETED, ABORTED, UNKNOWN) and ``kind`` (checkpoint, savepoint, restore) keep the
    matching rows; ``sort`` orders them by ``id``, trigger ``time`` or ``duration`` (newest / longest
    first when ``descending``), unknown values last either way, ties by id newest first.
    """
    if offset < 0 or not 1 <= limit <= MAX_PAGE:
        raise RefusedInputError(f"offset must be >= 0 and limit between 1 and {MAX_PAGE}")
    for name, value, allowed in (
        ("status", status, HISTORY_STATUSES),
        ("kind", kind, HISTORY_KINDS),
        ("sort", sort, tuple(HISTORY_SORTS)),
    ):
        if value is not None and value not in allowed:
            raise RefusedInputError(f"history {name} must be one of {', '.join(allowed)}, not {value!r}")
    rows = [
        r
        for r in all_rows(storage)
        if (status is None or r["status"] == status) and (kind is None or _kind_of(r) == kind)
    ]
    key = HISTORY_SORTS[sort]
    known = [r for r in rows if r[key] is not None]  # all_rows: newest first, so ties stay newest first
    known.sort(key=lambda r: r[key], reverse=descending)
    rows = known + [r for r in rows if r[key] is None]
    page = rows[offset : offset + limit]
    retained = set(CompletedCheckpointStore(storage).completed_ids()) if page else set()
    for r in page:  # Flink's "discarded": completed, then deleted by retention (not restorable any more)
        r["discarded"] = r["status"] == "COMPLETED" and r["checkpoint_id"] not in retained
    return {"total": len(rows), "offset": offset, "limit": limit, "rows": page}


def savepoints(storage: JobStorage) -> list[JsonDict]:
    """The job's savepoints, newest first (paths as recorded when they were taken)."""
    out = []
    for sp in JobRecordStore(storage).load().savepoints:
        if isinstance(sp, dict) and stats.count(sp.get("checkpoint_id")) is not None:
            out.append(
                {
                    "checkpoint_id": sp["checkpoint_id"],
                    "path": stats.text(sp.get("path")),
                    "time": stats.seconds(sp.get("time")),
                }
            )
    return sorted(out, key=lambda s: int(s["checkpoint_id"]), reverse=True)


def job_status(location: JobLocation) -> JsonDict:
    """Status of a job: RUNNING / FAILED / STOPPED and why, latest completed checkpoint, last restore."""
    storage = location.storage()
    job = JobRecordStore(storage).load()
    latest: JsonDict | None = None
    try:
        completed = CompletedCheckpointStore(storage).latest_completed()
    except (MetadataError, CheckpointStorageError) as e:
        latest = {"error": str(e)}
    else:
        if completed is not None:
            latest = {
                "checkpoint_id": completed.checkpoint_id,
                "type": completed.type.value,
                "completion_time": completed.completion_time,
                "url": storage.url(storage.chk_dir(completed.checkpoint_id)),
            }
    restores = [r for r in all_rows(storage) if is_restore(r)]
    pending: dict[str, str | None] | None
    try:
        request = JobRecordStore(storage).load_restore_request()
        pending = {"location_url": request.location_url, "error": None} if request else None
    except CheckpointStorageError as e:
        pending = {"location_url": None, "error": str(e)}
    return {
        "job_id": location.job_id,
        "dag_id": location.dag_id,
        "storage": storage.url(),
        "status": job.status.value,
        "status_reason": job.status_reason,
        "failed_checkpoints": list(job.failures.failed_ids),
        "last_checkpoint_id": job.last_checkpoint_id,
        "latest_completed": latest,
        "last_restore": restores[0] if restores else None,
        "pending_restore": pending,
    }


def human_duration(seconds: float | None) -> str:
    """``850ms``, ``12.3s``, ``4m 05s``, ``2h 01m``, ``3d 04h`` (``-`` when unknown)."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def human_bytes(size: int | None) -> str:
    """``512 B``, ``1.5 KiB``, ``3.2 MiB`` … (``-`` when unknown)."""
    if size is None:
        return "-"
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, unit = float(size), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{size} B" if unit == 0 else f"{value:.1f} {units[unit]}"
