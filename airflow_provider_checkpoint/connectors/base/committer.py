"""The committer side of a pipeline's sinks, as the coordinator uses it after the commit point."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from airflow_provider_checkpoint.core import reasons
from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.core.model import CompletedCheckpoint, JsonDict
from airflow_provider_checkpoint.dataflow.graph import Sink
from airflow_provider_checkpoint.dataflow.sink import Housekeeping
from airflow_provider_checkpoint.storage import JobStorage

log = logging.getLogger(__name__)


class SinkCommitter:
    """Checks, commits and describes the sink transactions of a checkpoint, for every sink of a pipeline.

    Committing is idempotent per sink (see :class:`~.base.TransactionalSink`), so the trigger's
    recovery and a finalize retry may both commit the same completed checkpoint.
    """

    def __init__(self, sinks: Sequence[Sink], job_id: str, storage: JobStorage | None = None) -> None:
        self.sinks = {s.uid: s for s in sinks}
        for sink in sinks:
            sink.bind_job(job_id)
            if storage is not None:
                sink.bind_storage(storage)

    def check(self, checkpoint_id: int, committables: Mapping[str, list[JsonDict]], document: str) -> None:
        """Every committable has the shape its sink writes (raises :class:`DocumentError`)."""
        for uid, sink in self.sinks.items():
            if uid in committables:
                sink.check_committables(checkpoint_id, committables[uid], document)

    def verify_staged(self, checkpoint_id: int, committables: Mapping[str, list[JsonDict]]) -> None:
        """What every sink staged for ``checkpoint_id`` is still there (see :meth:`Sink.verify_staged`)."""
        for uid, sink in self.sinks.items():
            if uid in committables:
                sink.verify_staged(checkpoint_id, committables[uid])

    def describe(self, checkpoint_id: int) -> dict[str, JsonDict]:
        """What each sink records about its commit of ``checkpoint_id`` (e.g. a table version), by uid."""
        described = {uid: s.describe_commit(checkpoint_id) for uid, s in self.sinks.items()}
        return {uid: d for uid, d in described.items() if d}

    def commit_records(self, completed: CompletedCheckpoint) -> dict[str, JsonDict]:
        """What the target of each sink with output in ``completed`` records about its commit (Delta version,
        commit time), by stats entry uid; informational: a sink that cannot tell (its target unreachable
        now) records nothing, and the commit is not affected."""
        records: dict[str, JsonDict] = {}
        checkpoint_id = completed.checkpoint_id
        for uid, sink in sorted(self.sinks.items()):
            if uid not in completed.sinks:
                continue
            try:
                records.update(sink.commit_record(checkpoint_id))
            except Exception as e:  # the stats record is informational
                log.warning("sink %s: commit of checkpoint %d not described: %r", uid, checkpoint_id, e)
        return records

    def commit(self, completed: CompletedCheckpoint, committed: Callable[[], None] = lambda: None) -> list[str]:
        """Commit every sink transaction of ``completed``; output for a sink the pipeline lost is skipped.
        ``committed`` is called once all are committed, before the sinks' housekeeping
        (:meth:`Sink.commit_then`); not after a failed commit. Returns the uids of the sinks whose housekeeping
        failed: work no guarantee depends on, so a failure is logged, not raised (:meth:`catch_up` retries it)."""
        self.check(completed.checkpoint_id, completed.sinks, f"checkpoint {completed.checkpoint_id}")
        housekeeping: list[tuple[str, Housekeeping]] = []
        for uid, committables in sorted(completed.sinks.items()):
            if uid not in self.sinks:
                log.warning(
                    "checkpoint %d has output for sink %r, which this pipeline no longer has: not committed",
                    completed.checkpoint_id,
                    uid,
                )
                continue
            with self.sinks[uid].storage_errors():
                after = self.sinks[uid].commit_then(completed.checkpoint_id, committables)
            if after is not None:
                housekeeping.append((uid, after))
            fault_point("finalize.between_sink_commits", checkpoint=completed.checkpoint_id, sink=uid)
        committed()
        return [uid for uid, after in housekeeping if not self._housekeep(uid, completed.checkpoint_id, after)]

    def catch_up(self, due: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
        """Run again the housekeeping that failed after the commits of earlier checkpoints (``due``: sink uid →
        checkpoint ids, :attr:`~airflow_provider_checkpoint.core.job_record.JobRecord.housekeeping`); what is
        still due (a sink the pipeline no longer has is dropped)."""
        still: dict[str, list[int]] = {}
        for uid, ids in sorted(due.items()):
            for checkpoint_id in ids if uid in self.sinks else ():
                after = self.sinks[uid].housekeeping(checkpoint_id)
                if after is not None and not self._housekeep(uid, checkpoint_id, after):
                    still.setdefault(uid, []).append(checkpoint_id)
        return still

    def _housekeep(self, uid: str, checkpoint_id: int, after: Housekeeping) -> bool:
        """Run sink ``uid``'s housekeeping ``after`` of checkpoint ``checkpoint_id``'s commit; whether it ran
        through (a failure is one warning: the commit stands)."""
        try:
            with self.sinks[uid].storage_errors():
                after()
        except Exception as e:  # work no guarantee depends on: retried after the next checkpoint's commit
            log.warning(
                "sink %s: housekeeping after the commit of checkpoint %d failed, retried after the next "
                "checkpoint's commit (the commit stands): %s",
                uid,
                checkpoint_id,
                reasons.reason(e),
            )
            return False
        return True
