"""Why a checkpoint attempt did not complete, and the status of a job."""

from __future__ import annotations

import enum


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
