"""The hook to a checkpointed job's storage, and the checks the sensors, triggers, CLI and page share.

The checks are plain synchronous methods over the job's storage and the pipeline's
sources; the triggers run them with :func:`asyncio.to_thread`, so a slow filesystem
never blocks the triggerer's event loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow.sdk import BaseHook

from airflow_provider_checkpoint.core import stats
from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.graph import Source
from airflow_provider_checkpoint.storage import JobStorage
from airflow_provider_checkpoint.storage.checkpoint_store import CompletedCheckpointStore
from airflow_provider_checkpoint.storage.config import job_storage
from airflow_provider_checkpoint.storage.job_records import JobRecordStore
from airflow_provider_checkpoint.storage.stats import StatsStore


class CheckpointStorageHook(BaseHook):
    """Reads the checkpoint storage of one job: ``<storage_root>/<job_id>/``.

    Every call reads storage afresh (nothing is cached), so a poller sees each new
    checkpoint. Storage documents are untrusted: a malformed one raises a
    :class:`~airflow_provider_checkpoint.exceptions.CheckpointError` naming it.

    :param job_id: The job whose storage it reads.
    :param storage_root: URL of the checkpoint storage root holding the job
        (default ``[checkpoint] storage_root``).
    :param storage_conn_id: Airflow connection for the storage root's filesystem
        (an ``aws`` connection for ``s3://``, else any connection ``ObjectStoragePath`` accepts).
    """

    conn_name_attr = "storage_conn_id"
    hook_name = "Checkpoint storage"

    def __init__(self, job_id: str, storage_root: str | None = None, storage_conn_id: str | None = None) -> None:
        super().__init__()
        self.job_id = job_id
        self.storage_root = storage_root
        self.storage_conn_id = storage_conn_id

    def get_storage(self) -> JobStorage:
        """The job's storage, the connection applied (:func:`~.storage.config.storage_location`)."""
        return job_storage(self.job_id, self.storage_root, self.storage_conn_id)

    def new_input(self, sources: Sequence[Source]) -> list[str]:
        """Uids of the sources holding input beyond the latest completed checkpoint's positions.

        A pending restore request counts as input for every source: the next checkpoint
        restores, whatever the sources hold.
        """
        storage = self.get_storage()
        if JobRecordStore(storage).load_restore_request() is not None:
            return [s.uid for s in sources]
        latest = CompletedCheckpointStore(storage).latest_completed()
        positions = latest.source_positions if latest else {}
        found = []
        for source in sources:
            previous = positions.get(source.uid) or source.initial_position()
            if source.new_input(previous):
                found.append(source.uid)
        return found

    def committed_after(self, after_checkpoint_id: int, savepoint: bool = False) -> JsonDict | None:
        """The newest checkpoint (or savepoint) of the job newer than ``after_checkpoint_id``
        whose sinks are committed, as ``{"checkpoint_id", "end_time"[, "savepoint"]}``; else ``None``.

        A checkpoint counts once its statistics say ``COMPLETED``: these are written after
        the sink commit, so a reader sees the checkpoint's output in the tables.
        """
        storage = self.get_storage()
        if savepoint:
            newer = [
                sp for sp in JobRecordStore(storage).load().savepoints if int(sp["checkpoint_id"]) > after_checkpoint_id
            ]
            if not newer:
                return None
            latest = max(newer, key=lambda sp: int(sp["checkpoint_id"]))
            return {"checkpoint_id": int(latest["checkpoint_id"]), "savepoint": str(latest["path"])}
        for checkpoint_id in reversed(CompletedCheckpointStore(storage).completed_ids()):
            if checkpoint_id <= after_checkpoint_id:
                return None
            row = stats.history_row(StatsStore(storage).load(checkpoint_id))
            if row is not None and row["status"] == "COMPLETED":
                return {"checkpoint_id": checkpoint_id, "end_time": row["end_time"]}
        return None

    def latest_committed_id(self) -> int:
        """Id of the newest completed checkpoint of the job (0 when there is none)."""
        ids = CompletedCheckpointStore(self.get_storage()).completed_ids()
        return ids[-1] if ids else 0
