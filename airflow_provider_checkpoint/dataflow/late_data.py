"""The late rows of an operator with ``late="output"`` as a node of the graph: an input of sinks,
committed with the checkpoint like every output (Flink's ``sideOutputLateData``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_checkpoint.dataflow.graph import Node, Transform
from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class LateOutput:
    """An operator that can give its late rows to sinks (``late="output"``): the rows its docstring
    calls late, of the checkpoint it last ran, as they came."""

    uid: str
    late: str
    _late_data: LateData | None = None
    _late_rows: DataFrame | None = None

    @property
    def late_data(self) -> LateData:
        """The late rows of each checkpoint (``late="output"``); declare it inside the pipeline and give it
        to a sink."""
        if self.late != "output":
            raise PipelineDefinitionError(f"{self.uid}: late_data needs late='output'")
        if self._late_data is None:
            self._late_data = LateData(self)
        return self._late_data

    def late_rows(self) -> DataFrame:
        """The late rows of the checkpoint the operator last ran."""
        if self._late_rows is None:
            raise PipelineDefinitionError(f"{self.uid}: its late rows are read before the operator ran")
        return self._late_rows


class LateData(Transform):
    """The late rows of an operator with ``late="output"`` (a :class:`~.windows.WindowAggregate`'s or a
    :class:`~.dedup.Deduplicate`'s ``late_data``), per checkpoint: an input of sinks, run in the
    operator's step after it."""

    def __init__(self, operator: LateOutput) -> None:
        assert isinstance(operator, Node)
        super().__init__(f"{operator.uid}.late", operator, lambda _: operator.late_rows())
