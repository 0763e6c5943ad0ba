"""Building blocks of a checkpointed pipeline: sources, transforms, stateful operators, sinks.

The graph, its operators and the planner live here; sources and sinks live in
:mod:`airflow_provider_checkpoint.connectors`, one package per external system, and are
re-exported here (loaded on first use, as connectors build on the graph) so a pipeline
imports everything from one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.core.keyed_process import (
    KeyedProcessFunction,
    ListState,
    MapState,
    ValueState,
)
from airflow_provider_checkpoint.core.ttl import TTL
from airflow_provider_checkpoint.dataflow.channel import Channel
from airflow_provider_checkpoint.dataflow.dedup import Deduplicate
from airflow_provider_checkpoint.dataflow.graph import (
    Node,
    Sink,
    Source,
    Transform,
    Union,
)
from airflow_provider_checkpoint.dataflow.interval_join import IntervalJoin
from airflow_provider_checkpoint.dataflow.keyed_process import KeyedProcess
from airflow_provider_checkpoint.dataflow.multi_input import DimensionEnrichment, KeyedCoStateFunction
from airflow_provider_checkpoint.dataflow.operator import StatefulOperator
from airflow_provider_checkpoint.dataflow.planner import PipelineGraph
from airflow_provider_checkpoint.dataflow.stateful import KeyedAggregate, KeyedStateFunction
from airflow_provider_checkpoint.dataflow.window_kinds import session, sliding, tumbling
from airflow_provider_checkpoint.dataflow.windows import WindowAggregate
from airflow_provider_checkpoint.exceptions import MalformedInputError, PipelineDefinitionError, TooManyMalformedError

if TYPE_CHECKING:
    from airflow_provider_checkpoint.connectors.delta.sink import DeltaTableSink
    from airflow_provider_checkpoint.connectors.delta.source import DeltaSource
    from airflow_provider_checkpoint.connectors.files.parquet_sink import ParquetTableSink
    from airflow_provider_checkpoint.connectors.files.source import FileSource
    from airflow_provider_checkpoint.connectors.kafka.sink import KafkaSink
    from airflow_provider_checkpoint.connectors.kafka.source import KafkaSource
    from airflow_provider_checkpoint.connectors.postgres.cdc import PostgresCdcSource
    from airflow_provider_checkpoint.connectors.postgres.sink import PostgresTableSink

_CONNECTORS = {
    "DeltaSource": "airflow_provider_checkpoint.connectors.delta.source",
    "DeltaTableSink": "airflow_provider_checkpoint.connectors.delta.sink",
    "FileSource": "airflow_provider_checkpoint.connectors.files.source",
    "KafkaSink": "airflow_provider_checkpoint.connectors.kafka.sink",
    "KafkaSource": "airflow_provider_checkpoint.connectors.kafka.source",
    "ParquetTableSink": "airflow_provider_checkpoint.connectors.files.parquet_sink",
    "PostgresTableSink": "airflow_provider_checkpoint.connectors.postgres.sink",
    "PostgresCdcSource": "airflow_provider_checkpoint.connectors.postgres.cdc",
}

__all__ = [
    "Channel",
    "Deduplicate",
    "DeltaSource",
    "DeltaTableSink",
    "DimensionEnrichment",
    "FileSource",
    "IntervalJoin",
    "KafkaSink",
    "KafkaSource",
    "PostgresCdcSource",
    "KeyedCoStateFunction",
    "KeyedAggregate",
    "KeyedProcess",
    "KeyedProcessFunction",
    "ListState",
    "MapState",
    "TTL",
    "ValueState",
    "KeyedStateFunction",
    "MalformedInputError",
    "Node",
    "ParquetTableSink",
    "PostgresTableSink",
    "PipelineDefinitionError",
    "PipelineGraph",
    "Sink",
    "Source",
    "StatefulOperator",
    "TooManyMalformedError",
    "Transform",
    "Union",
    "WindowAggregate",
    "session",
    "sliding",
    "tumbling",
]


def __getattr__(name: str) -> Any:
    if name in _CONNECTORS:
        import importlib

        return getattr(importlib.import_module(_CONNECTORS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
