"""Builders for step contexts over real local storage, and an in-process driver of whole checkpoints."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow.dataset as ds

from airflow_provider_checkpoint.coordinator import CheckpointCoordinator, CheckpointSettings
from airflow_provider_checkpoint.core.faults import InjectedFault
from airflow_provider_checkpoint.core.model import Ack, Barrier, CheckpointPlan, CheckpointType, CompletedCheckpoint
from airflow_provider_checkpoint.dataflow.graph import PipelineGraph, collecting
from airflow_provider_checkpoint.spark.context import StepContext
from airflow_provider_checkpoint.spark.runner import run_step
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


T0 = 1_800_000_000.0


@dataclass
class Job:
    """A pipeline run checkpoint by checkpoint in-process: the coordinator, then every step, then finalize."""

    spark: SparkSession
    tmp: Path
    graph: PipelineGraph
    storage: JobStorage
    coordinator: CheckpointCoordinator
    checkpoints: int = 0
    step_runs: list[tuple[int, str, int]] = field(default_factory=list)

    def checkpoint(self, during: Callable[[], None] | None = None) -> CompletedCheckpoint:
        """One checkpoint, steps in dependency order, channels passed on as the operator does.

        ``during`` lands files after the barrier is cut, before the steps read. A step that
        hits an injected fault (``CHECKPOINT_FAULTS``) is retried alone, as Airflow would.
        """
        self.checkpoints += 1
        now = T0 + 100 * self.checkpoints
        plan = self.coordinator.trigger(f"run-{self.checkpoints}", now=now)
        if during:
            during()
        acks: dict[str, Ack] = {}
        for step in plan.steps:
            channels = {
                uid: (acks[up].attempt_dir, channel)
                for up in self.graph.upstream_steps(step)
                for uid, channel in acks[up].channels.items()
            }
            for attempt in range(1, 4):
                self.step_runs.append((plan.checkpoint_id, step, attempt))
                try:
                    acks[step] = run_step(
                        self.spark, self.storage, self.graph, step, plan, attempt, channels, self.coordinator.settings
                    )
                    break
                except InjectedFault:
                    continue
        return self.coordinator.finalize(plan, list(acks.values()), now=now + 1)


def make_job(spark: SparkSession, tmp: Path, declare: Callable[[Path], None], **settings: Any) -> Job:
    with collecting() as nodes:
        declare(tmp)
    graph = PipelineGraph(nodes)
    storage = JobStorage.for_job(f"file://{tmp}/ckpt", "multi")
    config = CheckpointSettings(retained_checkpoints=10, **settings)
    roots = [storage.url(), f"file://{tmp}/savepoints"]
    return Job(spark, tmp, graph, storage, CheckpointCoordinator(storage, graph, config, None, roots))


def write_json(path: Path, rows: list[dict[str, Any]]) -> None:
    """Land ``rows`` as JSON Lines atomically (hidden name, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name("." + path.name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    path.with_name("." + path.name).rename(path)


def table(path: Path) -> pd.DataFrame:
    """A Parquet table as any reader sees it."""
    return ds.dataset(str(path), format="parquet").to_table().to_pandas() if path.exists() else pd.DataFrame()
