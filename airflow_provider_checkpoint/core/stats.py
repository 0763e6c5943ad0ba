"""The stats record of a checkpoint (``_stats/<id>.json``): built here for every outcome, and read
back here as the history row the CLI, the Checkpoints page and the sensors show.

A record is written when a checkpoint completes (:func:`completed`, from the figures of
:func:`completion` kept in ``_metadata`` and what the sinks' targets recorded about their
commits, :class:`Committed`) or aborts (:func:`aborted`). Stored records are untrusted:
:func:`history_row` (a history row), :func:`step_details` and :func:`sink_details` (the
drill-down of one checkpoint) type-check every value they show; a malformed value reads as ``None``.

A completed record holds, besides the totals: ``restored`` (true only when the checkpoint
started from a restore request's snapshot), ``sinks`` (per sink entry uid: ``kind``,
``step``, ``target``, ``rows``, ``files``, ``bytes``, ``delta_version``, ``commit_time``),
``sink_bytes``, ``committed_by`` (``finalize``, or ``trigger`` when the next run's trigger
finished the commit) with ``committed_by_run_id``, and per step its ack's metrics plus
``attempt``, ``records_out``, ``input_records`` and, for a step with state,
``state_incremental`` and ``state_merged_on_driver``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_checkpoint.core.documents import JsonDict
from airflow_provider_checkpoint.exceptions import MAX_TIMESTAMP

if TYPE_CHECKING:
    from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan, CompletedCheckpoint
    from airflow_provider_checkpoint.core.status import AbortReason
    from airflow_provider_checkpoint.state.handles import ChannelSnapshot, OperatorSnapshot

SINK_KINDS = ("parquet", "delta", "postgres", "kafka", "dead_letters")
COMMITTERS = ("finalize", "trigger")


class Committed(NamedTuple):
    """Who finished the commit of a completed checkpoint, and what the sinks' targets recorded about it."""

    by: str
    """``finalize``, or ``trigger``: the next run's trigger finished a commit its finalize did not."""
    run_id: str
    """The run whose task finished the commit."""
    sinks: Mapping[str, JsonDict]
    """Per sink entry uid: ``delta_version`` and ``commit_time`` (see ``Sink.commit_record``)."""


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
    """The figures of a completed checkpoint, summed over its steps' acks (kept in its ``_metadata``).

    ``restored`` is true only for a checkpoint planned from a restore request (a savepoint or
    retained checkpoint the restore DAG named); ``restored_from`` is the checkpoint it started
    from either way. ``sinks`` holds what each sink staged (from its step's ack metrics, type-checked:
    acks are untrusted); the commit's figures are added by :func:`completed`.
    """
    source_records: dict[str, int] = {}
    source_malformed: dict[str, int] = {}
    source_lost: dict[str, int] = {}
    for ack in acks.values():
        source_records.update(ack.metrics.get("source_records", {}))
        source_malformed.update(ack.metrics.get("source_malformed", {}))
        source_lost.update(ack.metrics.get("source_lost", {}))
    point = plan.restore_point
    requested = point is not None and "restore_request_id" in plan.options
    sinks = {uid: e for s, a in sorted(acks.items()) for uid, e in _staged_sinks(s, a.metrics.get("sinks")).items()}
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
        "restored": requested,
        "restored_from": restored_from,
        **({"restored_from_url": point.location_url} if point is not None and requested else {}),
        "sinks": sinks,
        "sink_bytes": sum(e["bytes"] or 0 for e in sinks.values()),
        "steps": {s: _step_metrics(a) for s, a in sorted(acks.items())},
    }


def _step_metrics(ack: Ack) -> JsonDict:
    """An ack's metrics as the record keeps them: its sinks moved to the record's ``sinks``, its attempt
    added, and for a step with state whether any of its operators wrote incrementally or merged on the
    driver."""
    metrics = {k: v for k, v in ack.metrics.items() if k != "sinks"}
    flags = ("state_incremental", "state_merged_on_driver")
    stateful = "state_rows" in metrics
    return {**metrics, "attempt": ack.attempt, **({f: bool(metrics.get(f)) for f in flags} if stateful else {})}


def _staged_sinks(step: str, staged: Any) -> dict[str, JsonDict]:
    """The valid sink entries of a step's ack metrics (``sinks``), with the step."""
    if not isinstance(staged, dict):
        return {}
    entries = {}
    for uid, entry in staged.items():
        if isinstance(uid, str) and isinstance(entry, dict) and count(entry.get("rows")) is not None:
            kind = text(entry.get("kind"), 20)
            entries[uid[:100]] = {
                "kind": kind if kind in SINK_KINDS else "sink",
                "step": step,
                "target": text(entry.get("target"), 1000),
                "rows": entry["rows"],
                "files": count(entry.get("files")),
                "bytes": count(entry.get("bytes")),
            }
    return entries


def completed(checkpoint: CompletedCheckpoint, committed: Committed | None = None) -> JsonDict:
    """The record of a completed checkpoint: its ``_metadata`` figures and, when known, who committed
    it and each sink's commit figures (``delta_version``, ``commit_time``; ``None`` if not recorded).

    Its ``end_time`` is the ``_metadata``'s ``completion_time``, the one completion time every view
    shows (``duration_seconds`` ends there too); when the sinks committed is each sink's ``commit_time``.
    """
    record: JsonDict = {
        "checkpoint_id": checkpoint.checkpoint_id,
        "type": checkpoint.type.value,
        "trigger_time": checkpoint.trigger_time,
        **checkpoint.stats,
        "status": "COMPLETED",
        "end_time": checkpoint.completion_time,
    }
    if committed is None:
        return record
    staged = record.get("sinks")
    sinks = {}
    for uid, entry in (staged if isinstance(staged, dict) else {}).items():
        facts = committed.sinks.get(uid)
        facts = facts if isinstance(facts, dict) else {}
        version, when = count(facts.get("delta_version")), seconds(facts.get("commit_time"))
        if isinstance(entry, dict):
            sinks[uid] = {**entry, "delta_version": version, "commit_time": when}
    return {**record, "sinks": sinks, "committed_by": committed.by, "committed_by_run_id": committed.run_id}


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


def _restored(stats: JsonDict) -> bool:
    """Whether the checkpoint started from a restore request; a record written before ``restored``
    existed tells by its ``restored_from_url`` (set only then)."""
    restored = stats.get("restored")
    return restored if isinstance(restored, bool) else bool(text(stats.get("restored_from_url")))


def _sum(*parts: int | None) -> int | None:
    """The sum of the known ``parts``; ``None`` if none is known."""
    known = [p for p in parts if p is not None]
    return sum(known) if known else None


def history_row(stats: Any) -> JsonDict | None:
    """One history row (CLI, Checkpoints page) from a stored record, untrusted: every value is
    type-checked, what is malformed reads as ``None`` (or empty); ``None`` if it has no valid id.

    ``bytes_written`` is what the checkpoint wrote: its state files plus its sinks' output
    (``sink_bytes``); ``restored_from`` is set only for a ``restored`` checkpoint;
    ``committed_by`` is ``finalize``, ``trigger`` or ``None`` (not recorded).
    """
    if not isinstance(stats, dict) or count(stats.get("checkpoint_id")) is None:
        return None
    steps = stats.get("steps")
    files = [_step_total(steps, "state_files"), _step_total(steps, "sink_files_staged")]
    trigger, end = seconds(stats.get("trigger_time")), seconds(stats.get("end_time"))
    duration = number(stats.get("duration_seconds"))
    if duration is None and trigger is not None and end is not None and end >= trigger:
        duration = round(end - trigger, 3)
    status = text(stats.get("status"), 20)
    restored = _restored(stats)
    sink_bytes = count(stats.get("sink_bytes"))
    committed_by = stats.get("committed_by")
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
        "bytes_written": _sum(_step_total(steps, "state_bytes"), sink_bytes),
        "sink_bytes": sink_bytes,
        "files": _sum(*files),
        "restored": restored,
        "restored_from": count(stats.get("restored_from")) if restored else None,
        "restored_from_url": text(stats.get("restored_from_url")) if restored else "",
        "committed_by": committed_by if committed_by in COMMITTERS else None,
    }


# -- the drill-down of one checkpoint, read back from its stored record ------------------------
def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _per_input(values: Any, read: Any) -> dict[str, Any]:
    """``{input uid: value}`` of the entries of ``values`` that ``read`` accepts."""
    if not isinstance(values, dict):
        return {}
    read_back = {text(k, 100): read(v) for k, v in values.items() if isinstance(k, str) and k}
    return {k: v for k, v in read_back.items() if v is not None}


def step_details(stats: Any) -> list[JsonDict]:
    """Per step of a stored record, in step order, type-checked (a malformed value is ``None``): the
    accepted ``attempt``, ``records_in``/``records_out``, ``state_rows``/``state_bytes``/``state_files``,
    ``incremental``, ``inline`` (its state travels in ``_metadata``) and ``merged_on_driver`` (``None`` for a
    step without state), ``seconds``,
    ``input_records`` and ``alignment_seconds`` (per input; empty: inputs align by the barrier cut)."""
    steps = stats.get("steps") if isinstance(stats, dict) else None
    if not isinstance(steps, dict):
        return []
    details = []
    for step, m in sorted((k, v) for k, v in steps.items() if isinstance(k, str) and isinstance(v, dict)):
        details.append(
            {
                "step": text(step, 500),
                "attempt": count(m.get("attempt")),
                "records_in": count(m.get("records_in")),
                "records_out": count(m.get("records_out")),
                "state_rows": count(m.get("state_rows")),
                "state_bytes": count(m.get("state_bytes")),
                "state_files": count(m.get("state_files")),
                "incremental": _flag(m.get("state_incremental")),
                "inline": m.get("state_inline") == 1 if "state_rows" in m else None,
                "merged_on_driver": _flag(m.get("state_merged_on_driver")),
                "seconds": number(m.get("seconds")),
                "input_records": _per_input(m.get("input_records"), count),
                "alignment_seconds": _per_input(m.get("alignment_seconds"), number),
            }
        )
    return details


def sink_details(stats: Any) -> list[JsonDict]:
    """Per sink entry of a stored record, by uid, type-checked (a malformed value is ``None``, an entry
    that is not an object is left out): ``uid``, ``kind``, ``step``, ``target``, ``rows``, ``files``,
    ``bytes``, ``delta_version``, ``commit_time``."""
    sinks = stats.get("sinks") if isinstance(stats, dict) else None
    if not isinstance(sinks, dict):
        return []
    details = []
    for uid, e in sorted((k, v) for k, v in sinks.items() if isinstance(k, str) and isinstance(v, dict)):
        kind = text(e.get("kind"), 20)
        details.append(
            {
                "uid": text(uid, 100),
                "kind": kind if kind in SINK_KINDS else "sink",
                "step": text(e.get("step"), 500),
                "target": text(e.get("target"), 1000),
                "rows": count(e.get("rows")),
                "files": count(e.get("files")),
                "bytes": count(e.get("bytes")),
                "delta_version": count(e.get("delta_version")),
                "commit_time": seconds(e.get("commit_time")),
            }
        )
    return details
