"""Abort reasons and the tolerable-failure accounting of a job (Flink's CheckpointFailureManager)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from airflow_provider_checkpoint.core.model import JsonDict


class AbortReason(enum.StrEnum):
    """Why a checkpoint attempt did not complete."""

    DECLINED = "declined"
    EXPIRED = "expired"
    IO_ERROR = "io_error"
    CORRUPT_STATE = "corrupt_state"
    FINALIZE_FAILURE = "finalize_failure"
    SUBSUMED = "subsumed"
    TOO_MANY_CONCURRENT = "too_many_concurrent"
    MIN_PAUSE = "min_pause"
    JOB_NOT_RUNNING = "job_not_running"
    ABANDONED = "abandoned"

    @property
    def counts_as_failure(self) -> bool:
        """Whether this reason counts toward ``tolerable_failed_checkpoints``."""
        return self in _COUNTED


_COUNTED = frozenset(
    {
        AbortReason.DECLINED,
        AbortReason.EXPIRED,
        AbortReason.IO_ERROR,
        AbortReason.CORRUPT_STATE,
        AbortReason.FINALIZE_FAILURE,
        AbortReason.ABANDONED,
    }
)


class JobStatus(enum.StrEnum):
    RUNNING = "RUNNING"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


@dataclass
class FailureAccounting:
    """Counts failed checkpoints since the last success.

    Each checkpoint id counts once; ids not newer than the last completed checkpoint are
    ignored; a completed checkpoint resets the count. ``tolerable`` failures are allowed;
    the next one makes the job FAILED.
    """

    last_completed_id: int = 0
    failed_ids: list[int] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.failed_ids)

    def on_abort(self, checkpoint_id: int, reason: AbortReason) -> bool:
        """Record an abort; True if it was counted."""
        if not reason.counts_as_failure or checkpoint_id <= self.last_completed_id:
            return False
        if checkpoint_id in self.failed_ids:
            return False
        self.failed_ids.append(checkpoint_id)
        return True

    def on_complete(self, checkpoint_id: int) -> None:
        self.last_completed_id = max(self.last_completed_id, checkpoint_id)
        self.failed_ids = [i for i in self.failed_ids if i > self.last_completed_id]

    def exceeds(self, tolerable: int) -> bool:
        return self.count > tolerable

    def to_dict(self) -> JsonDict:
        return {"last_completed_id": self.last_completed_id, "failed_ids": list(self.failed_ids)}

    @classmethod
    def from_dict(cls, d: JsonDict) -> FailureAccounting:
        return cls(int(d.get("last_completed_id", 0)), [int(i) for i in d.get("failed_ids", [])])
