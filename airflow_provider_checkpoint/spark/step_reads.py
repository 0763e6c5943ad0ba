"""How a step reads its sources, known before it runs: which source's rows its only consumer reads in one
pass or takes on the driver, the bytes the sources will read, and whether the step may run without Spark."""

from __future__ import annotations

from typing import Any, NamedTuple

from airflow_provider_checkpoint.core.model import CheckpointPlan
from airflow_provider_checkpoint.dataflow.graph import Node, Sink, Source
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph


def _only_consumers(graph: PipelineGraph, step: str) -> dict[str, Node]:
    """Sources of ``step`` with one consumer in the step (a sink that reads no records of its input is none)."""
    consumers: dict[str, list[Node]] = {}
    for node in graph.nodes.values():
        if isinstance(node, Sink) and node.follows_input:  # reads no records of its input
            continue
        for upstream in node.inputs:
            consumers.setdefault(upstream.uid, []).append(node)
    in_step = {node.uid for node in graph.steps[step]}
    return {
        node.uid: only[0]
        for node in graph.steps[step]
        if isinstance(node, Source) and len(only := consumers.get(node.uid, [])) == 1 and only[0].uid in in_step
    }


def _read_once(only_consumers: dict[str, Node]) -> dict[str, str]:
    """Sources read in one pass, of those with one consumer (:func:`_only_consumers`): source uid → that
    consumer, an operator or a sink that reads its input once (:attr:`StatefulOperator.reads_input_once`,
    :attr:`Sink.reads_input_once`)."""
    return {
        uid: only.uid
        for uid, only in only_consumers.items()
        if isinstance(only, (StatefulOperator, Sink)) and only.reads_input_once
    }


def _read_in_driver(only_consumers: dict[str, Node]) -> set[str]:
    """Sources, of those with one consumer (:func:`_only_consumers`), whose consumer takes their rows from the
    driver (:meth:`Sink.takes_source_rows`)."""
    return {uid for uid, sink in only_consumers.items() if isinstance(sink, Sink) and sink.takes_source_rows()}


def _for_operator(only_consumers: dict[str, Node]) -> dict[str, StatefulOperator]:
    """Sources, of those with one consumer (:func:`_only_consumers`), whose consumer is a stateful operator that may
    reduce their rows on the driver (:meth:`StatefulOperator.takes_source_rows`): source uid → that operator."""
    return {
        uid: only
        for uid, only in only_consumers.items()
        if isinstance(only, StatefulOperator) and only.takes_source_rows()
    }


class StepReads(NamedTuple):
    """How a step reads its sources, from one walk of the graph (:func:`step_reads`): source uid → the consumer
    reading it in one pass (:func:`_read_once`), the sources whose rows go to their consumer on the driver
    (:func:`_read_in_driver`), and those whose operator may reduce their rows there (:func:`_for_operator`)."""

    read_once: dict[str, str]
    in_driver: set[str]
    for_operator: dict[str, StatefulOperator] = {}  # noqa: RUF012  # a NamedTuple's default, never changed


def step_reads(graph: PipelineGraph, step: str) -> StepReads:
    """How ``step`` reads its sources: one walk of the graph for the operator's plan and the run."""
    only_consumers = _only_consumers(graph, step)
    return StepReads(_read_once(only_consumers), _read_in_driver(only_consumers), _for_operator(only_consumers))


def may_skip_spark(graph: PipelineGraph, step: str, reads: StepReads | None = None) -> bool:
    """Whether ``step`` may run without a Spark session: its every node a source whose only consumer takes
    its rows on the driver (:func:`_read_in_driver`; ``reads``: the step's, else walked now) or that consumer.
    It does when each of those sources reads on the driver (:meth:`Source.read_in_driver`) and each sink
    merges there."""
    nodes = graph.steps[step]
    driver = (reads or step_reads(graph, step)).in_driver
    return bool(driver) and all(
        node.uid in driver if isinstance(node, Source) else isinstance(node, Sink) and node.inputs[0].uid in driver
        for node in nodes
    )


def restored_position(plan: CheckpointPlan, uid: str) -> Any:
    """Where source ``uid`` starts in the checkpoint of ``plan``: its position in the restore point (``None``: none)."""
    return plan.restore_point.source_positions.get(uid) if plan.restore_point else None


def step_input_bytes(graph: PipelineGraph, step: str, plan: CheckpointPlan) -> int | None:
    """The bytes ``step``'s sources will read in the checkpoint of ``plan``, as far as they know them
    before reading (:meth:`Source.input_bytes`); ``None`` when none does."""
    known = [
        node.input_bytes(restored_position(plan, node.uid), plan.barrier.positions[node.uid])
        for node in graph.steps[step]
        if isinstance(node, Source)
    ]
    return None if all(k is None for k in known) else sum(k or 0 for k in known)


def spark_on_first_use(graph: PipelineGraph, step: str, plan: CheckpointPlan, reads: StepReads | None = None) -> bool:
    """Whether ``step``'s task starts Spark only on first use in the checkpoint of ``plan``: it :func:`may_skip_spark`
    (``reads``: the step's, passed on to :func:`run_step`) and each of its sources may read its range on the
    driver (:meth:`Source.may_read_in_driver`, from the positions alone). Otherwise the step surely needs
    Spark: its task starts it at once, beside the storage."""
    return may_skip_spark(graph, step, reads) and all(
        node.may_read_in_driver(restored_position(plan, node.uid), plan.barrier.positions[node.uid])
        for node in graph.steps[step]
        if isinstance(node, Source)
    )
