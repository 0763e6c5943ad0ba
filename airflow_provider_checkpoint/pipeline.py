"""``CheckpointedPipeline``: declare sources, operators and sinks; get an ordinary Airflow DAG.

::

    with CheckpointedPipeline(dag_id="clickstream", schedule="*/10 * * * *") as pipeline:
        events = FileSource(uid="events", path="/data/landing", format="json", schema=SCHEMA)
        views = KeyedAggregate(uid="page_views", input=events, keys=["page"], aggs={"views": "count"})
        ParquetTableSink(uid="page_views_table", input=views, path="/data/marts/page_views",
                         mode="upsert", keys=["page"])

builds ``trigger_checkpoint >> <one task per step> >> finalize_checkpoint`` with
``max_active_runs=1``: one DAG run is one checkpoint. With ``chain=True`` a pipeline
that plans into one step gets a single ``checkpoint`` task instead.
"""

from __future__ import annotations

import datetime
import sys
from contextlib import ExitStack
from typing import Any

from airflow.sdk import DAG, Param

from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow.defaults import SourceDefaults
from airflow_provider_checkpoint.dataflow.graph import Node, collecting
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError
from airflow_provider_checkpoint.jobs.definition import CheckpointJob
from airflow_provider_checkpoint.operators.chained import ChainedCheckpointOperator
from airflow_provider_checkpoint.operators.checkpoint import (
    CheckpointFinalizeOperator,
    CheckpointTriggerOperator,
    SparkCheckpointOperator,
)
from airflow_provider_checkpoint.storage.config import default_storage_root

TRIGGER_TASK_ID = "trigger_checkpoint"
WAIT_FOR_INPUT_TASK_ID = "wait_for_input"
FINALIZE_TASK_ID = "finalize_checkpoint"
CHAINED_TASK_ID = "checkpoint"


def savepoint_params() -> dict[str, Param]:
    """The savepoint fields of every pipeline's trigger form."""
    return {
        "savepoint": Param(
            False,
            type=["boolean", "null"],  # Airflow's form marks a Param required unless null is allowed
            title="Take a savepoint",
            description="Write a self-contained, relocatable savepoint of this checkpoint. "
            "Savepoints are never deleted by retention.",
        ),
        "savepoint_dir": Param(
            None,
            type=["null", "string"],
            title="Savepoint directory",
            description="Where to write the savepoint (a new savepoint-* directory is created inside). "
            "Must lie under [checkpoint] savepoint_roots or the storage root; empty means the first "
            "savepoint root.",
        ),
        "stop_after_savepoint": Param(
            False,
            type=["boolean", "null"],  # Airflow's form marks a Param required unless null is allowed
            title="Stop after the savepoint",
            description="Set the job STOPPED once the savepoint is written: scheduled runs are skipped "
            "until the job is restored (the restore_from_checkpoint DAG or 'airflow checkpoints restore').",
        ),
    }


class CheckpointedPipeline:
    """A DAG whose every run is one checkpoint of ``job_id`` (default: the ``dag_id``).

    ``storage`` is the storage root URL (default ``[checkpoint] storage_root``);
    ``step_retries`` Airflow retries protect each Spark step, ``finalize_retries`` the
    finalize task (its commit is idempotent). ``spark_conn_id`` (default ``[checkpoint]
    spark_conn_id``) names the Spark provider connection the steps run through: type
    ``spark`` submits each step with spark-submit, ``spark_connect`` runs it on a Spark
    Connect server; without one, each step runs an embedded local session.

    ``checkpoint_storage="memory"`` keeps all keyed state inline in acks and ``_metadata``
    (declining above ``max_state_size`` bytes per operator); with the default
    ``"filesystem"`` only state up to ``inline_state_threshold`` bytes is inline, and with
    ``incremental_state`` (the default) a checkpoint writes only the keys that changed,
    compacting key-group ranges as their changes accumulate. A ``KeyedAggregate`` state of up
    to ``driver_merge_rows`` rows is merged on the Spark driver with pyarrow (one Spark job
    per checkpoint; ``0``: always in Spark), see ``docs/concepts.md``.

    ``wait_for_input`` puts a :class:`CheckpointInputSensor` (``soft_fail``, this timeout)
    in front of the trigger: a run whose sources hold no new input within it is skipped
    (no checkpoint, no failure counted) instead of producing an empty checkpoint. Other
    keyword arguments go to ``DAG``.

    ``chain=True`` runs trigger, step and finalize of a pipeline that plans into one
    step in one task (:class:`~airflow_provider_checkpoint.operators.chained.ChainedCheckpointOperator`,
    ``step_retries`` retries, each cutting a new barrier); a pipeline of more steps is
    refused at DAG-parse time.

    ``check_versions`` (default ``True``): before the first checkpoint of every new version of the
    pipeline's definition, the trigger builds every step's Spark plan on empty input and resolves
    every sink's input against its existing table, and refuses the checkpoint with the problems
    it finds (``airflow checkpoints check`` runs the same check; see ``docs/writing-a-pipeline.md``).

    ``on_malformed`` (``"fail"`` or ``"dead_letter"``) and ``max_malformed_fraction``
    (default 0.5) are the defaults of every source that sets none (see
    :class:`~airflow_provider_checkpoint.connectors.files.source.FileSource`); dead letters go to
    one table per source at ``<dead_letter_path>/<source uid>``, by default
    ``<storage>/<job_id>/dead_letters`` (with ``storage_conn_id`` there is no default: name one).
    """

    def __init__(
        self,
        dag_id: str,
        *,
        job_id: str | None = None,
        storage: str | None = None,
        storage_conn_id: str | None = None,
        retained_checkpoints: int | None = None,
        checkpoint_timeout: datetime.timedelta = datetime.timedelta(hours=1),
        tolerable_failed_checkpoints: int = 3,
        min_pause_between_checkpoints: datetime.timedelta = datetime.timedelta(0),
        step_retries: int = 2,
        finalize_retries: int = 1,
        retry_delay: datetime.timedelta = datetime.timedelta(seconds=10),
        spark_conf: dict[str, str] | None = None,
        checkpoint_storage: str = "filesystem",
        inline_state_threshold: int = 20 << 10,
        max_state_size: int = 5 << 20,
        incremental_state: bool = True,
        driver_merge_rows: int = CheckpointSettings.driver_merge_rows,
        spark_conn_id: str | None = None,
        wait_for_input: datetime.timedelta | None = None,
        on_malformed: str = "fail",
        max_malformed_fraction: float = 0.5,
        dead_letter_path: str | None = None,
        chain: bool = False,
        check_versions: bool = True,
        **dag_kwargs: Any,
    ) -> None:
        if retained_checkpoints is not None and retained_checkpoints < 1:
            raise ValueError(f"{dag_id}: retained_checkpoints must be at least 1, got {retained_checkpoints}")
        dag_kwargs.setdefault("start_date", datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
        dag_kwargs.setdefault("catchup", False)
        dag_kwargs.setdefault("tags", ["checkpoint"])
        dag_kwargs["max_active_runs"] = 1
        dag_kwargs["params"] = {**savepoint_params(), **dag_kwargs.get("params", {})}
        self.dag = DAG(dag_id, **dag_kwargs)
        # the file that declares the pipeline, not this module: spark-submit drivers load it
        self.dag.fileloc = sys._getframe(1).f_code.co_filename
        self.job_id = job_id or dag_id
        self.storage = storage
        self.storage_conn_id = storage_conn_id
        self.settings = CheckpointSettings(
            retained_checkpoints=retained_checkpoints,
            checkpoint_timeout_seconds=checkpoint_timeout.total_seconds(),
            tolerable_failed_checkpoints=tolerable_failed_checkpoints,
            min_pause_between_checkpoints_seconds=min_pause_between_checkpoints.total_seconds(),
            checkpoint_storage=checkpoint_storage,
            inline_state_threshold=inline_state_threshold,
            max_state_size=max_state_size,
            incremental_state=incremental_state,
            driver_merge_rows=driver_merge_rows,
        )
        self.step_retries = step_retries
        self.finalize_retries = finalize_retries
        self.retry_delay = retry_delay
        self.spark_conf = dict(spark_conf or {})
        self.spark_conn_id = spark_conn_id
        self.wait_for_input = wait_for_input
        self.chain = chain
        self.check_versions = check_versions
        if dead_letter_path is None and storage_conn_id is None:
            dead_letter_path = f"{(storage or default_storage_root()).rstrip('/')}/{self.job_id}/dead_letters"
        self.source_defaults = SourceDefaults(on_malformed, max_malformed_fraction, dead_letter_path)
        self.job: CheckpointJob | None = None
        self._stack = ExitStack()
        self._nodes: list[Node] = []

    def __enter__(self) -> CheckpointedPipeline:
        self._stack.enter_context(self.dag)
        self._nodes = self._stack.enter_context(collecting())
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                self._build()
        finally:
            self._stack.__exit__(exc_type, exc, tb)

    def _build(self) -> None:
        graph = PipelineGraph(self._nodes, self.source_defaults)
        self.job = CheckpointJob(
            job_id=self.job_id,
            graph=graph,
            storage_root=self.storage,
            storage_conn_id=self.storage_conn_id,
            settings=self.settings,
            spark_conf=self.spark_conf,
            dag_id=self.dag.dag_id,
            spark_conn_id=self.spark_conn_id,
            check_versions=self.check_versions,
        )
        first = self._chained_task(graph) if self.chain else self._tasks(graph)
        if self.wait_for_input is not None:
            from airflow_provider_checkpoint.sensors.checkpoint import CheckpointInputSensor

            seconds = self.wait_for_input.total_seconds()
            sensor = CheckpointInputSensor(
                task_id=WAIT_FOR_INPUT_TASK_ID,
                job=self.job,
                timeout=seconds,
                poke_interval=min(30.0, max(1.0, seconds / 10)),
                soft_fail=True,
                retries=0,
            )
            sensor >> first

    def _tasks(self, graph: PipelineGraph) -> CheckpointTriggerOperator:
        """``trigger >> steps >> finalize``; returns the trigger."""
        assert self.job is not None
        trigger = CheckpointTriggerOperator(task_id=TRIGGER_TASK_ID, job=self.job, retries=0)
        steps = [
            SparkCheckpointOperator(
                task_id=name,
                job=self.job,
                step=name,
                trigger_task_id=TRIGGER_TASK_ID,
                retries=self.step_retries,
                retry_delay=self.retry_delay,
            )
            for name in graph.steps
        ]
        finalize = CheckpointFinalizeOperator(
            task_id=FINALIZE_TASK_ID,
            job=self.job,
            trigger_task_id=TRIGGER_TASK_ID,
            step_task_ids=[s.task_id for s in steps],
            retries=self.finalize_retries,
            retry_delay=self.retry_delay,
        )
        trigger >> steps >> finalize
        tasks = {s.task_id: s for s in steps}
        for step in steps:
            for upstream in graph.upstream_steps(step.task_id):
                tasks[upstream] >> step
        return trigger

    def _chained_task(self, graph: PipelineGraph) -> ChainedCheckpointOperator:
        """The one task of a chained single-step pipeline."""
        assert self.job is not None
        if len(graph.steps) != 1:
            raise PipelineDefinitionError(
                f"pipeline {self.dag.dag_id}: chain=True needs a pipeline that plans into one step, this one plans "
                f"into {len(graph.steps)} ({', '.join(graph.steps)}); drop chain=True or split the pipeline"
            )
        return ChainedCheckpointOperator(
            task_id=CHAINED_TASK_ID,
            job=self.job,
            step=next(iter(graph.steps)),
            retries=self.step_retries,
            retry_delay=self.retry_delay,
        )
