"""Building blocks of a checkpointed pipeline: sources, transforms, stateful operators, sinks."""

from airflow_provider_checkpoint.dataflow.graph import (
    Node,
    PipelineDefinitionError,
    PipelineGraph,
    Sink,
    Source,
    StatefulOperator,
    Transform,
)
from airflow_provider_checkpoint.dataflow.sinks import ParquetTableSink
from airflow_provider_checkpoint.dataflow.sources import FileSource, MalformedInputError
from airflow_provider_checkpoint.dataflow.stateful import KeyedAggregate, KeyedStateFunction

__all__ = [
    "FileSource",
    "KeyedAggregate",
    "KeyedStateFunction",
    "MalformedInputError",
    "Node",
    "ParquetTableSink",
    "PipelineDefinitionError",
    "PipelineGraph",
    "Sink",
    "Source",
    "StatefulOperator",
    "Transform",
]
