"""The stats record of a checkpoint (``_stats/<id>.json``): built here for every outcome, and read
back here as the history row the CLI, the Checkpoints page and the sensors show.

A record is written when a checkpoint completes (:func:`completed`, from the figures of
:func:`completion` kept in ``_metadata``) or aborts (:func:`aborted`). Stored records are
untrusted: :func:`history_row` type-checks every value it shows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.core.documents import JsonDict
from airflow_provider_checkpoint.exceptions import MAX_TIMESTAMP

if TYPE_CHECKING:
    from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan, CompletedCheckpoint
    from airflow_provider_checkpoint.core.status import AbortReason
    from airflow_provider_checkpoint.state.handles import ChannelSnapshot, OperatorSnapshot


def base(plan: CheckpointPlan) -> JsonDict:
    """What the record of a planned checkpoint shows whatever its outcome."""
    return {
        "checkpoint_id": plan.checkpoint_id,
        "run_id": plan.run_id,
        "type": plan.barrier.type.value,
        "trigger_time": plan.barrier.trigger_time,
    }


def completion(
    plan: CheckpointPlan,
    acks: Mapping[str, Ack],
    operators: Mapping[str, OperatorSnapshot],
    channels: Sequence[ChannelSnapshot],
    completion_time: float,
    restored_from: int | None,
) -> JsonDict:
    """The figures of a completed checkpoint, summed over its steps' acks (kept in its ``_metadata``)."""
    source_records: dict[str, int] = {}
    source_malformed: dict[str, int] = {}
    source_lost: dict[str, int] = {}
    for ack in acks.values():
        source_records.update(ack.metrics.get("source_records", {}))
        source_malformed.update(ack.metrics.get("source_malformed", {}))
        source_lost.update(ack.metrics.get("source_lost", {}))
    point = plan.restore_point
    requested = point is not None and "restore_request_id" in plan.options
    return {
        "run_id": plan.run_id,
        "duration_seconds": round(completion_time - plan.barrier.trigger_time, 3),
        "records_in": sum(source_records.values()),
        "malformed_records": sum(source_malformed.values()),
        "source_malformed": source_malformed,
        **({"lost_records": sum(source_lost.values()), "source_lost": source_lost} if source_lost else {}),
        "state_size": sum(s.size for s in operators.values()),
        "channel_bytes": sum(c.size for c in channels),
        "channel_rows": sum(c.rows for c in channels),
        "restored_from": restored_from,
        **({"restored_from_url": point.location_url} if point is not None and requested else {}),
        "steps": {s: a.metrics for s, a in sorted(acks.items())},
    }


def completed(checkpoint: CompletedCheckpoint, end_time: float) -> JsonDict:
    """The record of a completed checkpoint."""
    return {
        "checkpoint_id": checkpoint.checkpoint_id,
        "type": checkpoint.type.value,
        "trigger_time": checkpoint.trigger_time,
        **checkpoint.stats,
        "status": "COMPLETED",
        "end_time": end_time,
    }


def aborted(
    checkpoint_id: int, reason: AbortReason, message: str, counted: bool, end_time: float, known: JsonDict | None = None
) -> JsonDict:
    """The record of an aborted checkpoint: why, whether it counts as a failure, and what is ``known``
    of it (:func:`base`; nothing for an attempt found abandoned)."""
    return {
        "checkpoint_id": checkpoint_id,
        **(known or {}),
        "status": "ABORTED",
        "reason": reason.value,
        "message": message,
        "counted": counted,
        "end_time": end_time,
    }


# -- reading stored records back ------------------------------------------------------------
def count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def number(value: Any, maximum: float = math.inf) -> float | None:
    if type(value) in (int, float) and math.isfinite(value) and 0 <= value <= maximum:
        return float(value)
    return None


def seconds(value: Any) -> float | None:
    """A time a datetime can show (seconds since the epoch up to year 9999), else ``None``."""
    return number(value, MAX_TIMESTAMP)


def text(value: Any, limit: int = 2000) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _step_total(steps: Any, metric: str) -> int | None:
    if not isinstance(steps, dict):
        return None
    values = [count(m.get(metric)) for m in steps.values() if isinstance(m, dict)]
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _per_source(counts: Any) -> dict[str, int]:
    """``{source uid: count}`` of the valid entries of ``counts``."""
    if not isinstance(counts, dict):
        return {}
    return {text(k, 100): v for k, v in counts.items() if isinstance(k, str) and count(v) is not None}


def history_row(stats: Any) -> JsonDict | None:
    """One history row (CLI, Checkpoints page) from a stored record, untrusted: every value is
    type-checked, what is malformed is left out; ``None`` if it has no valid id."""
    if not isinstance(stats, dict) or count(stats.get("checkpoint_id")) is None:
        return None
    steps = stats.get("steps")
    files = [_step_total(steps, "state_files"), _step_total(steps, "sink_files_staged")]
    trigger, end = seconds(stats.get("trigger_time")), seconds(stats.get("end_time"))
    duration = number(stats.get("duration_seconds"))
    if duration is None and trigger is not None and end is not None and end >= trigger:
        duration = round(end - trigger, 3)
    status = text(stats.get("status"), 20)
    return {
        "checkpoint_id": stats["checkpoint_id"],
        "type": text(stats.get("type"), 20) or "checkpoint",
        "status": status if status in ("COMPLETED", "ABORTED") else "UNKNOWN",
        "reason": text(stats.get("reason"), 40),
        "message": text(stats.get("message")),
        "run_id": text(stats.get("run_id"), 250),
        "trigger_time": trigger,
        "end_time": end,
        "duration_seconds": duration,
        "records_in": count(stats.get("records_in")),
        "malformed_records": count(stats.get("malformed_records")),
        "source_malformed": _per_source(stats.get("source_malformed")),
        "state_rows": _step_total(steps, "state_rows"),
        "state_size": count(stats.get("state_size")),
        "bytes_written": _step_total(steps, "state_bytes"),
        "files": sum(f for f in files if f is not None) if any(f is not None for f in files) else None,
        "restored_from": count(stats.get("restored_from")),
        "restored_from_url": text(stats.get("restored_from_url")),
    }
