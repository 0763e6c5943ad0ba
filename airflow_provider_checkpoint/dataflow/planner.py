"""The step planner: how a pipeline's nodes split into steps, and in which order the steps run.

A step is one Spark job: every sink with all of its upstream nodes. Sinks that share a
stateful operator run in the same step, because an operator's state must be written by
exactly one step; a channel hands rows from one step to a later one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from airflow_provider_checkpoint.dataflow.graph import Channel, Node, Sink, StatefulOperator
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError


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
