"""What a running step knows: its Spark session (started on first use), storage, plan and attempt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.model import CheckpointPlan, JsonDict
from airflow_provider_checkpoint.storage import JobStorage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_provider_checkpoint.dataflow.driver_rows import DriverRows
    from airflow_provider_checkpoint.spark.session import SparkHandle


@dataclass
class StepContext:
    """One attempt of one step of one checkpoint.

    Everything the attempt writes lies under ``attempt_dir`` (job-relative) or, for
    sinks, under a staging path named after the same checkpoint, step and attempt, so a
    retry never mixes files with an earlier attempt.
    """

    session: SparkHandle
    """The step's Spark session, started the first time :attr:`spark` is used."""
    storage: JobStorage
    plan: CheckpointPlan
    step: str
    attempt: int
    metrics: JsonDict = field(default_factory=dict)
    in_driver: dict[str, DriverRows] = field(default_factory=dict)
    """By node uid: the output rows this attempt also holds in the driver (see :mod:`.driver_rows`)."""
    output_rows: dict[str, int] = field(default_factory=dict)
    """By node uid: how many rows its output has, where the attempt knows it without a Spark job."""
    unchanged: dict[str, object] = field(default_factory=dict)
    """By source uid: the range this attempt checked unchanged since the barrier (a file source: its files' names
    and sizes, by one listing), so another read of it (Spark's, after the driver's declined) checks it no more."""

    @property
    def spark(self) -> SparkSession:
        """The step's Spark session (started now if it was not: a step that reads and merges on the driver
        never asks)."""
        return self.session.get()

    @property
    def checkpoint_id(self) -> int:
        return self.plan.checkpoint_id

    @property
    def attempt_dir(self) -> str:
        return self.storage.attempt_dir(self.checkpoint_id, self.step, self.attempt)

    @property
    def attempt_tag(self) -> str:
        """Unique name of this attempt, for staging areas outside the job directory."""
        return f"{self.storage.job_id}/{self.step}/attempt-{self.attempt}"

    def add_metric(self, name: str, value: int) -> None:
        self.metrics[name] = int(self.metrics.get(name, 0)) + value
