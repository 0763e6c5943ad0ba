"""The job record (``_job.json``): id counter, status and failure accounting of one job."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_checkpoint.core.documents import JOB_ID, MAX_ID, Fields, JsonDict, enum_value, load_json
from airflow_provider_checkpoint.core.failures import FailureAccounting
from airflow_provider_checkpoint.core.status import AbortReason, JobStatus
from airflow_provider_checkpoint.exceptions import DocumentError, JobRecordError

JOB_FORMAT_VERSION = 1
HOUSEKEEPING_DUE = 10
"""How many checkpoints' failed housekeeping a job record keeps per sink, to run again."""


@dataclass
class JobRecord:
    """Durable facts about a job that outlive any single checkpoint.

    ``last_checkpoint_id`` is the id counter: ids are allocated from it and it only grows,
    so an id is never reused, not after a failure and not after a restore.
    """

    job_id: str
    topology: JsonDict = field(default_factory=dict)
    status: JobStatus = JobStatus.RUNNING
    status_reason: str = ""
    last_checkpoint_id: int = 0
    failures: FailureAccounting = field(default_factory=FailureAccounting)
    savepoints: list[JsonDict] = field(default_factory=list)
    checked_version: str = ""
    """The version of the pipeline's definition that last passed the pipeline check ("": none yet)."""
    housekeeping: dict[str, list[int]] = field(default_factory=dict)
    """Sink uid → the checkpoints whose housekeeping after the commit failed (a Delta log checkpoint, the deletion
    of other attempts' files), run again after the next checkpoint's commit; at most :data:`HOUSEKEEPING_DUE`
    each, the newest (the storage audit reports what older ones left)."""

    def allocate_checkpoint_id(self) -> int:
        self.last_checkpoint_id += 1
        return self.last_checkpoint_id

    def resume(self) -> None:
        """Back to RUNNING with a clean failure count (a restore does this)."""
        self.status = JobStatus.RUNNING
        self.status_reason = ""
        self.failures = FailureAccounting(last_completed_id=self.failures.last_completed_id)

    def count_failure(self, checkpoint_id: int, reason: AbortReason, message: str, tolerable: int) -> bool:
        """Account for an aborted checkpoint; past ``tolerable`` counted failures the job is FAILED.

        Returns whether the abort counted as a failure.
        """
        counted = self.failures.on_abort(checkpoint_id, reason)
        if counted and self.failures.exceeds(tolerable):
            self.status = JobStatus.FAILED
            self.status_reason = (
                f"{self.failures.count} failed checkpoints (ids {self.failures.failed_ids}) exceed "
                f"tolerable_failed_checkpoints={tolerable}; last: {message}"
            )
        return counted

    def record_savepoint(self, entry: JsonDict, stop: bool) -> None:
        """List savepoint ``entry`` (``checkpoint_id``, ``path``, ``time``, maybe ``sinks``) once; ``stop``:
        the job is STOPPED with it (stop-with-savepoint)."""
        checkpoint_id = entry["checkpoint_id"]
        if any(sp["checkpoint_id"] == checkpoint_id for sp in self.savepoints):
            return
        self.savepoints.append(entry)
        if stop:
            self.status = JobStatus.STOPPED
            self.status_reason = f"stopped with savepoint {entry['path']} (checkpoint {checkpoint_id})"

    def observe_checkpoint_id(self, checkpoint_id: int) -> None:
        """Never hand out an id at or below one that exists in storage."""
        self.last_checkpoint_id = max(self.last_checkpoint_id, checkpoint_id)

    def keep_housekeeping(self, due: Mapping[str, Iterable[int]]) -> None:
        """Set :attr:`housekeeping` to ``due`` (sink uid → checkpoint ids), the newest :data:`HOUSEKEEPING_DUE` ids
        of each sink."""
        self.housekeeping = {uid: sorted(set(ids))[-HOUSEKEEPING_DUE:] for uid, ids in sorted(due.items()) if ids}

    def encode(self) -> bytes:
        housekeeping = {"housekeeping": self.housekeeping} if self.housekeeping else {}
        return json.dumps(
            {
                **housekeeping,
                "version": JOB_FORMAT_VERSION,
                "job_id": self.job_id,
                "topology": self.topology,
                "status": self.status.value,
                "status_reason": self.status_reason,
                "last_checkpoint_id": self.last_checkpoint_id,
                "failures": self.failures.to_dict(),
                "savepoints": self.savepoints,
                "checked_version": self.checked_version,
            },
            indent=1,
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, data: bytes, source: str = "_job.json") -> JobRecord:
        """Parse and validate a job record; every problem is a :class:`JobRecordError`."""
        try:
            f = Fields(load_json(data, source), source)
            if f.raw.get("version") != JOB_FORMAT_VERSION:
                raise f.error(
                    "version",
                    f"is not a job record version this provider reads ({JOB_FORMAT_VERSION})",
                    f.raw.get("version"),
                )
            topology = f.obj("topology", default={})
            topology.mapping("nodes", lambda v, name: Fields(v, source, name).raw, default={})
            topology.text("dag_id", max_length=250, default=None)
            return cls(
                job_id=f.string("job_id", JOB_ID),
                topology=topology.raw,
                status=enum_value(JobStatus, f, "status", default="RUNNING"),
                status_reason=f.text("status_reason", default=""),
                last_checkpoint_id=f.integer("last_checkpoint_id", default=0),
                failures=FailureAccounting.from_dict(f.raw.get("failures", {}), source, "failures"),
                savepoints=f.each("savepoints", _savepoint_entry(source), default=[]),
                checked_version=f.text("checked_version", max_length=64, default=""),
                housekeeping=f.mapping("housekeeping", _checkpoint_ids(source), default={}),
            )
        except DocumentError as e:
            raise JobRecordError(str(e)) from None


def _checkpoint_ids(source: str) -> Callable[[Any, str], list[int]]:
    def read(value: Any, name: str) -> list[int]:
        if not (isinstance(value, list) and len(value) <= HOUSEKEEPING_DUE and all(_is_id(i) for i in value)):
            problem = f"must be a list of at most {HOUSEKEEPING_DUE} checkpoint ids (integers in [1, {MAX_ID}])"
            raise DocumentError(source, name, problem, value)
        return list(value)

    return read


def _is_id(value: Any) -> bool:
    return type(value) is int and 1 <= value <= MAX_ID


def _savepoint_entry(source: str) -> Callable[[Any, str], JsonDict]:
    def read(value: Any, name: str) -> JsonDict:
        f = Fields(value, source, name)
        entry = {"checkpoint_id": f.integer("checkpoint_id", 1), "path": f.text("path"), "time": f.timestamp("time")}
        sinks = f.mapping("sinks", _sink_commit(source), default={})
        return {**entry, "sinks": sinks} if sinks else entry

    return read


def _sink_commit(source: str) -> Callable[[Any, str], JsonDict]:
    """What a sink recorded about its commit (``Sink.describe_commit``): an object of short scalars."""

    def read(value: Any, name: str) -> JsonDict:
        f = Fields(value, source, name)
        for key, item in f.raw.items():
            if not isinstance(item, (int, float, str, bool)) or len(str(item)) > 256:
                raise f.error(key, "must be a number, a string of at most 256 characters or a boolean", item)
        return dict(f.raw)

    return read
