"""What the checkpoint coordinator tells observers (the provider's metrics) of its decisions."""

from __future__ import annotations

from typing import Protocol

from airflow_provider_checkpoint.core.model import CheckpointPlan, JsonDict


class CheckpointEvents(Protocol):
    """Told what the coordinator decided (the provider's metrics, :mod:`airflow_provider_checkpoint.metrics`);
    must never raise."""

    def triggered(self, plan: CheckpointPlan) -> None:
        """Checkpoint ``plan`` was planned: its barrier is cut and its id allocated."""

    def recorded(self, record: JsonDict) -> None:
        """The stats record of a completed or aborted checkpoint was written (once per checkpoint)."""
