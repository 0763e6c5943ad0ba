"""Run a pipeline checkpoint by checkpoint in one process: the coordinator, every step, then finalize.

What the Airflow operators do, without Airflow: tests and benchmarks use it to drive the
real protocol over real files with one SparkSession. Channels are passed between steps
as the step operator passes them; a step that hits an injected fault is retried alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.coordinator import CheckpointCoordinator
from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan, CheckpointType, CompletedCheckpoint
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow.defaults import SourceDefaults
from airflow_provider_checkpoint.dataflow.graph import collecting
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.exceptions import InjectedFault
from airflow_provider_checkpoint.spark.runner import run_step
from airflow_provider_checkpoint.spark.session import SparkHandle
from airflow_provider_checkpoint.storage import JobStorage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T0 = 1_800_000_000.0
"""Barrier time of checkpoint 0; checkpoint n is triggered at ``T0 + 100 n`` (deterministic TTLs)."""


@dataclass
class Job:
    """A pipeline run checkpoint by checkpoint in-process: the coordinator, then every step, then finalize."""

    spark: SparkSession | SparkHandle
    """The steps' session, or a handle of it: then each step run gets its own handle of the same session
    (:meth:`SparkHandle.again`), started only if that step needs it (:attr:`started`)."""
    tmp: Path
    graph: PipelineGraph
    storage: JobStorage
    coordinator: CheckpointCoordinator
    checkpoints: int = 0
    step_runs: list[tuple[int, str, int]] = field(default_factory=list)
    timings: list[dict[str, float]] = field(default_factory=list)
    """Per checkpoint: seconds spent in trigger, steps and finalize."""
    started: dict[tuple[int, str], bool] = field(default_factory=dict)
    """With a :class:`SparkHandle`: whether the step (checkpoint id, step) needed the session (its last attempt)."""
    plan: CheckpointPlan | None = None
    """The last checkpoint triggered (a test aborts it after a step that failed for good)."""

    def checkpoint(
        self,
        during: Callable[[], None] | None = None,
        savepoint_target: str | None = None,
        now: float | None = None,
    ) -> CompletedCheckpoint:
        """One checkpoint, steps in dependency order, channels passed on as the operator does.

        ``during`` lands files after the barrier is cut, before the steps read. A step that
        hits an injected fault (``CHECKPOINT_FAULTS``) is retried alone, as Airflow would.
        ``savepoint_target`` makes it a savepoint written there. ``now`` (seconds) is its trigger
        time instead of ``T0 + 100 n`` (a test that follows another engine's clock).
        """
        self.checkpoints += 1
        now = T0 + 100 * self.checkpoints if now is None else now
        started = time.perf_counter()
        if savepoint_target:
            plan = self.coordinator.trigger(
                f"run-{self.checkpoints}", CheckpointType.SAVEPOINT, now, {"savepoint_target": savepoint_target}
            )
        else:
            plan = self.coordinator.trigger(f"run-{self.checkpoints}", now=now)
        self.plan, triggered = plan, time.perf_counter()
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
                session = self.spark.again() if isinstance(self.spark, SparkHandle) else self.spark
                try:
                    acks[step] = run_step(
                        session, self.storage, self.graph, step, plan, attempt, channels, self.coordinator.settings
                    )
                    break
                except InjectedFault:
                    continue
                finally:
                    if isinstance(session, SparkHandle):
                        self.started[(plan.checkpoint_id, step)] = session.started
        stepped = time.perf_counter()
        completed = self.coordinator.finalize(plan, list(acks.values()), now=now + 1)
        self.timings.append(
            {
                "trigger": triggered - started,
                "steps": stepped - triggered,
                "finalize": time.perf_counter() - stepped,
            }
        )
        return completed


def make_job(
    spark: SparkSession | SparkHandle,
    tmp: Path,
    declare: Callable[[Path], None],
    defaults: SourceDefaults | None = None,
    **settings: Any,
) -> Job:
    """A job over ``tmp`` of the pipeline ``declare`` declares, its sources taking ``defaults``."""
    with collecting() as nodes:
        declare(tmp)
    graph = PipelineGraph(nodes, defaults)
    storage = JobStorage.for_job(f"file://{tmp}/ckpt", "multi")
    config = CheckpointSettings(**{"retained_checkpoints": 10, **settings})
    roots = [storage.url(), f"file://{tmp}/savepoints"]
    return Job(spark, tmp, graph, storage, CheckpointCoordinator(storage, graph, config, None, roots))
