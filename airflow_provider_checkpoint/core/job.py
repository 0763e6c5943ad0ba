"""The job record (``_job.json``): id counter, status and failure accounting of one job."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from airflow_provider_checkpoint.core.failures import FailureAccounting, JobStatus
from airflow_provider_checkpoint.core.model import JsonDict

JOB_FORMAT_VERSION = 1


class JobRecordError(ValueError):
    """``_job.json`` is unreadable or from an unsupported version."""


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

    def allocate_checkpoint_id(self) -> int:
        self.last_checkpoint_id += 1
        return self.last_checkpoint_id

    def resume(self) -> None:
        """Back to RUNNING with a clean failure count (a restore does this)."""
        self.status = JobStatus.RUNNING
        self.status_reason = ""
        self.failures = FailureAccounting(last_completed_id=self.failures.last_completed_id)

    def observe_checkpoint_id(self, checkpoint_id: int) -> None:
        """Never hand out an id at or below one that exists in storage."""
        self.last_checkpoint_id = max(self.last_checkpoint_id, checkpoint_id)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": JOB_FORMAT_VERSION,
                "job_id": self.job_id,
                "topology": self.topology,
                "status": self.status.value,
                "status_reason": self.status_reason,
                "last_checkpoint_id": self.last_checkpoint_id,
                "failures": self.failures.to_dict(),
                "savepoints": self.savepoints,
            },
            indent=1,
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, data: bytes, source: str = "_job.json") -> JobRecord:
        try:
            d = json.loads(data)
            if d.get("version") != JOB_FORMAT_VERSION:
                raise JobRecordError(f"{source}: unsupported job record version {d.get('version')!r}")
            return cls(
                job_id=str(d["job_id"]),
                topology=dict(d.get("topology", {})),
                status=JobStatus(d.get("status", "RUNNING")),
                status_reason=str(d.get("status_reason", "")),
                last_checkpoint_id=int(d.get("last_checkpoint_id", 0)),
                failures=FailureAccounting.from_dict(d.get("failures", {})),
                savepoints=list(d.get("savepoints", [])),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            if isinstance(e, JobRecordError):
                raise
            raise JobRecordError(f"{source}: unreadable job record ({e!r})") from e
