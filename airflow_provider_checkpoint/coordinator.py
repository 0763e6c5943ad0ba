"""The checkpoint coordinator: triggers checkpoints and completes or aborts them.

It decides; the pending checkpoint counts acks, storage writes, sinks commit, and what follows the
commit point is :mod:`.completion`'s. It imports neither Airflow nor Spark, so the Airflow operators,
the tests and the demo drive the same protocol.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from airflow_provider_checkpoint.completion import CheckpointCompletion
from airflow_provider_checkpoint.connectors.base.committer import SinkCommitter
from airflow_provider_checkpoint.core import reasons, stats
from airflow_provider_checkpoint.core.events import CheckpointEvents
from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.core.job_record import JobRecord
from airflow_provider_checkpoint.core.model import (
    Ack,
    Barrier,
    CheckpointPlan,
    CheckpointType,
    CompletedCheckpoint,
    JsonDict,
    RestorePoint,
)
from airflow_provider_checkpoint.core.pending import AckOutcome, PendingCheckpoint
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.core.status import AbortReason, JobStatus
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.dataflow.version import VersionCheck
from airflow_provider_checkpoint.exceptions import (
    CheckpointAborted,
    CheckpointStorageError,
    JobNotRunning,
    LeaseHeld,
    MetadataError,
    RefusedInputError,
    RestoreError,
    how_to_restore,
)
from airflow_provider_checkpoint.restore.point import Restorer, RestoreSource
from airflow_provider_checkpoint.restore.snapshot import verify_state
from airflow_provider_checkpoint.state.ownership import keeps_restored_files
from airflow_provider_checkpoint.state.savepoints import savepoint_target
from airflow_provider_checkpoint.storage import JobStorage, Location
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.stats import StatsStore

log = logging.getLogger(__name__)


class CheckpointCoordinator:
    """Decides: triggers checkpoints, completes or aborts them, recovers after crashes.

    ``allowed_roots`` are where snapshots may be restored from and savepoints written
    (URLs); by default only the job's storage root. Every URL a stored document names is
    confined to them again before use. ``events`` is told of every plan and stats record.
    """

    def __init__(
        self,
        storage: JobStorage,
        graph: PipelineGraph,
        settings: CheckpointSettings,
        dag_id: str | None = None,
        allowed_roots: Sequence[str] | None = None,
        events: CheckpointEvents | None = None,
    ) -> None:
        self.storage = storage
        self.graph = graph
        self.settings = settings
        self.dag_id = dag_id or storage.job_id
        self.allowed_roots = list(allowed_roots or [Location(storage.fs, storage.root).url()])
        self.store = CompletedCheckpointStore(storage)
        self.records = JobRecordStore(storage)
        self.stats_store = StatsStore(storage)
        self.sink_committer = SinkCommitter(graph.sinks, storage.job_id, storage)
        self.restorer = Restorer(storage, graph, self.allowed_roots, self.sink_committer)
        self.events = events
        for source in graph.sources:
            source.bind_storage(storage)

    @property
    def completion(self) -> CheckpointCompletion:
        """What follows the commit point, with this coordinator's current settings, stores and events."""
        return CheckpointCompletion(
            self.storage,
            self.graph,
            self.settings,
            self.allowed_roots,
            self.store,
            self.records,
            self.sink_committer,
            self._record,
        )

    # -- trigger -----------------------------------------------------------------------
    def trigger(
        self,
        run_id: str,
        checkpoint_type: CheckpointType = CheckpointType.CHECKPOINT,
        now: float | None = None,
        options: JsonDict | None = None,
        periodic: bool = False,
        holder_alive: Callable[[JsonDict], bool] | None = None,
        check: VersionCheck | None = None,
    ) -> CheckpointPlan:
        """Recover, clean up, check a new version of the pipeline, then plan checkpoint ``n+1`` and hold the
        job's lease for it.

        The restore point is the pending restore request (``_restore.json``) if there is
        one, else the latest completed checkpoint. ``options`` may carry
        ``savepoint_target`` and ``stop_after_savepoint``. A ``periodic`` (scheduled)
        checkpoint within the minimum pause after the last one is refused with
        ``MIN_PAUSE``; ``holder_alive`` tells whether the run holding the lease still runs.

        Every document is checked before the first effect (beyond the lease): the savepoint
        target, then the latest checkpoint's identity, id and placement, then the restore
        point's compatibility with the deployed operators; recovery and cleanup come after.

        ``check`` runs when its version is not the one the job record says passed: problems refuse
        the checkpoint with :class:`PipelineCheckError` before an id is allocated (nothing staged,
        no failure counted); a pass is recorded with the plan, so each version is checked once.
        """
        now = time.time() if now is None else now
        options = dict(options or {})
        self.store.refresh()
        savepoint_target(options, self.allowed_roots, self.storage)
        job = self._running_job()
        self._hold_lease(run_id, now, holder_alive)
        try:
            restore_from, job = self._recover(
                job, run_id, now, periodic and checkpoint_type is CheckpointType.CHECKPOINT
            )
            self._clean_up(job, now)
            if check is not None:
                check.apply(job)
            self._record_topology(job)
            restore_point = self.restorer.restore_point(restore_from, options)
            plan = self._plan(job, run_id, checkpoint_type, now, restore_point, options)
        except BaseException:
            self.records.release_lease(run_id)
            raise
        log.info("triggered checkpoint %d of job %s (run %s)", plan.checkpoint_id, job.job_id, run_id)
        if self.events:
            self.events.triggered(plan)
        return plan

    def _running_job(self) -> JobRecord:
        """The job record; :class:`JobNotRunning` unless the job runs."""
        job = self.records.load()
        if job.status is not JobStatus.RUNNING:
            raise JobNotRunning(
                job.status,
                f"job {job.job_id} is {job.status.value}: {job.status_reason or 'no reason recorded'}. "
                f"To resume, restore it from a checkpoint or savepoint: {how_to_restore('latest', job.job_id)}.",
            )
        return job

    def _hold_lease(self, run_id: str, now: float, holder_alive: Callable[[JsonDict], bool] | None) -> None:
        """One checkpoint at a time: another run's live lease aborts with ``TOO_MANY_CONCURRENT``."""
        try:
            self.records.acquire_lease(
                run_id, self.settings.checkpoint_timeout_seconds, now, {"dag_id": self.dag_id}, holder_alive
            )
        except LeaseHeld as e:
            raise CheckpointAborted(AbortReason.TOO_MANY_CONCURRENT, str(e)) from e

    def _recover(
        self, job: JobRecord, run_id: str, now: float, periodic: bool
    ) -> tuple[RestoreSource | None, JobRecord]:
        """Validate what the checkpoint restores from, then finish the latest checkpoint's commit (run
        ``run_id``'s trigger commits it, if its finalize did not get that far).

        Returns the restore source and the job record as the recovery left it. A ``periodic``
        checkpoint within the minimum pause after the latest one aborts with ``MIN_PAUSE``.
        """
        latest = self.store.latest()
        try:
            restore_from = self.restorer.source(latest)
        except RestoreError:
            self._record_topology(job)  # so that the restore DAG can validate a restore for it
            raise
        if latest is None:
            return restore_from, job
        request = restore_from[1] if restore_from is not None else None
        if request is not None and latest.options.get("restore_request_id") == request.request_id:
            # ``latest`` took the request and completed (its finalize died before clearing it): the
            # restore is done, so ``latest`` is committed and continued from, not restored over
            restore_from, request = (self.restorer.own_snapshot(latest), None), None
        # a pending restore sets the sinks to its own checkpoint: one of its earlier triggers may
        # have rolled them back past ``latest`` already, so ``latest`` is not committed to them again
        restore_requested = request is not None
        if not self.completion.finished(latest.checkpoint_id):
            self.completion.finish(latest, run_id, "trigger", commit_sinks=not restore_requested)
            job = self._running_job()  # e.g. a stop-with-savepoint finished just now
        pause = self.settings.min_pause_between_checkpoints_seconds
        if periodic and now - latest.completion_time < pause:
            raise CheckpointAborted(
                AbortReason.MIN_PAUSE,
                f"checkpoint {latest.checkpoint_id} completed {now - latest.completion_time:.0f}s ago, "
                f"within min_pause_between_checkpoints={pause:.0f}s",
            )
        return restore_from, job

    def _clean_up(self, job: JobRecord, now: float) -> None:
        """Never reuse an id found in storage; abort the attempts no run will finish."""
        for existing in self.store.checkpoint_ids():
            job.observe_checkpoint_id(existing)
        for checkpoint_id, reason, message in self.store.abandoned_attempts():
            log.warning("aborting %s checkpoint %d of job %s", reason.value, checkpoint_id, job.job_id)
            self._discard(checkpoint_id)
            self._count_failure(job, checkpoint_id, reason, message, now)

    def _plan(
        self,
        job: JobRecord,
        run_id: str,
        checkpoint_type: CheckpointType,
        now: float,
        restore_point: RestorePoint | None,
        options: JsonDict,
    ) -> CheckpointPlan:
        """Allocate the next id, cut the barrier at every source's position, and write the plan."""
        checkpoint_id = job.allocate_checkpoint_id()
        positions: JsonDict = {}
        for source in self.graph.sources:
            previous = restore_point.source_positions.get(source.uid) if restore_point else None
            positions[source.uid] = source.barrier_position(previous)
        plan = CheckpointPlan(
            job_id=self.storage.job_id,
            run_id=run_id,
            barrier=Barrier(checkpoint_id, now, checkpoint_type, positions),
            steps=tuple(self.graph.steps),
            timeout_seconds=self.settings.checkpoint_timeout_seconds,
            restore_point=restore_point,
            options=options,
        )
        self.records.save(job)
        self.storage.write_atomic(
            self.storage.plan_path(checkpoint_id), json.dumps(plan.to_dict(), indent=1, sort_keys=True).encode()
        )
        return plan

    def _record_topology(self, job: JobRecord) -> None:
        """Record the deployed operators in the job record: the restore DAG validates against them."""
        job.topology = {**self.graph.topology(), "dag_id": self.dag_id}
        self.records.save(job)

    # -- finalize ----------------------------------------------------------------------
    def finalize(
        self,
        plan: CheckpointPlan,
        acks: Sequence[Ack | None],
        now: float | None = None,
        declines: Mapping[str, JsonDict] | None = None,
    ) -> CompletedCheckpoint:
        """Complete the checkpoint (commit ``_metadata``, then sinks) or abort it.

        Idempotent: run again after a crash past ``_metadata``, it finishes the commit.
        Raises :class:`CheckpointAborted` when the checkpoint cannot complete; a step that
        declined (``declines``: step → ``{"reason", "message"}``) gives its reason. Refused
        before any effect: a plan of another job, an existing ``_metadata`` that is not this
        plan's checkpoint, and a savepoint target that is no longer fresh.
        """
        now = time.time() if now is None else now
        checkpoint_id = plan.checkpoint_id
        self.store.refresh()
        if plan.job_id != self.storage.job_id:
            raise RefusedInputError(
                f"checkpoint plan of run {plan.run_id!r}: job_id {plan.job_id!r} is not job {self.storage.job_id!r}; "
                "finalize completes only plans its own job's trigger made"
            )
        fresh = False
        try:
            if self.store.is_completed(checkpoint_id):
                completed = self.store.load(checkpoint_id)
                if completed.barrier != plan.barrier:
                    raise MetadataError(
                        self.storage.url(self.storage.metadata_path(checkpoint_id)),
                        f"its barrier is not the one run {plan.run_id!r} planned; refused before any effect",
                    )
                self.restorer.own_snapshot(completed)
            else:
                savepoint_target(plan.options, self.allowed_roots, self.storage)
                completed, fresh = self._complete(plan, acks, now, declines or {})
            fault_point("finalize.after_metadata", checkpoint=checkpoint_id)
            self.completion.finish(completed, plan.run_id, "finalize", fresh=fresh)
        finally:
            self.records.release_lease(plan.run_id)
        log.info("completed checkpoint %d of job %s", checkpoint_id, plan.job_id)
        return completed

    def _complete(
        self, plan: CheckpointPlan, acks: Sequence[Ack | None], now: float, declines: Mapping[str, JsonDict]
    ) -> tuple[CompletedCheckpoint, bool]:
        """The checkpoint committed, and whether this call created its ``_metadata`` (else a concurrent one did)."""
        pending = PendingCheckpoint(plan)
        for ack in acks:
            if ack is None:
                continue
            outcome = pending.acknowledge(ack, now)
            if outcome is not AckOutcome.ACCEPTED:
                log.warning("ack of step %s attempt %d: %s", ack.step, ack.attempt, outcome.value)
        try:
            self.store.discard_attempts_except(
                plan.checkpoint_id, plan.steps, {a.attempt_dir for a in pending.acks.values()}
            )
            point = plan.restore_point
            keeps = keeps_restored_files(self.storage, point)
            completed = pending.complete(
                now, point.checkpoint_id if point else None, point.operators if point and keeps else None
            )
            for ack in pending.acks.values():
                self.sink_committer.check(plan.checkpoint_id, ack.sinks, f"ack of step {ack.step}")
                self.sink_committer.verify_staged(plan.checkpoint_id, ack.sinks)
            for uid, snapshot in sorted(completed.operators.items()):
                verify_state(
                    self.storage, uid, snapshot, self.storage.chk_dir(plan.checkpoint_id), self.store.listed_size
                )
            fault_point("finalize.before_metadata", checkpoint=plan.checkpoint_id)
            committed = self.store.commit(completed)
        except CheckpointAborted as e:
            e = pending.with_declines(e, declines)
            self.abort(plan, e.reason, e.message, now, e.detail)
            raise e from None
        except (CheckpointStorageError, RefusedInputError) as e:
            self.abort(plan, AbortReason.CORRUPT_STATE, str(e), now)
            raise CheckpointAborted(AbortReason.CORRUPT_STATE, str(e)) from e
        except Exception as e:
            if self.store.is_completed(plan.checkpoint_id):
                raise
            why, full = reasons.reason(e), reasons.detail(e)
            self.abort(plan, AbortReason.FINALIZE_FAILURE, why, now, full)
            raise CheckpointAborted(AbortReason.FINALIZE_FAILURE, why, full) from e
        if not committed:  # a concurrent finalize committed first: finish its checkpoint
            log.warning("checkpoint %d: another finalize committed _metadata first", plan.checkpoint_id)
            return self.store.load(plan.checkpoint_id), False
        return completed, True

    def abort(
        self, plan: CheckpointPlan, reason: AbortReason, message: str, now: float | None = None, detail: str = ""
    ) -> None:
        """Discard everything of the checkpoint and account for the failure; ``detail``: the full text of the
        errors behind ``message``, kept in the checkpoint's stats."""
        now = time.time() if now is None else now
        log.error("aborting checkpoint %d of job %s: %s", plan.checkpoint_id, plan.job_id, message)
        self._discard(plan.checkpoint_id)
        job = self.records.load()
        known = stats.base(plan)
        self._count_failure(
            job, plan.checkpoint_id, reason, message, now, {**known, "detail": detail} if detail else known
        )

    def _discard(self, checkpoint_id: int) -> None:
        for sink in self.graph.sinks:
            with sink.storage_errors():
                sink.abort(checkpoint_id)
        self.store.delete_dir(checkpoint_id)

    def _count_failure(
        self,
        job: JobRecord,
        checkpoint_id: int,
        reason: AbortReason,
        message: str,
        now: float,
        base: JsonDict | None = None,
    ) -> None:
        counted = job.count_failure(checkpoint_id, reason, message, self.settings.tolerable_failed_checkpoints)
        self.records.save(job)
        self._record(checkpoint_id, stats.aborted(checkpoint_id, reason, message, counted, now, base))

    def _record(self, checkpoint_id: int, record: JsonDict) -> None:
        """Write the stats record of a completed or aborted checkpoint, and tell ``events``."""
        self.stats_store.write(checkpoint_id, record)
        if self.events:
            self.events.recorded(record)
