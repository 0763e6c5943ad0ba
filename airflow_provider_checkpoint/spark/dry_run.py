"""The pipeline check: a dry run of every step on empty input, before a version's first checkpoint.

Every step walks its nodes as a checkpoint does (:class:`~.runner.StepWalk`, the same dispatch and the
same transforms and unions), but over empty input: a source gives its columns without records
(:meth:`~airflow_provider_checkpoint.dataflow.graph.Source.empty`), a stateful operator runs its
``process`` from its initial (empty) state, a channel hands its columns to the steps that read it,
and a sink resolves its input's columns against its existing target
(:meth:`~airflow_provider_checkpoint.dataflow.graph.Sink.check_input`). Each node's output is
analysed (``DataFrame.schema``), so Spark resolves every column and type. No record is read and nothing is
written (no state, no staged output, no claim, no table created); the only Spark jobs are those an
operator's ``process`` runs itself, over the empty input (``IntervalJoin`` reads its watermarks).

A problem names the node's uid, what Spark or the target refused (the exception's type and error
class, and its first non-empty line: :func:`~airflow_provider_checkpoint.core.reasons.reason`), and a
fix. A node whose input could not be built is not checked (its upstream's problem is reported), nor
one whose target cannot be reached now (``OSError``: a server down, a network error): the step meets
that, with its retries, and still refuses input its target does not fit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.event_time import WatermarkProgress
from airflow_provider_checkpoint.core.model import Barrier, CheckpointType
from airflow_provider_checkpoint.core.reasons import reason
from airflow_provider_checkpoint.dataflow.channel import Channel
from airflow_provider_checkpoint.dataflow.graph import Node, Sink, Source, Transform, Union
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError, SinkClaimedError
from airflow_provider_checkpoint.spark.runner import StepWalk

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_provider_checkpoint.dataflow.planner import PipelineGraph

log = logging.getLogger(__name__)

_SPARK_ERROR_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


@dataclass(frozen=True)
class Problem:
    """One problem of a pipeline: the node (``uid``), what is wrong, and how to fix it; none is blank."""

    uid: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.uid}: {self.message} (fix: {self.fix})"


def _columns(df: DataFrame | None) -> str:
    return f"<{df.schema.simpleString()[7:-1]}>" if df is not None else "<unknown>"


class _DryRun(StepWalk):
    """One step of the check: its nodes over empty input; each refusal becomes a :class:`Problem`."""

    def __init__(
        self,
        spark: SparkSession,
        graph: PipelineGraph,
        step: str,
        job_id: str,
        channels: MutableMapping[str, StructType],
    ) -> None:
        super().__init__()
        self.spark, self.graph, self.step, self.job_id, self.channels = spark, graph, step, job_id, channels
        self.barrier = Barrier(1, time.time(), CheckpointType.CHECKPOINT, {})
        self.problems: list[Problem] = []
        self.unchecked: list[str] = []

    def run(self, node: Node) -> None:
        """Run ``node`` and analyse its output; a node missing an input (its upstream failed) is skipped."""
        read = isinstance(node, Channel) and self.graph.channel_steps[node.uid] != self.step  # another step's
        if any(n.uid not in self.outputs for n in node.inputs) and not read:
            self.unchecked.append(node.uid)
            return
        try:
            super().run(node)
            if node.uid in self.outputs:
                self.outputs[node.uid].schema  # noqa: B018  # Spark Connect analyses only when asked
        except OSError as e:  # a target out of reach now (a server down): the step meets it, and retries
            log.warning("%s %s not checked: %s", node.kind, node.uid, reason(e))
            self.unchecked.append(node.uid)
        except Exception as e:
            self.problems.append(Problem(node.uid, reason(e), self._fix(node, e)))

    def source(self, node: Source) -> None:
        df = node.empty(self.spark)
        if df is None:
            log.info("source %s (%s) cannot give its columns before reading", node.uid, type(node).__name__)
            self.unchecked.append(node.uid)
        else:
            self.outputs[node.uid] = df

    def stateful(self, node: StatefulOperator) -> None:
        inputs = self.inputs_of(node)
        state = node.initial_state(self.spark, inputs)
        timed = node.event_time(inputs, WatermarkProgress(), self.barrier)
        if timed is None:
            new_state, output = node.process(inputs, state, self.barrier)
        else:  # as a step runs it (state.checkpointing.checkpoint_operator)
            new_state, output = node.process_at(inputs, state, self.barrier, WatermarkProgress(), timed[0])
        missing = [k for k in node.keys if k not in new_state.columns]
        if missing:
            raise PipelineDefinitionError(f"its new state {_columns(new_state)} has no key column(s) {missing}")
        self.outputs[node.uid] = output

    def channel(self, node: Channel) -> None:
        if self.graph.channel_steps[node.uid] == self.step:
            self.channels[node.uid] = self.input_of(node).schema
            self.outputs[node.uid] = self.input_of(node)
        elif node.uid in self.channels:  # else its producer failed: what reads it is not checked
            self.outputs[node.uid] = self.spark.createDataFrame([], self.channels[node.uid])

    def sink(self, node: Sink) -> None:
        node.bind_job(self.job_id)
        with node.storage_errors():
            node.check_input(self.input_of(node))

    def _fix(self, node: Node, error: Exception) -> str:
        """How to fix ``error`` of ``node``, naming the columns its input has."""
        given = [self.outputs.get(n.uid) for n in node.inputs]
        columns = ", ".join(f"{n.uid} {_columns(df)}" for n, df in zip(node.inputs, given, strict=True))
        if isinstance(node, Source):
            return (
                "declare a schema Spark parses (DDL such as 'user STRING, ts LONG') and a source the check can "
                "reach (path, table or connection)"
            )
        if isinstance(node, Transform):
            return f"make the transform's function use only the columns and types of its input {columns}"
        if isinstance(node, Union):
            return "give every input the same columns and types (select and cast them in a Transform before the union)"
        if isinstance(node, StatefulOperator):
            return f"name keys and columns its input has ({columns}), and a state that holds the keys"
        if isinstance(error, SinkClaimedError):
            return "write to a target no other job or sink writes, or keep the uid and layout that claimed it"
        if isinstance(node, Sink):
            return (
                f"make the input {columns} match the target's columns (a Transform before the sink selects, "
                "renames or casts them), or write to a new target"
            )
        return f"check the definition of {node.uid} against its input {columns}"


@contextmanager
def _spark_errors_unlogged() -> Iterator[None]:
    """PySpark logs every analysis error with its JVM stack trace; the check reports each as a problem instead."""
    from pyspark.logger import PySparkLogger

    # PySpark's own class: a plain logger created under these names first would take PySpark's
    # keyword arguments (file=, line=, ...) later and fail every analysis error with a TypeError
    loggers = [PySparkLogger.getLogger(name) for name in _SPARK_ERROR_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def check_graph(spark: SparkSession, graph: PipelineGraph, job_id: str) -> list[Problem]:
    """Every problem of ``graph`` (job ``job_id``) the check finds: each step's plans over empty input, in step
    order (a channel's columns reach the steps that read it); empty when clean. What the definition shows
    without Spark was checked when the graph was built (:mod:`~airflow_provider_checkpoint.dataflow.validation`)."""
    started = time.monotonic()
    problems: list[Problem] = []
    channels: dict[str, StructType] = {}
    unchecked: set[str] = set()
    with _spark_errors_unlogged():
        try:
            for step, nodes in graph.steps.items():
                walk = _DryRun(spark, graph, step, job_id, channels)
                for node in nodes:
                    walk.run(node)
                problems += [p for p in walk.problems if p not in problems]
                unchecked.update(walk.unchecked)
        finally:
            spark.catalog.clearCache()
    log.info(
        "pipeline check of job %s: %d step(s), %d node(s), %d problem(s)%s in %.2fs",
        job_id,
        len(graph.steps),
        len(graph.nodes),
        len(problems),
        f", not checked: {', '.join(sorted(unchecked))}" if unchecked else "",
        time.monotonic() - started,
    )
    return problems
