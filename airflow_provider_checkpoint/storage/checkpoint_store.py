"""The completed checkpoints of a job (Flink's CompletedCheckpointStore): what is retained, what goes.

Retention keeps the newest ``retained`` completed checkpoints (never savepoint copies),
deletes a state file only when no retained checkpoint references it (shared files stay),
and removes the leftovers of discarded checkpoints.
"""

from __future__ import annotations

import logging

from airflow_provider_checkpoint.core.model import CompletedCheckpoint
from airflow_provider_checkpoint.core.retention import deletable_paths, subsumed
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, MetadataError
from airflow_provider_checkpoint.storage import JobStorage

log = logging.getLogger(__name__)


class CompletedCheckpointStore:
    """The completed checkpoints found in one job's storage."""

    def __init__(self, storage: JobStorage) -> None:
        self.storage = storage

    def checkpoints(self) -> list[CompletedCheckpoint]:
        """Every readable completed checkpoint, oldest first (unreadable ones are logged and skipped)."""
        completed = []
        for checkpoint_id in self.storage.completed_ids():
            try:
                completed.append(self.storage.load_completed(checkpoint_id))
            except (MetadataError, CheckpointStorageError) as e:
                log.warning("skipping unreadable checkpoint %d: %s", checkpoint_id, e)
        return completed

    def retain(self, retained: int) -> None:
        """Discard all but the ``retained`` newest completed checkpoints."""
        completed = self.checkpoints()
        discard = subsumed(completed, retained)
        if not discard:
            return
        kept = [c for c in completed if c not in discard]
        self.storage.delete_paths(deletable_paths(discard, kept))
        still_needed = set().union(*(c.referenced_paths() for c in kept))
        kept_ids = {c.checkpoint_id for c in kept}
        for checkpoint_id in self.storage.checkpoint_ids():
            chk = self.storage.chk_dir(checkpoint_id)
            if checkpoint_id in kept_ids or checkpoint_id > max(kept_ids):
                continue
            if any(p.startswith(chk + "/") for p in still_needed):
                # a kept checkpoint still reads files here: keep only those
                self.storage.delete_paths(
                    [self.storage.metadata_path(checkpoint_id), self.storage.plan_path(checkpoint_id)]
                )
            elif self.storage.is_completed(checkpoint_id) or not self.storage.exists(
                self.storage.plan_path(checkpoint_id)
            ):
                self.storage.delete(chk)
