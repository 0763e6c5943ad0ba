"""The late rows of an operator with ``late="output"`` as a node of the graph: an input of sinks,
committed with the checkpoint like every output (Flink's ``sideOutputLateData``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from airflow_provider_checkpoint.dataflow.graph import Node, Transform

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class LateRows(Protocol):
    """An operator with ``late="output"``: its late rows of the checkpoint it last ran."""

    uid: str

    def late_rows(self) -> DataFrame: ...


class LateData(Transform):
    """The late rows of an operator with ``late="output"`` (a :class:`~.windows.WindowAggregate`'s or a
    :class:`~.dedup.Deduplicate`'s ``late_data``), per checkpoint: an input of sinks, run in the
    operator's step after it."""

    def __init__(self, operator: LateRows) -> None:
        assert isinstance(operator, Node)
        super().__init__(f"{operator.uid}.late", operator, lambda _: operator.late_rows())
