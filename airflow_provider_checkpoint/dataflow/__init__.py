"""Building blocks of a checkpointed pipeline: sources, transforms, stateful operators, sinks."""

from airflow_provider_checkpoint.dataflow.delta_source import DeltaSource
from airflow_provider_checkpoint.dataflow.graph import (
    Channel,
    Node,
    PipelineGraph,
    Sink,
    Source,
    StatefulOperator,
    Transform,
    Union,
)
from airflow_provider_checkpoint.dataflow.multi_input import DimensionEnrichment, IntervalJoin, KeyedCoStateFunction
from airflow_provider_checkpoint.dataflow.sinks import DeltaTableSink, ParquetTableSink, PostgresTableSink
from airflow_provider_checkpoint.dataflow.sources import FileSource
from airflow_provider_checkpoint.dataflow.stateful import KeyedAggregate, KeyedStateFunction
from airflow_provider_checkpoint.exceptions import MalformedInputError, PipelineDefinitionError, TooManyMalformedError

__all__ = [
    "Channel",
    "DeltaSource",
    "DeltaTableSink",
    "DimensionEnrichment",
    "FileSource",
    "IntervalJoin",
    "KeyedCoStateFunction",
    "KeyedAggregate",
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
]
