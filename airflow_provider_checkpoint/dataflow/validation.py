"""What a pipeline's definition can tell about its mistakes, checked when the DAG file is parsed (no JVM).

:func:`validate_pipeline` follows the graph from its sources' declared schemas (Spark DDL,
read by :mod:`.schema_ddl`) through every operator whose output columns its definition fixes
(a :class:`~.stateful.KeyedAggregate`: keys and aggregates; a :class:`~.windows.WindowAggregate`: keys,
time column and aggregates, then the window's bounds; a :class:`~.graph.Union`; a
:class:`~.channel.Channel`; :class:`~.multi_input.DimensionEnrichment` and
:class:`~.interval_join.IntervalJoin`), and reports every column a node names that its input
does not have: keys, aggregated columns, ``sequence_by``, sink keys and partition columns, a
dimension's version and columns, interval-join times, on every input of a multi-input
operator. Past a node whose output only Spark knows (a :class:`~.graph.Transform`, a user
state function, a Delta source) nothing is checked: a dry run's job, never a false error.
It also refuses a schema DDL Spark would refuse (with the position), two sinks writing one
table, and a sink writing where a source of the same pipeline reads (a feedback loop).

Names are compared as Spark resolves them by default (case-insensitively); types are
compared only where both are known, nullability and ``CHAR``/``VARCHAR`` lengths aside.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from airflow_provider_checkpoint.core.event_time import WatermarkSpec
from airflow_provider_checkpoint.dataflow.channel import Channel
from airflow_provider_checkpoint.dataflow.dedup import Deduplicate
from airflow_provider_checkpoint.dataflow.graph import Node, Sink, Source, Union
from airflow_provider_checkpoint.dataflow.interval_join import IntervalJoin
from airflow_provider_checkpoint.dataflow.keyed_process import KeyedProcess
from airflow_provider_checkpoint.dataflow.multi_input import DimensionEnrichment, KeyedCoStateFunction
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.dataflow.schema_ddl import DdlError, parse_schema
from airflow_provider_checkpoint.dataflow.stateful import KeyedAggregate, KeyedStateFunction
from airflow_provider_checkpoint.dataflow.windows import WINDOW_END, WINDOW_START, WindowAggregate
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

Columns = dict[str, str | None]
"""A node's output columns in order: name → type (Spark's ``simpleString``; ``None``: not known)."""


@dataclass(frozen=True)
class Problem:
    """One mistake of a pipeline's definition: the node, its parameter, what is wrong and how to fix it."""

    uid: str
    field: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.uid}: {self.field}: {self.message}; {self.fix}"


def validate_pipeline(nodes: Sequence[Node]) -> list[Problem]:
    """Every mistake the definition of the pipeline made of ``nodes`` (sources' attached sinks included)
    shows without Spark, in declaration order; empty when none is found."""
    return _Validator(nodes).problems


def refuse_invalid(nodes: Sequence[Node]) -> None:
    """Raise :class:`PipelineDefinitionError` listing every problem :func:`validate_pipeline` finds."""
    problems = validate_pipeline(nodes)
    if problems:
        listed = "\n".join(f"- {p}" for p in problems)
        raise PipelineDefinitionError(f"the pipeline's definition has {len(problems)} problem(s):\n{listed}")


def _columns_text(columns: Columns) -> str:
    return ", ".join(columns) or "none"


def _comparable(type_: str) -> str:
    """A type as Spark compares it after a read: ``CHAR(n)``/``VARCHAR(n)`` read as ``string``, and
    ``timestamp_ntz`` taken as ``timestamp`` (the session may map one to the other)."""
    return re.sub(r"\b(?:var)?char\(\d+\)", "string", type_).replace("timestamp_ntz", "timestamp")


class _Validator:
    def __init__(self, nodes: Sequence[Node]) -> None:
        self.problems: list[Problem] = []
        self.outputs: dict[str, Columns | None] = {}
        for node in nodes:
            self._follow(node)
        self._check_targets([n for n in nodes if isinstance(n, Sink)], [n for n in nodes if isinstance(n, Source)])

    def _follow(self, node: Node) -> None:
        """Visit ``node`` after its inputs (whatever order ``nodes`` came in), once."""
        if node.uid not in self.outputs:
            for input in node.inputs:
                self._follow(input)
            self.outputs[node.uid] = self._visit(node)

    def problem(self, node: Node, field: str, message: str, fix: str) -> None:
        self.problems.append(Problem(node.uid, field, message, fix))

    def input(self, node: Node, index: int = 0) -> Columns | None:
        return self.outputs.get(node.inputs[index].uid)

    def parse(self, node: Node, field: str, ddl: str) -> Columns | None:
        try:
            return {c.name: c.type for c in parse_schema(ddl)}
        except DdlError as e:
            self.problem(
                node, field, f"{ddl!r} is not a valid schema: {e}", f"correct {field} (Spark DDL: 'name TYPE, ...')"
            )
            return None

    def require(self, node: Node, field: str, names: Iterable[str], columns: Columns | None, of: Node | str) -> None:
        """Each of ``names`` (given in ``field``) is a column of ``columns``, the output of input ``of`` (or
        what ``of`` says), when known."""
        if columns is None:
            return
        known = {c.lower() for c in columns}
        missing = [n for n in names if n.lower() not in known]
        if missing:
            where = f"input {of.uid}" if isinstance(of, Node) else of
            self.problem(
                node,
                field,
                f"{', '.join(map(repr, missing))} not among the columns of {where} ({_columns_text(columns)})",
                f"name columns of {where}, or correct the schema declared upstream",
            )

    def _visit(self, node: Node) -> Columns | None:
        if isinstance(node, Source):
            ddl = node.declared_schema()
            if ddl is None:
                return None
            declared = self.parse(node, "schema", ddl) if ddl else {}
            if declared is None:
                return None
            adds = node.added_columns()
            added = {c.name: c.type for c in parse_schema(adds)} if adds else {}
            if clash := sorted(set(map(str.lower, declared)) & set(map(str.lower, added))):
                self.problem(
                    node,
                    "schema",
                    f"column(s) {clash} clash with the columns the source adds ({', '.join(added)})",
                    "rename them in the schema, or leave them out of what the source adds (metadata_columns)",
                )
            return {**declared, **added}
        if isinstance(node, Channel):
            return self.input(node)
        if isinstance(node, Union):
            return self._union(node)
        if isinstance(node, Sink):
            for field, names in node.required_columns().items():
                self.require(node, field, names, self.input(node), node.inputs[0])
            deletes = node.inputs[0].deletes_column()
            soft, columns = getattr(node, "soft_delete", None), self.input(node)
            if soft and columns and soft.column != soft.when and soft.column.lower() in map(str.lower, columns):
                self.problem(
                    node,
                    "deleted_column",
                    f"{soft.column!r} is already a column of {node.inputs[0].uid}; soft deletes add it",
                    "name another deleted_column, or drop that column before this sink",
                )
            marks = getattr(node, "marks_deletes", None)
            if deletes and getattr(node, "mode", None) == "upsert" and (marks() if marks else None) != deletes:
                self.problem(
                    node,
                    "delete_when",
                    f"rows of {node.inputs[0].uid} with {deletes} true delete their key; this sink would write them "
                    "as rows",
                    f"set delete_when={deletes!r} on the sink, or filter those rows out before this sink",
                )
            return None
        if isinstance(node, StatefulOperator):
            return self._stateful(node)
        return None  # a Transform, or a node of its own: only Spark knows its output

    def _union(self, node: Union) -> Columns | None:
        inputs = [self.outputs.get(i.uid) for i in node.inputs]
        first = inputs[0]
        if first is None or any(i is None for i in inputs):
            return None
        for other, columns in zip(node.inputs[1:], inputs[1:], strict=True):
            assert columns is not None
            differ = set(columns) != set(first) or any(
                first[c] and columns[c] and _comparable(first[c] or "") != _comparable(columns[c] or "") for c in first
            )
            if differ:
                self.problem(
                    node,
                    "inputs",
                    f"input {other.uid} has columns <{_typed(columns)}> but {node.inputs[0].uid} has <{_typed(first)}>",
                    "give every input of a union the same columns (names and types)",
                )
        return first

    def _stateful(self, node: StatefulOperator) -> Columns | None:
        if isinstance(node, WindowAggregate):
            return self._windows(node)
        if isinstance(node, KeyedAggregate):
            columns = self.input(node)
            self.require(node, "keys", node.keys, columns, node.inputs[0])
            self.require(node, "aggs", node.input_columns(), columns, node.inputs[0])
            self._watermark(node, node.ttl_watermark, columns)
            keys = {k: _type_of(columns, k) for k in node.keys}
            return {**keys, **dict.fromkeys(node.aggs)}
        if isinstance(node, Deduplicate):
            columns = self.input(node)
            self.require(node, "keys", node.keys, columns, node.inputs[0])
            self._watermark(node, node.watermark, columns)
            return columns
        if isinstance(node, KeyedStateFunction | KeyedCoStateFunction):
            state = self.parse(node, "state_schema", node.state_schema)
            self.require(node, "keys", node.keys, state, "its state_schema")
            return None
        if isinstance(node, KeyedProcess):
            return self._keyed_process(node)
        if isinstance(node, DimensionEnrichment):
            return self._enrichment(node)
        if isinstance(node, IntervalJoin):
            return self._interval_join(node)
        return None

    def _windows(self, node: WindowAggregate) -> Columns | None:
        columns = self.input(node)
        self.require(node, "keys", node.group_keys, columns, node.inputs[0])
        self.require(node, "time_column", [node.time_column], columns, node.inputs[0])
        self.require(node, "aggs", node.input_columns(), columns, node.inputs[0])
        self._timestamp(node, "time_column", node.time_column, columns)
        keys = {k: _type_of(columns, k) for k in node.group_keys}
        return {**keys, WINDOW_START: "timestamp", WINDOW_END: "timestamp", **dict.fromkeys(node.aggs)}

    def _timestamp(self, node: StatefulOperator, field: str, column: str, columns: Columns | None) -> None:
        """``column`` of ``node``'s input, named by its parameter ``field``, is a timestamp where known."""
        time = _type_of(columns, column)
        if time is not None and _comparable(time) != "timestamp":
            self.problem(
                node,
                field,
                f"{column!r} is {time}, not a timestamp",
                f"cast it in a Transform first, e.g. F.col({column!r}).cast('timestamp')",
            )

    def _watermark(self, node: StatefulOperator, spec: WatermarkSpec | None, columns: Columns | None) -> None:
        """The column of the watermark ``node`` has (its own or its sources'), if any, is a timestamp of its input."""
        if spec is not None:
            self.require(node, "watermark", [spec.column], columns, node.inputs[0])
            self._timestamp(node, "watermark", spec.column, columns)

    def _keyed_process(self, node: KeyedProcess) -> Columns | None:
        columns = self.input(node)
        self.require(node, "keys", node.keys, columns, node.inputs[0])
        self._watermark(node, node.watermark, columns)
        return self.parse(node, "output_schema", node.function.output_schema)

    def _enrichment(self, node: DimensionEnrichment) -> Columns | None:
        facts, dimension = self.input(node, 0), self.input(node, 1)
        self.require(node, "keys", node.keys, facts, node.inputs[0])
        self.require(node, "keys", node.keys, dimension, node.inputs[1])
        self.require(node, "version", [node.version], dimension, node.inputs[1])
        self.require(node, "columns", node.columns, dimension, node.inputs[1])
        if facts is not None and (clash := sorted(set(node.columns) & set(facts))):
            self.problem(
                node,
                "columns",
                f"{clash} also exist in the facts ({node.inputs[0].uid})",
                "rename them in one input first",
            )
        if facts is None or dimension is None:
            return None
        return {**facts, **{c: _type_of(dimension, c) for c in node.columns}}

    def _interval_join(self, node: IntervalJoin) -> Columns | None:
        left, right = self.input(node, 0), self.input(node, 1)
        for index, columns, time in ((0, left, node.left_time), (1, right, node.right_time)):
            self.require(node, "keys", node.keys, columns, node.inputs[index])
            self.require(node, "left_time" if index == 0 else "right_time", [time], columns, node.inputs[index])
            if node.on_event_time:
                self._timestamp(node, "left_time" if index == 0 else "right_time", time, columns)
        if left is None or right is None:
            return None
        if clash := sorted((set(left) & set(right)) - set(node.keys)):
            self.problem(node, "inputs", f"left and right both have columns {clash}", "rename them on one side first")
        keys = {k: _type_of(left, k) for k in node.keys}
        others = {c: t for side in (left, right) for c, t in side.items() if c not in node.keys}
        return {**keys, **others}

    def _check_targets(self, sinks: Sequence[Sink], sources: Sequence[Source]) -> None:
        """One sink per target (a table path or URL, a table of a connection); no sink writing where a source reads."""
        writers: dict[str, Sink] = {}
        for sink in sinks:
            for target in sink.targets():
                other = writers.setdefault(target, sink)
                if other is not sink:
                    self.problem(
                        sink,
                        "target",
                        f"{target} is written by sink {other.uid} too",
                        "give each sink a table of its own (one writer per table)",
                    )
                for source in sources:
                    if source.reads_target(target):
                        self.problem(
                            sink,
                            "target",
                            f"{target} lies where source {source.uid} reads, so the pipeline would read its own output",
                            f"write elsewhere, or under a hidden name ('.x' or '_x') in {source.uid}'s directory",
                        )


def _type_of(columns: Mapping[str, str | None] | None, name: str) -> str | None:
    if columns is None:
        return None
    return next((t for c, t in columns.items() if c.lower() == name.lower()), None)


def _typed(columns: Columns) -> str:
    return ", ".join(f"{c}: {t or '?'}" for c, t in columns.items())
