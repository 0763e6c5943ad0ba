"""Builders for step contexts over real local storage."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.model import Barrier, CheckpointPlan, CheckpointType
from airflow_provider_checkpoint.spark.context import StepContext
from airflow_provider_checkpoint.storage import JobStorage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def step_context(spark: SparkSession, storage: JobStorage, checkpoint_id: int, attempt: int = 1) -> StepContext:
    plan = CheckpointPlan(
        job_id=storage.job_id,
        run_id=f"run-{checkpoint_id}",
        barrier=Barrier(checkpoint_id, time.time(), CheckpointType.CHECKPOINT, {}),
        steps=("step",),
        timeout_seconds=600,
    )
    return StepContext(spark, storage, plan, "step", attempt)
