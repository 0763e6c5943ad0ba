"""The dataflow graph of a pipeline: sources, operators and sinks, and how they form steps.

Nodes are declared at DAG-parse time and import no Spark: Spark is only touched when a
step runs. Every node has a stable ``uid`` that keys its state and its position in
checkpoints, so renaming a task or reordering code never loses state.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_checkpoint.core.model import JsonDict

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_provider_checkpoint.spark.context import StepContext

_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class PipelineDefinitionError(ValueError):
    """The pipeline graph is not valid; the message says which node and why."""


class Node:
    """A vertex of the dataflow graph."""

    kind: ClassVar[str] = "node"

    def __init__(self, uid: str, inputs: Sequence[Node] = ()) -> None:
        if not _UID.match(uid):
            raise PipelineDefinitionError(
                f"uid {uid!r} must be 1-100 characters of letters, digits, '_', '.', '-' "
                "and start with a letter or digit"
            )
        self.uid = uid
        self.inputs = tuple(inputs)
        for node in self.inputs:
            if isinstance(node, Sink):
                raise PipelineDefinitionError(f"{uid}: a sink ({node.uid}) cannot be an input")
        _register(self)

    def describe(self) -> JsonDict:
        """The topology entry of this node (recorded in the job record)."""
        return {"kind": self.kind, "inputs": [n.uid for n in self.inputs]}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(uid={self.uid!r})"


class Source(Node):
    """Reads input up to a barrier. Positions are JSON values defined by the source."""

    kind = "source"

    def __init__(self, uid: str) -> None:
        super().__init__(uid)

    def initial_position(self) -> Any:
        raise NotImplementedError

    def barrier_position(self, previous: Any) -> Any:
        """The end position (exclusive) at trigger time, given the restored position."""
        raise NotImplementedError

    def read(self, ctx: StepContext, previous: Any, barrier: Any) -> DataFrame:
        """Everything in ``[previous, barrier)``, deterministically, as a cached DataFrame."""
        raise NotImplementedError

    def read_counted(self, ctx: StepContext, previous: Any, barrier: Any) -> tuple[DataFrame, int]:
        """:meth:`read` and its number of records; a source that can count while it reads overrides it."""
        df = self.read(ctx, previous, barrier)
        return df, df.count()

    def on_checkpoint_committed(self, checkpoint_id: int, position: Any) -> None:
        """Called after checkpoint ``checkpoint_id`` committed with ``position``; idempotent.

        Runs in finalize after ``_metadata`` and again in the next trigger's recovery of
        the latest completed checkpoint, so it must tolerate running twice. No-op here.
        """


class Transform(Node):
    """A stateless DataFrame → DataFrame function (filter, projection, parsing)."""

    kind = "transform"

    def __init__(self, uid: str, input: Node, fn: Any) -> None:
        super().__init__(uid, [input])
        self.fn = fn

    def apply(self, df: DataFrame) -> DataFrame:
        return self.fn(df)  # type: ignore[no-any-return]


class StatefulOperator(Node):
    """Keyed state carried across checkpoints.

    ``apply(input, state) -> (new_state, output)``: ``state`` is the full keyed state of
    the restore point (empty on the first run), ``new_state`` the full state after this
    checkpoint, ``output`` what flows downstream (usually the rows of changed keys).
    """

    kind = "stateful"

    def __init__(self, uid: str, input: Node, keys: Sequence[str], max_parallelism: int = 128) -> None:
        super().__init__(uid, [input])
        if not keys:
            raise PipelineDefinitionError(f"{uid}: keyed state needs at least one key column")
        if not 1 <= max_parallelism <= 32768:
            raise PipelineDefinitionError(f"{uid}: max_parallelism must be in [1, 32768]")
        self.keys = tuple(keys)
        self.max_parallelism = max_parallelism

    def describe(self) -> JsonDict:
        return {**super().describe(), "keys": list(self.keys), "max_parallelism": self.max_parallelism}

    def initial_state(self, spark: SparkSession, input: DataFrame) -> DataFrame:
        raise NotImplementedError

    def apply(self, input: DataFrame, state: DataFrame) -> tuple[DataFrame, DataFrame]:
        raise NotImplementedError


class Sink(Node):
    """A two-phase-commit sink: ``stage`` in the step, ``commit`` or ``abort`` in finalize.

    ``commit`` is idempotent: committing the same committables twice is a no-op. Sinks
    given the same ``step`` name run in one Spark job (one Airflow task).
    """

    kind = "sink"

    def __init__(self, uid: str, input: Node, step: str | None = None) -> None:
        super().__init__(uid, [input])
        if step is not None and not _UID.match(step):
            raise PipelineDefinitionError(f"{uid}: step name {step!r} must look like a uid")
        self.step = step

    def stage(self, ctx: StepContext, df: DataFrame) -> list[JsonDict]:
        raise NotImplementedError

    def commit(self, checkpoint_id: int, committables: list[JsonDict]) -> None:
        raise NotImplementedError

    def abort(self, checkpoint_id: int) -> None:
        raise NotImplementedError

    def rollback(self, checkpoint_id: int) -> None:
        """Withdraw committed output of checkpoints newer than ``checkpoint_id`` (on restore).

        The default keeps it: right for sinks whose replayed output overwrites (upserts).
        """

    def asset_uri(self) -> str | None:
        """The Airflow Asset URI of what this sink writes, if any."""
        return None


# -- declaration context --------------------------------------------------------------
_active: list[list[Node]] = []


def _register(node: Node) -> None:
    if _active:
        _active[-1].append(node)


@contextmanager
def collecting() -> Iterator[list[Node]]:
    """Collect every node declared inside the block, in declaration order."""
    nodes: list[Node] = []
    _active.append(nodes)
    try:
        yield nodes
    finally:
        _active.pop()


class PipelineGraph:
    """A validated graph, and its split into steps.

    A step is one Spark job: every sink with all of its upstream nodes. Sinks that share
    a stateful operator run in the same step, because an operator's state must be
    written by exactly one step.
    """

    def __init__(self, nodes: Sequence[Node]) -> None:
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
        self.steps = self._plan_steps()

    @property
    def sources(self) -> list[Source]:
        return [n for n in self.nodes.values() if isinstance(n, Source)]

    @property
    def sinks(self) -> list[Sink]:
        return [n for n in self.nodes.values() if isinstance(n, Sink)]

    def upstream(self, node: Node) -> list[Node]:
        """``node`` and everything it reads from, in topological order."""
        seen: dict[str, Node] = {}

        def visit(n: Node) -> None:
            if n.uid in seen:
                return
            for i in n.inputs:
                visit(i)
            seen[n.uid] = n

        visit(node)
        return list(seen.values())

    def _plan_steps(self) -> dict[str, list[Node]]:
        groups: list[tuple[set[str], list[Sink]]] = []
        for sink in self.sinks:
            tags = {n.uid for n in self.upstream(sink) if isinstance(n, StatefulOperator)}
            if sink.step:
                tags.add(f"step:{sink.step}")
            merged = [g for g in groups if g[0] & tags]
            for g in merged:
                groups.remove(g)
            groups.append((tags.union(*(g[0] for g in merged)), [s for g in merged for s in g[1]] + [sink]))
        steps: dict[str, list[Node]] = {}
        for _, sinks in groups:
            named = sorted({s.step for s in sinks if s.step})
            label = "__".join(named) if named else "__".join(s.uid for s in sinks)
            name = "step_" + label.replace(".", "_").replace("-", "_")
            if name in steps:
                raise PipelineDefinitionError(
                    f"sinks {', '.join(s.uid for s in sinks)} would run as step {name!r}, which another "
                    "step already has; rename one of the sinks"
                )
            ordered: dict[str, Node] = {}
            for sink in sinks:
                ordered.update((n.uid, n) for n in self.upstream(sink))
            steps[name] = list(ordered.values())
        return steps

    def topology(self) -> JsonDict:
        return {
            "nodes": {uid: n.describe() for uid, n in self.nodes.items()},
            "steps": {name: [n.uid for n in nodes] for name, nodes in self.steps.items()},
        }

    def stateful_keys(self) -> dict[str, tuple[str, ...]]:
        """Stateful operator uid → its key columns."""
        return {uid: n.keys for uid, n in self.nodes.items() if isinstance(n, StatefulOperator)}
