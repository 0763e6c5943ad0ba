"""What a checkpoint starts from: a restore request's snapshot, or the job's latest checkpoint.

A restore runs request → snapshot → restore point → sink rollback: the restore DAG writes a
request (:mod:`.requests`); the next trigger opens and validates the snapshot it names
(:mod:`.snapshot`), rolls every sink back to that checkpoint and plans the checkpoint from its
restore point (:class:`Restorer`); finalize clears the request once a checkpoint completes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.model import CompletedCheckpoint, JsonDict, RestorePoint, RestoreRequest
from airflow_provider_checkpoint.restore.snapshot import Snapshot, check_compatible, open_restore_snapshot
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.job_storage import METADATA

if TYPE_CHECKING:
    from airflow_provider_checkpoint.connectors.base.committer import SinkCommitter
    from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
    from airflow_provider_checkpoint.storage import JobStorage

log = logging.getLogger(__name__)

RestoreSource = tuple[Snapshot, RestoreRequest | None]
"""A validated snapshot to restore from, and the restore request that names it (none for the latest)."""


class Restorer:
    """Finds, validates and applies what the next checkpoint of a job restores from."""

    def __init__(
        self, storage: JobStorage, graph: PipelineGraph, allowed_roots: Sequence[str], sink_committer: SinkCommitter
    ) -> None:
        self.storage = storage
        self.graph = graph
        self.allowed_roots = allowed_roots
        self.sink_committer = sink_committer

    def source(self, latest: CompletedCheckpoint | None) -> RestoreSource | None:
        """What the next checkpoint restores from, validated against this pipeline; no effect.

        The pending restore request's snapshot, else ``latest``. State of an operator the
        pipeline no longer has is refused unless the restore request allows it; an
        operator without state starts empty.
        """
        request = JobRecordStore(self.storage).load_restore_request()
        if request is None:
            return None if latest is None else (self.own_snapshot(latest), None)
        snapshot = open_restore_snapshot(
            request, self.allowed_roots, self.storage, self.graph.stateful_keys(), self.graph.state_declarations()
        )
        restored = snapshot.checkpoint
        self.sink_committer.check(restored.checkpoint_id, restored.sinks, snapshot.location.url(METADATA))
        return snapshot, request

    def own_snapshot(self, completed: CompletedCheckpoint) -> Snapshot:
        """A checkpoint in this job's directory, refused unless compatible with the deployed operators."""
        snapshot = Snapshot(completed, self.storage.checkpoint_location(completed.checkpoint_id), self.storage)
        check_compatible(
            snapshot, self.storage.job_id, self.graph.stateful_keys(), False, self.graph.state_declarations()
        )
        return snapshot

    def restore_point(self, source: RestoreSource | None, options: JsonDict) -> RestorePoint | None:
        """The restore point of a validated ``source``; a restore request rolls the sinks back to it first
        (and names itself in ``options``, so that finalize clears it once a checkpoint completes)."""
        if source is None:
            return None
        snapshot, request = source
        if request is None:
            return snapshot.checkpoint.to_restore_point(snapshot.location.url())
        restored = snapshot.checkpoint
        for sink in self.graph.sinks:
            sink.rollback(restored.checkpoint_id)
            if sink.uid in restored.sinks:
                sink.commit(restored.checkpoint_id, restored.sinks[sink.uid])
        options["restore_request_id"] = request.request_id
        log.info("restoring job %s from %s", self.storage.job_id, snapshot.location.url())
        return snapshot.restore_point()
