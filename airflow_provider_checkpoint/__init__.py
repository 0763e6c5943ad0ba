"""Exactly-once, stateful, incremental Spark pipelines on Apache Airflow, with Flink's checkpoints.

Importing this package is cheap (no Spark, no Airflow): the Airflow-facing names are
loaded on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Channel": "airflow_provider_checkpoint.dataflow",
    "CheckpointedPipeline": "airflow_provider_checkpoint.pipeline",
    "Deduplicate": "airflow_provider_checkpoint.dataflow",
    "DeltaSource": "airflow_provider_checkpoint.dataflow",
    "DeltaTableSink": "airflow_provider_checkpoint.dataflow",
    "DimensionEnrichment": "airflow_provider_checkpoint.dataflow",
    "FileSource": "airflow_provider_checkpoint.dataflow",
    "IntervalJoin": "airflow_provider_checkpoint.dataflow",
    "KafkaSink": "airflow_provider_checkpoint.dataflow",
    "KafkaSource": "airflow_provider_checkpoint.dataflow",
    "KeyedCoStateFunction": "airflow_provider_checkpoint.dataflow",
    "KeyedAggregate": "airflow_provider_checkpoint.dataflow",
    "KeyedProcess": "airflow_provider_checkpoint.dataflow",
    "KeyedProcessFunction": "airflow_provider_checkpoint.dataflow",
    "ListState": "airflow_provider_checkpoint.dataflow",
    "MapState": "airflow_provider_checkpoint.dataflow",
    "TTL": "airflow_provider_checkpoint.dataflow",
    "ValueState": "airflow_provider_checkpoint.dataflow",
    "KeyedStateFunction": "airflow_provider_checkpoint.dataflow",
    "ParquetTableSink": "airflow_provider_checkpoint.dataflow",
    "PostgresTableSink": "airflow_provider_checkpoint.dataflow",
    "PostgresCdcSource": "airflow_provider_checkpoint.dataflow",
    "Transform": "airflow_provider_checkpoint.dataflow",
    "Union": "airflow_provider_checkpoint.dataflow",
    "WindowAggregate": "airflow_provider_checkpoint.dataflow",
    "session": "airflow_provider_checkpoint.dataflow",
    "sliding": "airflow_provider_checkpoint.dataflow",
    "tumbling": "airflow_provider_checkpoint.dataflow",
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
