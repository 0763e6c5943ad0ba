"""The tolerable-failure accounting of a job (Flink's CheckpointFailureManager)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_provider_checkpoint.core.documents import Fields, JsonDict
from airflow_provider_checkpoint.core.status import AbortReason


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
    def from_dict(cls, d: Any, document: str = "failures", where: str = "") -> FailureAccounting:
        f = Fields(d, document, where)
        failed = f.each("failed_ids", lambda v, name: Fields({"i": v}, document, name).integer("i"), default=[])
        return cls(f.integer("last_completed_id", default=0), failed)
