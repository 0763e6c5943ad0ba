"""The step planner: a validated :class:`PipelineGraph`, how its nodes split into steps, and their order.

A step is one Spark job: every sink with all of its upstream nodes. Sinks that share a
stateful operator run in the same step, because an operator's state must be written by
exactly one step; a channel hands rows from one step to a later one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_provider_checkpoint.core.model import JsonDict
from airflow_provider_checkpoint.dataflow.channel import Channel
from airflow_provider_checkpoint.dataflow.graph import (
    Node,
    Sink,
    Source,
    Transform,
    Union,
    collecting,
)
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.dataflow.validation import refuse_invalid
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from airflow_provider_checkpoint.dataflow.defaults import SourceDefaults


def _step_of(label: str) -> str:
    return "step_" + label.replace(".", "_").replace("-", "_")


def upstream(node: Node) -> list[Node]:
    """``node`` and everything it reads from in its step, in topological order.

    A channel other than ``node`` is a boundary: it is included (its step reads it),
    what feeds it is not.
    """
    seen: dict[str, Node] = {}

    def visit(n: Node) -> None:
        if n.uid in seen:
            return
        if not (isinstance(n, Channel) and n is not node):
            for i in n.inputs:
                visit(i)
        seen[n.uid] = n

    visit(node)
    return list(seen.values())


def plan_steps(nodes: Sequence[Node]) -> tuple[dict[str, list[Node]], dict[str, str]]:
    """Steps from terminals (sinks and channels): each with its upstream up to channels.

    Terminals sharing a stateful operator or a ``step`` name run in one step. Returns the
    steps, ordered so that every step comes after the steps whose channels it reads, and
    channel uid → the step that writes it.
    """
    terminals: list[Sink | Channel] = [
        n for n in nodes if isinstance(n, Channel) or (isinstance(n, Sink) and not n.follows_input)
    ]
    groups: list[tuple[set[str], list[Sink | Channel]]] = []
    for terminal in terminals:
        tags = {n.uid for n in upstream(terminal) if isinstance(n, StatefulOperator)}
        if terminal.step:
            tags.add(f"step:{terminal.step}")
        elif isinstance(terminal, Channel):
            tags.add(f"channel:{terminal.uid}")
        merged = [g for g in groups if g[0] & tags]
        for g in merged:
            groups.remove(g)
        groups.append((tags.union(*(g[0] for g in merged)), [t for g in merged for t in g[1]] + [terminal]))
    steps: dict[str, list[Node]] = {}
    channel_steps: dict[str, str] = {}
    for _, members in groups:
        named = sorted({t.step for t in members if t.step})
        label = "__".join(named) if named else "__".join(t.uid for t in members)
        name = _step_of(label)
        if name in steps:
            raise PipelineDefinitionError(
                f"{', '.join(t.uid for t in members)} would run as step {name!r}, which another "
                "step already has; rename one of them"
            )
        ordered: dict[str, Node] = {}
        for terminal in members:
            ordered.update((n.uid, n) for n in upstream(terminal))
            if isinstance(terminal, Channel):
                channel_steps[terminal.uid] = name
        steps[name] = list(ordered.values())
    steps = _in_dependency_order(steps, channel_steps)
    for sink in (n for n in nodes if isinstance(n, Sink) and n.follows_input):
        host = next((name for name, members in steps.items() if sink.inputs[0] in members), _step_of(sink.uid))
        steps.setdefault(host, list(upstream(sink)[:-1])).append(sink)
    return steps, channel_steps


def _in_dependency_order(steps: dict[str, list[Node]], channel_steps: Mapping[str, str]) -> dict[str, list[Node]]:
    needs = {
        name: {channel_steps[n.uid] for n in nodes if isinstance(n, Channel)} - {name} for name, nodes in steps.items()
    }
    ordered: dict[str, list[Node]] = {}
    while needs:
        ready = sorted(name for name, deps in needs.items() if deps <= set(ordered))
        if not ready:
            raise PipelineDefinitionError(
                f"steps {', '.join(sorted(needs))} read each other's channels in a cycle; "
                "move a channel or a stateful operator so the steps form a chain"
            )
        for name in ready:
            ordered[name] = steps[name]
            del needs[name]
    return ordered


def _order_keeping_sources(node: Node) -> Iterator[Source]:
    """The sources whose record order reaches ``node``'s output: through transforms and unions
    (a stateful operator or a channel between them does not keep an order)."""
    if isinstance(node, Source):
        yield node
    elif isinstance(node, Transform | Union):
        for input in node.inputs:
            yield from _order_keeping_sources(input)


class PipelineGraph:
    """A validated graph, and its split into steps (:func:`plan_steps`)."""

    def __init__(self, nodes: Sequence[Node], defaults: SourceDefaults | None = None) -> None:
        with collecting():  # what sources bring along is not declared in the caller's block
            attached = [s for n in nodes if isinstance(n, Source) for s in n.attach(defaults)]
        nodes = [*nodes, *attached]
        self.nodes: dict[str, Node] = {}
        for node in nodes:
            if node.uid in self.nodes:
                raise PipelineDefinitionError(f"duplicate uid {node.uid!r}")
            self.nodes[node.uid] = node
        for node in nodes:
            for inp in node.inputs:
                if self.nodes.get(inp.uid) is not inp:
                    raise PipelineDefinitionError(f"{node.uid}: input {inp.uid} is not part of this pipeline")
        if not self.sinks:
            raise PipelineDefinitionError("a pipeline needs at least one sink")
        refuse_invalid(nodes)
        for sink in self.sinks:
            if sink.needs_source_order():
                for source in _order_keeping_sources(sink.inputs[0]):
                    source.in_source_order = True
        self.steps, self.channel_steps = plan_steps(list(self.nodes.values()))

    @property
    def sources(self) -> list[Source]:
        return [n for n in self.nodes.values() if isinstance(n, Source)]

    @property
    def sinks(self) -> list[Sink]:
        return [n for n in self.nodes.values() if isinstance(n, Sink)]

    @property
    def channels(self) -> list[Channel]:
        return [n for n in self.nodes.values() if isinstance(n, Channel)]

    def reads(self, step: str) -> list[str]:
        """Uids of the channels ``step`` reads from other steps."""
        return [n.uid for n in self.steps[step] if isinstance(n, Channel) and self.channel_steps[n.uid] != step]

    def upstream_steps(self, step: str) -> list[str]:
        """The steps whose channels ``step`` reads: its Airflow task depends on theirs."""
        return sorted({self.channel_steps[uid] for uid in self.reads(step)})

    def topology(self) -> JsonDict:
        return {
            "nodes": {uid: n.describe() for uid, n in self.nodes.items()},
            "steps": {name: [n.uid for n in nodes] for name, nodes in self.steps.items()},
            "channels": dict(sorted(self.channel_steps.items())),
        }

    def stateful_keys(self) -> dict[str, tuple[str, ...]]:
        """Stateful operator uid → its key columns."""
        return {uid: n.keys for uid, n in self.nodes.items() if isinstance(n, StatefulOperator)}

    def state_declarations(self) -> dict[str, dict[str, str]]:
        """Stateful operator uid → its :meth:`~.StatefulOperator.state_declaration`."""
        return {uid: n.state_declaration() for uid, n in self.nodes.items() if isinstance(n, StatefulOperator)}
