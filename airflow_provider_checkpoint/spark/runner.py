"""Runs one step of one checkpoint as a Spark job and returns its ack.

Given the same plan (restore point and barrier), a step produces the same state and
the same staged output on every attempt, so an Airflow retry is always safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.core.faults import fault_point
from airflow_provider_checkpoint.core.model import Ack, CheckpointPlan, JsonDict
from airflow_provider_checkpoint.core.settings import CheckpointSettings
from airflow_provider_checkpoint.dataflow.channel import Channel
from airflow_provider_checkpoint.dataflow.context import StepContext
from airflow_provider_checkpoint.dataflow.driver_rows import LazyFrame, SourceRows, frame_of
from airflow_provider_checkpoint.dataflow.graph import (
    Node,
    Sink,
    Source,
    Transform,
    Union,
)
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.exceptions import SinkSchemaError
from airflow_provider_checkpoint.spark.channels import read_channel, write_channel
from airflow_provider_checkpoint.spark.session import SparkHandle
from airflow_provider_checkpoint.spark.step_reads import StepReads, restored_position, step_reads
from airflow_provider_checkpoint.state.checkpointing import checkpoint_operator
from airflow_provider_checkpoint.state.driver_merge import within_driver_bounds
from airflow_provider_checkpoint.state.handles import ChannelSnapshot, OperatorSnapshot
from airflow_provider_checkpoint.state.ownership import restore_base
from airflow_provider_checkpoint.storage import JobStorage

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


log = logging.getLogger(__name__)


def describe_metrics(metrics: JsonDict) -> str:
    """``name value`` of every numeric metric (sizes in KiB/MiB, counts with thousands separators),
    for one concise log line."""
    parts = []
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if name.endswith(("_bytes", "_size")):
            parts.append(f"{name} {_size(value)}")
        else:
            parts.append(f"{name} {value:,}" if isinstance(value, int) else f"{name} {value:g}")
    return ", ".join(parts) or "nothing"


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            break
    return f"{n:.1f} {unit}"


class _Phases:
    """One log line per node of a step: what the step's metrics grew by while it ran, and its seconds."""

    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx
        self.node: Node | None = None
        self.started = 0.0
        self.before: dict[str, float] = {}

    def _numbers(self) -> dict[str, float]:
        return {k: v for k, v in self.ctx.metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}

    def next(self, node: Node | None) -> None:
        """End the running phase (log it) and start ``node``'s (``None``: the last one ended)."""
        if self.node is not None:
            grown = {k: v - self.before.get(k, 0) for k, v in self._numbers().items()}
            log.info(
                "%s %s: %s in %.2fs",
                self.node.kind,
                self.node.uid,
                describe_metrics({k: v for k, v in grown.items() if v}),
                time.monotonic() - self.started,
            )
        self.node, self.started, self.before = node, time.monotonic(), self._numbers()


def _count_records(ctx: StepContext, source: str, records: int) -> None:
    ctx.add_metric("records_in", records)
    ctx.metrics.setdefault("source_records", {})[source] = records
    ctx.metrics.setdefault("input_records", {})[source] = records


def _counts(metrics: JsonDict) -> dict[str, int]:
    return {k: v for k, v in metrics.items() if type(v) is int}


def _records_out(metrics: JsonDict) -> int:
    """Rows the step wrote to its sinks (dead letters included) and channels."""
    sinks = metrics.get("sinks", {})
    return sum(int(s["rows"]) for s in sinks.values()) + int(metrics.get("channel_rows_out", 0))


class StepWalk:
    """A walk over a step's nodes in order, each run by the method its kind names (:data:`RUNNERS`): the
    stateless nodes (transforms, unions) apply here; a subclass runs sources, stateful operators,
    channels and sinks (:class:`_StepRun` over the checkpoint's input, the pipeline check over empty input)."""

    def __init__(self) -> None:
        self.outputs: dict[str, DataFrame] = {}

    def run(self, node: Node) -> None:
        for kind in type(node).__mro__:
            if kind in RUNNERS:
                getattr(self, RUNNERS[kind])(node)
                return
        raise TypeError(f"{node!r}: unsupported node type")

    def output(self, uid: str) -> DataFrame:
        """Node ``uid``'s output DataFrame."""
        return self.outputs[uid]

    def input_of(self, node: Node) -> DataFrame:
        return self.output(node.inputs[0].uid)

    def inputs_of(self, node: StatefulOperator) -> dict[str, DataFrame]:
        """The records of ``node``'s inputs, and of the inputs of a union among them when it reads those
        (:attr:`StatefulOperator.reads_union_inputs`), by uid."""
        unions = [u for n in node.inputs if isinstance(n, Union) for u in n.inputs] if node.reads_union_inputs else []
        return {n.uid: self.output(n.uid) for n in (*unions, *node.inputs)}

    def transform(self, node: Transform) -> None:
        self.outputs[node.uid] = node.apply(self.input_of(node))

    def union(self, node: Union) -> None:
        self.outputs[node.uid] = node.apply([self.output(n.uid) for n in node.inputs])

    def source(self, node: Source) -> None:
        raise NotImplementedError

    def stateful(self, node: StatefulOperator) -> None:
        raise NotImplementedError

    def channel(self, node: Channel) -> None:
        raise NotImplementedError

    def sink(self, node: Sink) -> None:
        raise NotImplementedError


RUNNERS: dict[type[Node], str] = {
    Source: "source",
    Transform: "transform",
    Union: "union",
    StatefulOperator: "stateful",
    Channel: "channel",
    Sink: "sink",
}
"""The :class:`StepWalk` method that runs each kind of node, by node class (the nearest registered base applies)."""


class _StepRun(StepWalk):
    """One attempt of one step: its nodes over the checkpoint's input, state and sinks."""

    def __init__(
        self,
        ctx: StepContext,
        graph: PipelineGraph,
        settings: CheckpointSettings,
        channels: Mapping[str, tuple[str, ChannelSnapshot]],
        reads: StepReads,
    ) -> None:
        super().__init__()
        self.ctx, self.graph, self.settings, self.channels = ctx, graph, settings, channels
        self.restore = ctx.plan.restore_point
        self.restore_base = restore_base(ctx.storage, self.restore)
        self.snapshots: dict[str, OperatorSnapshot] = {}
        self.committables: dict[str, list[JsonDict]] = {}
        self.produced: dict[str, ChannelSnapshot] = {}
        self.inputs: dict[str, str] = {}
        self.read_once, self.in_driver, self.for_operator = reads
        self.held: dict[str, pa.Table] = {}  # by source uid: its rows read on the driver for its operator
        self.counting: dict[str, tuple[str, Callable[[], int]]] = {}  # consumer → source and its record count
        self.read_on_driver: dict[str, SourceRows] = {}  # by source uid: its rows, for its only consumer
        self.lazy: dict[str, LazyFrame] = {}  # by node uid: its output, its DataFrame made when first asked for
        self.refused: list[SinkSchemaError] = []  # every sink the input does not fit, reported together

    def source(self, node: Source) -> None:
        ctx, barrier = self.ctx, self.ctx.plan.barrier.positions[node.uid]
        previous = restored_position(ctx.plan, node.uid)
        read = node.read_in_driver(ctx, previous, barrier) if node.uid in self.in_driver else None
        if read is not None:  # its only consumer, a sink, takes the rows (or makes their DataFrame)
            self.read_on_driver[node.uid] = read
            _count_records(ctx, node.uid, read.rows.num_rows)
            return
        if node.uid in self.for_operator and self._operator_takes_rows(node, previous, barrier):
            read = node.read_for_operator(ctx, previous, barrier)
            if read is not None:  # its operator reduces the rows on the driver, or reads their DataFrame
                self.held[node.uid] = read.rows
                self.outputs[node.uid] = read.frame()
                _count_records(ctx, node.uid, read.rows.num_rows)
                return
        if node.uid in self.read_once:
            df, count = node.read_once(ctx, previous, barrier)
            self.counting[self.read_once[node.uid]] = (node.uid, count)
        else:
            df, records = node.read_counted(ctx, previous, barrier)
            _count_records(ctx, node.uid, records)
        self.outputs[node.uid] = df

    def _operator_takes_rows(self, node: Source, previous: Any, barrier: Any) -> bool:
        """Whether the stateful consumer of ``node`` may merge this checkpoint on the driver from the rows the
        source reads there, within the bounds of a merge there
        (:func:`~airflow_provider_checkpoint.state.driver_merge.within_driver_bounds`, by the sizes the barrier
        recorded)."""
        operator = self.for_operator[node.uid]
        restored = self.restore.operators.get(operator.uid) if self.restore else None
        rows = None if restored is None else restored.rows
        size = partial(node.input_bytes, previous, barrier)
        return within_driver_bounds(self.settings, rows, size, first=restored is None)

    def stateful(self, node: StatefulOperator) -> None:
        ctx = self.ctx
        result = checkpoint_operator(
            ctx.spark,
            ctx.storage,
            f"{ctx.attempt_dir}/state/{node.uid}",
            ctx.checkpoint_id,
            node,
            self.inputs_of(node),
            ctx.plan.barrier,
            self.restore.operators.get(node.uid) if self.restore else None,
            self.restore_base,
            self.settings,
            {"step": ctx.step, "attempt": ctx.attempt},
            {uid: self.held[uid] for uid in (n.uid for n in node.inputs) if uid in self.held},
        )
        self.snapshots[node.uid] = result.snapshot
        for name, value in result.metrics.items():
            ctx.add_metric(name, value)
        self._counted(node.uid)
        if isinstance(result.output, LazyFrame):
            self.lazy[node.uid] = result.output
        else:
            self.outputs[node.uid] = result.output
        if result.in_driver is not None:
            ctx.in_driver[node.uid] = result.in_driver
        if result.output_rows is not None:
            ctx.output_rows[node.uid] = result.output_rows

    def output(self, uid: str) -> DataFrame:
        """Node ``uid``'s output DataFrame, made now if it was lazy (:class:`LazyFrame`)."""
        return frame_of(self.given(uid))

    def given(self, uid: str) -> DataFrame | LazyFrame:
        """Node ``uid``'s output as the step has it, for a sink to take as it can (:meth:`Sink.stage`): the rows
        its source read on the driver, an output whose DataFrame is made only if asked for, or its DataFrame."""
        if uid in self.read_on_driver:
            return self.read_on_driver[uid]
        return self.lazy[uid] if uid in self.lazy else self.outputs[uid]

    def _counted(self, consumer: str) -> None:
        """After ``consumer``'s one pass over a source read once: that source counted and checked."""
        if consumer in self.counting:
            source, count = self.counting.pop(consumer)
            _count_records(self.ctx, source, count())

    def channel(self, node: Channel) -> None:
        """Write the channel in the step that produces it; read the producer's accepted attempt elsewhere."""
        ctx, producer = self.ctx, self.graph.channel_steps[node.uid]
        if producer == ctx.step:
            held = ctx.in_driver.get(node.inputs[0].uid)
            directory = f"{ctx.attempt_dir}/channels/{node.uid}"
            produced = write_channel(ctx.storage, directory, self.input_of(node), held and held.rows())
            self.produced[node.uid] = produced
            ctx.add_metric("channel_rows_out", produced.rows)
            ctx.add_metric("channel_bytes_out", produced.size)
            self.outputs[node.uid] = self.input_of(node)
            return
        if node.uid not in self.channels:
            raise ValueError(f"step {ctx.step}: no accepted channel {node.uid} from step {producer}")
        self.inputs[node.uid], channel = self.channels[node.uid]
        self.outputs[node.uid] = read_channel(ctx.spark, ctx.storage, channel)
        ctx.add_metric("channel_rows_in", channel.rows)
        ctx.metrics.setdefault("input_records", {})[node.uid] = channel.rows

    def sink(self, node: Sink) -> None:
        before = _counts(self.ctx.metrics)
        try:
            with node.storage_errors():
                self.committables[node.uid] = node.stage(self.ctx, self.given(node.inputs[0].uid))
        except SinkSchemaError as e:  # the other sinks are still checked, so one message names every misfit
            self.refused.append(e)
            return
        self._counted(node.uid)
        grown = {k: v - before.get(k, 0) for k, v in _counts(self.ctx.metrics).items()}
        self.ctx.metrics.setdefault("sinks", {}).update(node.staged_records(grown))

    def check_sinks(self) -> None:
        """Raise the :class:`SinkSchemaError` of every sink of the step that refused its input."""
        if len(self.refused) == 1:
            raise self.refused[0]
        if self.refused:
            raise SinkSchemaError(f"{len(self.refused)} sinks refuse their input: " + "; ".join(map(str, self.refused)))


def run_step(
    spark: SparkSession | SparkHandle,
    storage: JobStorage,
    graph: PipelineGraph,
    step: str,
    plan: CheckpointPlan,
    attempt: int,
    channels: Mapping[str, tuple[str, ChannelSnapshot]] | None = None,
    settings: CheckpointSettings | None = None,
    reads: StepReads | None = None,
) -> Ack:
    """Run ``step`` and return its ack; ``channels`` are the upstream steps' accepted channels
    this step reads (channel uid → producer attempt directory and snapshot). ``spark``: the session, or a
    handle starting it on first use (a step reading and merging on the driver may never start it);
    ``reads``: :func:`step_reads` of the step when the caller walked the graph already."""
    if step not in graph.steps:
        raise ValueError(f"step {step!r} is not part of this pipeline (steps: {', '.join(graph.steps)})")
    started = time.monotonic()
    ctx = StepContext(spark if isinstance(spark, SparkHandle) else SparkHandle.of(spark), storage, plan, step, attempt)
    storage.delete(ctx.attempt_dir)
    run = _StepRun(ctx, graph, settings or CheckpointSettings(), channels or {}, reads or step_reads(graph, step))
    phases = _Phases(ctx)
    for sink in (n for n in graph.steps[step] if isinstance(n, Sink)):
        sink.prepare(ctx)
    try:
        for node in graph.steps[step]:
            phases.next(node)
            ctx.session.doing = f"{node.kind} {node.uid}"
            run.run(node)
        run.check_sinks()
        phases.next(None)
        fault_point("step.before_ack", checkpoint=ctx.checkpoint_id, step=step, attempt=attempt)
    finally:
        if ctx.session.started:
            ctx.session.get().catalog.clearCache()
    ctx.metrics["seconds"] = round(time.monotonic() - started, 3)
    ctx.metrics["records_out"] = _records_out(ctx.metrics)
    return Ack(
        job_id=plan.job_id,
        checkpoint_id=ctx.checkpoint_id,
        step=step,
        attempt=attempt,
        operators=run.snapshots,
        sinks=run.committables,
        metrics=ctx.metrics,
        attempt_dir=ctx.attempt_dir,
        channels=run.produced,
        inputs=run.inputs,
    )
