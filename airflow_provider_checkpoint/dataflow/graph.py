"""The dataflow graph of a pipeline, in one place: its nodes (:mod:`.node`: :class:`Node` and the
declaration context), its sources (:mod:`.source`), the ends of its steps (:mod:`.sink`:
:class:`StepOutput`, :class:`Sink`) and, here, the stateless nodes :class:`Transform` and :class:`Union`;
channels: :mod:`.channel`, stateful operators: :mod:`~airflow_provider_checkpoint.dataflow.operator`.

Nodes are declared at DAG-parse time and import no Spark: Spark is only touched when a
step runs. Every node has a stable ``uid`` that keys its state and its position in
checkpoints, so renaming a task or reordering code never loses state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.dataflow.node import Node, collecting
from airflow_provider_checkpoint.dataflow.sink import Sink, StepOutput, redact_url
from airflow_provider_checkpoint.dataflow.source import Source
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Node", "Sink", "Source", "StepOutput", "Transform", "Union", "collecting", "redact_url"]


class Transform(Node):
    """A stateless DataFrame → DataFrame function (filter, projection, parsing)."""

    kind = "transform"

    def __init__(self, uid: str, input: Node, fn: Any) -> None:
        super().__init__(uid, [input])
        self.fn = fn

    def apply(self, df: DataFrame) -> DataFrame:
        return self.fn(df)  # type: ignore[no-any-return]


class Union(Node):
    """The records of several inputs with the same columns (by name and type), as one input."""

    kind = "union"

    def __init__(self, uid: str, inputs: Sequence[Node]) -> None:
        super().__init__(uid, inputs)
        if len(self.inputs) < 2:
            raise PipelineDefinitionError(f"{uid}: a union needs at least two inputs")

    def apply(self, dfs: Sequence[DataFrame]) -> DataFrame:
        first = dfs[0]
        columns = {f.name: f.dataType for f in first.schema.fields}
        for node, df in zip(self.inputs[1:], dfs[1:], strict=True):
            if {f.name: f.dataType for f in df.schema.fields} != columns:
                raise PipelineDefinitionError(
                    f"{self.uid}: input {node.uid} has columns <{df.schema.simpleString()}> but "
                    f"{self.inputs[0].uid} has <{first.schema.simpleString()}>; a union needs the same columns"
                )
        out = first
        for df in dfs[1:]:
            out = out.unionByName(df)
        return out
