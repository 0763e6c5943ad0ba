"""Checkpoint metrics through Airflow's metrics layer (``airflow.sdk.observability.stats``): StatsD,
Datadog or OpenTelemetry, as the site's ``[metrics]`` section configures them.

Every figure is read from what the coordinator has just decided: the stats record of a checkpoint
(``_stats/<id>.json``) the moment it is written, and the plan the trigger has just made. So the
metrics say exactly what ``_stats`` says, whichever task wrote the record (finalize, or the next
run's trigger finishing a commit or aborting an abandoned attempt).

Every metric carries the tag ``job_id`` (and ``reason`` or ``source`` where named). With ``[metrics]
legacy_names_on`` (Airflow's default) each is emitted a second time with those values in its name,
for StatsD without tags, as Airflow names its own per-DAG metrics (``dagrun.duration.success.<dag_id>``):
``checkpoint.completed.<job_id>``, ``checkpoint.aborted.<job_id>.<reason>``,
``checkpoint.source_lag.<job_id>.<source>``; a ``.`` in a value becomes ``__``, as Airflow does.

Emitting never fails a checkpoint: an error is logged once per process and swallowed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.core import stats as records

if TYPE_CHECKING:
    from airflow_provider_checkpoint.core.model import CheckpointPlan, JsonDict
    from airflow_provider_checkpoint.dataflow.graph import Source

log = logging.getLogger(__name__)

PREFIX = "checkpoint"
_failed_once = False


@contextlib.contextmanager
def _never_raises() -> Iterator[None]:
    """Swallow any error of the block; log the first one of this process."""
    global _failed_once
    try:
        yield
    except Exception as e:
        if not _failed_once:
            _failed_once = True
            log.warning("checkpoint metrics not emitted (logged once, checkpoints are unaffected): %r", e)


def _legacy_names_on() -> bool:
    from airflow.sdk.configuration import conf

    return conf.getboolean("metrics", "legacy_names_on", fallback=True)


def _total(entries: Any, metric: str) -> int:
    """The sum of the valid counts ``metric`` of a record's per-step or per-sink ``entries``."""
    values = entries.values() if isinstance(entries, Mapping) else ()
    return sum(records.count(e.get(metric)) or 0 for e in values if isinstance(e, Mapping))


class CheckpointMetrics:
    """The metrics of one job; the coordinator calls :meth:`triggered` and :meth:`recorded`."""

    def __init__(self, job_id: str, sources: Sequence[Source]) -> None:
        self.job_id = job_id
        self.sources = list(sources)

    def triggered(self, plan: CheckpointPlan) -> None:
        """Per source that knows it at trigger time (Kafka): ``source_lag``, the offsets between the
        position the checkpoint restores and its barrier."""
        with _never_raises():
            restored = plan.restore_point.source_positions if plan.restore_point else {}
            for source in self.sources:
                lag = source.offsets_behind(restored.get(source.uid), plan.barrier.positions.get(source.uid))
                if lag is not None:
                    self._emit("gauge", "source_lag", lag, source=source.uid)

    def recorded(self, record: JsonDict) -> None:
        """The metrics of a stats record the coordinator has just written (completed or aborted)."""
        with _never_raises():
            if record.get("status") == "COMPLETED":
                self._completed(record)
            elif record.get("status") == "ABORTED":
                self._emit("incr", "aborted", 1, reason=str(record.get("reason")))
                if record.get("counted") is True:
                    self._emit("incr", "failed", 1)

    def _completed(self, record: JsonDict) -> None:
        duration_ms = round(1000 * (records.number(record.get("duration_seconds")) or 0.0))
        records_in = records.count(record.get("records_in")) or 0
        sinks = record.get("sinks")
        records_out = _total(sinks, "rows")
        self._emit("incr", "completed", 1)
        self._emit("gauge", "last_completed_id", record["checkpoint_id"])
        self._emit("gauge", "last_duration", duration_ms)
        self._emit("timing", "duration", duration_ms)
        self._emit("gauge", "last_full_size", records.count(record.get("state_size")) or 0)
        self._emit("gauge", "last_size", _total(record.get("steps"), "state_bytes"))
        self._emit("gauge", "last_records_in", records_in)
        self._emit("gauge", "last_records_out", records_out)
        self._emit("incr", "records_in", records_in)
        self._emit("incr", "records_out", records_out)
        if record.get("restored") is True:
            self._emit("incr", "restored", 1)

    def _emit(self, kind: str, name: str, value: float, **tags: str) -> None:
        """``kind`` (``incr``, ``gauge`` or ``timing``) of ``checkpoint.<name>`` tagged with the job id
        and ``tags``; with legacy names on, also ``checkpoint.<name>.<job_id>[.<tag value>...]``."""
        from airflow.sdk.observability import stats

        emit: Any = getattr(stats, kind)
        tagged = {"job_id": self.job_id, **tags}
        emit(f"{PREFIX}.{name}", value, tags=tagged)
        if _legacy_names_on():
            emit(".".join((PREFIX, name, *(v.replace(".", "__") for v in tagged.values()))), value)
