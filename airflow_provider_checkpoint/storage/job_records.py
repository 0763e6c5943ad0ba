"""The job-level documents of one job: its record (``_job.json``), the pending restore request
(``_restore.json``) and the in-flight lease (``_lease``).

The lease is an exclusive create, so two triggers never both hold it; the record and the
request are replaced atomically.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable

from airflow_provider_checkpoint.core.documents import load_json
from airflow_provider_checkpoint.core.job_record import JobRecord
from airflow_provider_checkpoint.core.model import JsonDict, RestoreRequest
from airflow_provider_checkpoint.exceptions import CheckpointStorageError, DocumentError, JobRecordError, LeaseHeld
from airflow_provider_checkpoint.storage.job_storage import JOB_FILE, LEASE_FILE, RESTORE_REQUEST, JobStorage
from airflow_provider_checkpoint.storage.writes import create_exclusive


class JobRecordStore:
    """Reads and writes the record, the restore request and the lease of ``storage``'s job."""

    def __init__(self, storage: JobStorage) -> None:
        self.storage = storage
        self._stored: bytes | None = None
        """The record as this store last read or wrote it."""

    def load(self) -> JobRecord:
        data = self._stored = self.storage.read_if_present(JOB_FILE)
        if data is None:
            return JobRecord(job_id=self.storage.job_id)
        record = JobRecord.decode(data, self.storage.url(JOB_FILE))
        if record.job_id != self.storage.job_id:
            raise JobRecordError(
                f"{self.storage.url('_job.json')}: belongs to job {record.job_id!r}, not {self.storage.job_id!r}"
            )
        return record

    def save(self, record: JobRecord) -> None:
        """Replace the record with ``record``; nothing is written when it is what this store last read or wrote."""
        data = record.encode()
        if data != self._stored:
            self.storage.write_atomic(JOB_FILE, data)
            self._stored = data

    # -- restore request ---------------------------------------------------------------
    def load_restore_request(self) -> RestoreRequest | None:
        data = self.storage.read_if_present(RESTORE_REQUEST)
        if data is None:
            return None
        document = self.storage.url(RESTORE_REQUEST)
        try:
            return RestoreRequest.from_dict(load_json(data, document), document)
        except DocumentError as e:
            raise CheckpointStorageError(f"restore request refused: {e}; run the restore DAG again") from e

    def write_restore_request(self, request: RestoreRequest) -> None:
        self.storage.write_atomic(RESTORE_REQUEST, json.dumps(request.to_dict(), indent=1, sort_keys=True).encode())

    def clear_restore_request(self, request_id: str) -> None:
        """Remove the pending restore request if it is still ``request_id``."""
        current = self.load_restore_request()
        if current is not None and current.request_id == request_id:
            self.storage.delete_files([RESTORE_REQUEST])

    # -- lease -------------------------------------------------------------------------
    def acquire_lease(
        self,
        run_id: str,
        ttl_seconds: float,
        now: float | None = None,
        owner: JsonDict | None = None,
        holder_alive: Callable[[JsonDict], bool] | None = None,
    ) -> None:
        """Hold the job's in-flight lease for ``run_id``; re-entrant for the same run.

        The lease of another run is broken when it has expired, or when ``holder_alive``
        says that run is over (its checkpoint is then abandoned and cleaned up).
        """
        now = time.time() if now is None else now
        body = json.dumps(
            {**(owner or {}), "run_id": run_id, "acquired_at": now, "expires_at": now + ttl_seconds}
        ).encode()
        for _ in range(3):
            if create_exclusive(self.storage.fs, self.storage.path(LEASE_FILE), body):
                return
            holder = self.lease_holder()
            if holder is None:
                continue
            if holder.get("run_id") == run_id:
                self.storage.write_atomic(LEASE_FILE, body)
                return
            expired = float(holder.get("expires_at", math.inf)) <= now
            if not expired and (holder_alive is None or holder_alive(holder)):
                raise LeaseHeld(holder)
            self._break_lease(holder)
        raise LeaseHeld(self.lease_holder() or {})

    def _break_lease(self, holder: JsonDict) -> None:
        """Delete the lease only if it is still ``holder``'s (another trigger may have broken it)."""
        if self.lease_holder() == holder:
            self.storage.delete_files([LEASE_FILE])

    def lease_holder(self) -> JsonDict | None:
        data = self.storage.read_if_present(LEASE_FILE)
        if data is None:
            return None
        try:
            holder = load_json(data, self.storage.url(LEASE_FILE))
        except DocumentError:
            holder = None
        expires = holder.get("expires_at", math.inf) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or isinstance(expires, bool) or not isinstance(expires, int | float):
            # never break what we cannot read: it may be another trigger's lease
            return {"run_id": f"<unreadable lease; delete {self.storage.url('_lease')} if no checkpoint runs>"}
        return holder

    def release_lease(self, run_id: str) -> None:
        holder = self.lease_holder()
        if holder is not None and holder.get("run_id") == run_id:
            self.storage.delete_files([LEASE_FILE])
