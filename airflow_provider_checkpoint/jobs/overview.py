"""Flink's checkpoint Overview and Summary of a job: counts, the latest completed, failed, savepoint
and restore, and min / average / percentiles / max over the completed checkpoints of the history.

Pure functions of the history rows (:func:`airflow_provider_checkpoint.core.stats.history_row`,
already type-checked) and the job record's savepoints (:func:`.reports.savepoints`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_provider_checkpoint.core.documents import JsonDict
from airflow_provider_checkpoint.jobs.checkpoint_detail import is_restore

Row = Mapping[str, Any]
SUMMARY_FIGURES = ("duration_seconds", "state_size", "records_in", "bytes_written")


def _ref(row: Row, time: float | None, path: str, reason: str = "") -> JsonDict:
    return {
        "checkpoint_id": row["checkpoint_id"],
        "time": time,
        "run_id": row["run_id"],
        "path": path,
        "reason": reason,
    }


def _newest(rows: Sequence[Row], keep: Callable[[Row], bool]) -> Row | None:
    return max((r for r in rows if keep(r)), key=lambda r: int(r["checkpoint_id"]), default=None)


def overview(
    rows: Sequence[Row],
    savepoints: Sequence[Row],
    in_progress: bool,
    metadata_url: Callable[[int], str],
) -> JsonDict:
    """Counts of completed, failed (aborted), in-progress and restored checkpoints, and the latest of each kind.

    ``metadata_url`` gives the ``_metadata`` location of a checkpoint id; a savepoint's path is where it
    was written, a restore's the snapshot it restored (empty when the record does not say).
    """
    completed = _newest(rows, lambda r: r["status"] == "COMPLETED")
    failed = _newest(rows, lambda r: r["status"] == "ABORTED")
    restore = _newest(rows, is_restore)
    by_id = {r["checkpoint_id"]: r for r in rows}
    savepoint = max(savepoints, key=lambda s: int(s["checkpoint_id"]), default=None)
    savepoint_row = None
    if savepoint is not None:
        known = by_id.get(savepoint["checkpoint_id"], {"checkpoint_id": savepoint["checkpoint_id"], "run_id": ""})
        savepoint_row = _ref(known, savepoint["time"], savepoint["path"])
    return {
        "counts": {
            "completed": sum(r["status"] == "COMPLETED" for r in rows),
            "failed": sum(r["status"] == "ABORTED" for r in rows),
            "in_progress": int(in_progress),
            "restored": sum(is_restore(r) for r in rows),
        },
        "latest": {
            "completed": completed
            and _ref(completed, completed["end_time"], metadata_url(int(completed["checkpoint_id"]))),
            "failed": failed and _ref(failed, failed["end_time"], "", failed["reason"]),
            "savepoint": savepoint_row,
            "restore": restore and _ref(restore, restore["trigger_time"], restore["restored_from_url"]),
        },
    }


PERCENTILES = (50, 90, 99)


def percentile(ordered: Sequence[float], p: int) -> float:
    """The nearest-rank ``p``-th percentile of ``ordered`` (ascending, not empty): the smallest value with
    at least ``p`` % of the values at or below it, so always one of the values."""
    return ordered[max(1, math.ceil(p * len(ordered) / 100)) - 1]


def distribution(figures: Sequence[float | int | None]) -> JsonDict:
    """Min, average, p50, p90, p99 and max of the known figures (all ``None`` when none is known)."""
    known = sorted(float(f) for f in figures if f is not None)
    if not known:
        return {"min": None, "avg": None, **{f"p{p}": None for p in PERCENTILES}, "max": None}
    spread = {f"p{p}": percentile(known, p) for p in PERCENTILES}
    return {"min": known[0], "avg": sum(known) / len(known), **spread, "max": known[-1]}


def summary(rows: Sequence[Row]) -> JsonDict:
    """Min / average / p50 / p90 / p99 / max of duration, state size, records in and bytes written over the
    completed rows (an aborted checkpoint's figures are partial: left out)."""
    completed = [r for r in rows if r["status"] == "COMPLETED"]
    return {
        "checkpoints": len(completed),
        **{figure: distribution([r.get(figure) for r in completed]) for figure in SUMMARY_FIGURES},
    }
