"""What the CLI and the Checkpoints page show about a job: status, history, savepoints.

Everything here is read from the job's storage (``_job.json``, ``_stats/*.json``,
``_metadata``, ``_restore.json``), documents that are untrusted: every value shown is
type-checked and a malformed document becomes a row that says so, never a crash.
"""

from __future__ import annotations

import math
from typing import Any

from airflow_provider_checkpoint.exceptions import (
    MAX_TIMESTAMP,
    CheckpointStorageError,
    MetadataError,
    RefusedInputError,
)
from airflow_provider_checkpoint.jobs.registry import JobLocation
from airflow_provider_checkpoint.storage import JobStorage

JsonDict = dict[str, Any]
MAX_PAGE = 500


def _int(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _float(value: Any, maximum: float = math.inf) -> float | None:
    if type(value) in (int, float) and math.isfinite(value) and 0 <= value <= maximum:
        return float(value)
    return None


def _time(value: Any) -> float | None:
    """A time a datetime can show (seconds since the epoch up to year 9999), else ``None``."""
    return _float(value, MAX_TIMESTAMP)


def _str(value: Any, limit: int = 2000) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _step_total(steps: Any, metric: str) -> int | None:
    if not isinstance(steps, dict):
        return None
    values = [_int(m.get(metric)) for m in steps.values() if isinstance(m, dict)]
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _per_source(counts: Any) -> dict[str, int]:
    """``{source uid: count}`` of the valid entries of ``counts``."""
    if not isinstance(counts, dict):
        return {}
    return {_str(k, 100): v for k, v in counts.items() if isinstance(k, str) and _int(v) is not None}


def checkpoint_row(stats: Any) -> JsonDict | None:
    """One history row from a ``_stats/<id>.json`` document; ``None`` if it has no valid id."""
    if not isinstance(stats, dict) or _int(stats.get("checkpoint_id")) is None:
        return None
    steps = stats.get("steps")
    files = [_step_total(steps, "state_files"), _step_total(steps, "sink_files_staged")]
    trigger, end = _time(stats.get("trigger_time")), _time(stats.get("end_time"))
    duration = _float(stats.get("duration_seconds"))
    if duration is None and trigger is not None and end is not None and end >= trigger:
        duration = round(end - trigger, 3)
    status = _str(stats.get("status"), 20)
    return {
        "checkpoint_id": stats["checkpoint_id"],
        "type": _str(stats.get("type"), 20) or "checkpoint",
        "status": status if status in ("COMPLETED", "ABORTED") else "UNKNOWN",
        "reason": _str(stats.get("reason"), 40),
        "message": _str(stats.get("message")),
        "run_id": _str(stats.get("run_id"), 250),
        "trigger_time": trigger,
        "end_time": end,
        "duration_seconds": duration,
        "records_in": _int(stats.get("records_in")),
        "malformed_records": _int(stats.get("malformed_records")),
        "source_malformed": _per_source(stats.get("source_malformed")),
        "state_rows": _step_total(steps, "state_rows"),
        "state_size": _int(stats.get("state_size")),
        "bytes_written": _step_total(steps, "state_bytes"),
        "files": sum(f for f in files if f is not None) if any(f is not None for f in files) else None,
        "restored_from": _int(stats.get("restored_from")),
        "restored_from_url": _str(stats.get("restored_from_url")),
    }


def checkpoint_stats(storage: JobStorage, checkpoint_id: int) -> JsonDict | None:
    """The history row of one checkpoint, ``None`` without (valid) stats."""
    return checkpoint_row(storage.load_stats(checkpoint_id))


def history(storage: JobStorage, offset: int = 0, limit: int = 20) -> JsonDict:
    """A page of the job's checkpoint history, newest first, and the total number of rows."""
    if offset < 0 or not 1 <= limit <= MAX_PAGE:
        raise RefusedInputError(f"offset must be >= 0 and limit between 1 and {MAX_PAGE}")
    rows = [r for r in map(checkpoint_row, storage.read_stats()) if r is not None]
    rows.sort(key=lambda r: int(r["checkpoint_id"]), reverse=True)
    return {"total": len(rows), "offset": offset, "limit": limit, "rows": rows[offset : offset + limit]}


def savepoints(storage: JobStorage) -> list[JsonDict]:
    """The job's savepoints, newest first (paths as recorded when they were taken)."""
    out = []
    for sp in storage.load_job().savepoints:
        if isinstance(sp, dict) and _int(sp.get("checkpoint_id")) is not None:
            out.append(
                {"checkpoint_id": sp["checkpoint_id"], "path": _str(sp.get("path")), "time": _time(sp.get("time"))}
            )
    return sorted(out, key=lambda s: int(s["checkpoint_id"]), reverse=True)


def job_status(location: JobLocation) -> JsonDict:
    """Status of a job: RUNNING / FAILED / STOPPED and why, latest completed checkpoint, last restore."""
    storage = location.storage()
    job = storage.load_job()
    latest: JsonDict | None = None
    try:
        completed = storage.latest_completed()
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
    restores = [r for r in history(storage, limit=MAX_PAGE)["rows"] if r["restored_from_url"]]
    pending: dict[str, str | None] | None
    try:
        request = storage.load_restore_request()
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
