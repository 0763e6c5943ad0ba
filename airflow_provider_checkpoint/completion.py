"""What follows a checkpoint's commit point (its ``_metadata``): the sinks commit (beside them the sources release
the input no restore needs any more), the sources clean up, the savepoint and the job record are written, older
checkpoints retired, and the stats record written last.

It is idempotent: recovery (the next trigger) runs it again for a checkpoint whose finalize died past
``_metadata``, and the stats record, written last and once, tells whether it is done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from airflow_provider_checkpoint.connectors.base.committer import SinkCommitter
from airflow_provider_checkpoint.core import stats
from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.core.model import CompletedCheckpoint, JsonDict
from airflow_provider_checkpoint.core.retention import subsumed
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.dataflow.source import Release
from airflow_provider_checkpoint.state.savepoints import savepoint_target, write_savepoint
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore

StatsRecorder = Callable[[int, JsonDict], None]
"""Writes a checkpoint's stats record (and tells whoever listens)."""


class CheckpointCompletion:
    """Finishes completed checkpoints of one job (:meth:`finish`), once each as its stats record tells
    (:meth:`finished`); ``allowed_roots`` confine the savepoint target its options name. It shares the
    coordinator's stores and its ``record`` of stats."""

    def __init__(
        self,
        storage: JobStorage,
        graph: PipelineGraph,
        settings: CheckpointSettings,
        allowed_roots: Sequence[str],
        store: CompletedCheckpointStore,
        records: JobRecordStore,
        sink_committer: SinkCommitter,
        record: StatsRecorder,
    ) -> None:
        self.storage = storage
        self.graph = graph
        self.settings = settings
        self.allowed_roots = allowed_roots
        self.store = store
        self.records = records
        self.sink_committer = sink_committer
        self.record = record

    def finish(
        self, completed: CompletedCheckpoint, run_id: str, by: str, commit_sinks: bool = True, fresh: bool = False
    ) -> None:
        """Everything after ``_metadata``; idempotent, so recovery simply runs it again.

        The stats record is written last, once: by run ``run_id``'s finalize, or (``by="trigger"``) by
        the next run's trigger when finalize died before it; it names that task as the committer.
        ``fresh``: this task created ``_metadata`` just now, so no record exists yet (nothing is asked)."""
        kept = self.kept(completed)
        earlier = [c for c in kept if c.checkpoint_id < completed.checkpoint_id]
        sinks_committed: Future[bool] = Future()  # whether ``completed``'s sinks are committed here, once they ended
        # beside the sinks' commits: up to an earlier checkpoint's position (the oldest kept is one of those, its
        # sinks committed) at once, else up to ``completed``'s only once its sinks are committed (never after a
        # failed commit, nor when they are not committed here: under a pending restore of an earlier checkpoint)
        releases, ready = self._releases(earlier or kept), (lambda: True) if earlier else sinks_committed.result
        failed: list[str] = []  # the sinks whose housekeeping failed
        with ThreadPoolExecutor(max(1, len(releases)), thread_name_prefix="release-input") as pool:
            released = [pool.submit(r, ready) for r in releases]
            try:  # told once every sink committed: the sinks' housekeeping (a Delta log checkpoint) runs beside
                if commit_sinks:
                    failed = self.sink_committer.commit(completed, lambda: sinks_committed.set_result(True))
            finally:
                if not sinks_committed.done():  # a sink's commit failed, or none were committed here
                    sinks_committed.set_result(False)
            self._after_commits(completed, failed)
            for release in released:
                release.result()
        if fresh or not self.finished(completed.checkpoint_id):
            committed = stats.Committed(by, run_id, self.sink_committer.commit_records(completed))
            self.record(completed.checkpoint_id, stats.completed(completed, committed))

    def _after_commits(self, completed: CompletedCheckpoint, failed: Sequence[str]) -> None:
        """The sources cleaned up, the savepoint and the job record written (with the housekeeping still due: the
        ``failed`` sinks' of ``completed``, and the earlier failures, run again here), older checkpoints retired."""
        self.store.discard_channels(completed.checkpoint_id)
        fault_point("finalize.before_clean_source", checkpoint=completed.checkpoint_id)
        for source in self.graph.sources:
            if source.uid in completed.source_positions:
                source.on_checkpoint_committed(completed.checkpoint_id, completed.source_positions[source.uid])
        savepoint = savepoint_target(completed.options, self.allowed_roots, self.storage, completed)
        target = savepoint.url() if savepoint else None
        if savepoint:
            write_savepoint(self.storage, completed, savepoint)
        job = self.records.load()
        job.failures.on_complete(completed.checkpoint_id)
        due = self.sink_committer.catch_up(job.housekeeping)
        job.keep_housekeeping(due | {uid: [*due.get(uid, []), completed.checkpoint_id] for uid in failed})
        if target:
            entry = {"checkpoint_id": completed.checkpoint_id, "path": target, "time": completed.completion_time}
            described = self.sink_committer.describe(completed.checkpoint_id)
            job.record_savepoint(
                {**entry, "sinks": described} if described else entry,
                bool(completed.options.get("stop_after_savepoint")),
            )
        self.records.save(job)
        if "restore_request_id" in completed.options:
            self.records.clear_restore_request(completed.options["restore_request_id"])
        self.store.retain(self.settings.retained_checkpoints or 3)

    def kept(self, completed: CompletedCheckpoint) -> list[CompletedCheckpoint]:
        """The completed checkpoints retention keeps once ``completed`` is finished (it among them), oldest first:
        a restore may start from any of them."""
        every = self.store.checkpoints()
        dropped = subsumed(every, self.settings.retained_checkpoints or 3)
        return [c for c in every if c not in dropped]

    def _releases(self, kept: Sequence[CompletedCheckpoint]) -> list[Release]:
        """What each source does to release the input none of ``kept`` needs (:meth:`Source.release_input`: a
        replication slot advanced to the oldest of their positions)."""
        releases = (
            source.release_input([c.source_positions[source.uid] for c in kept if source.uid in c.source_positions])
            for source in self.graph.sources
        )
        return [r for r in releases if r is not None]

    def finished(self, checkpoint_id: int) -> bool:
        """Whether everything after checkpoint ``checkpoint_id``'s ``_metadata`` is done: :meth:`finish`
        writes the stats record of a completed checkpoint last."""
        return self.storage.has_file(self.storage.stats_path(checkpoint_id))
