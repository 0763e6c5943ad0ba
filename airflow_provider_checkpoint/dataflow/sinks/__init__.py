"""Transactional sinks: the shared writer/committer machinery (:mod:`.base`) and the tables built on it."""

from airflow_provider_checkpoint.dataflow.sinks.base import TableDirectorySink, TransactionalSink
from airflow_provider_checkpoint.dataflow.sinks.delta_table import DeltaTableSink
from airflow_provider_checkpoint.dataflow.sinks.parquet_table import (
    FORMAT,
    ParquetTableSink,
    check_table_committables,
    table_file_pattern,
)
from airflow_provider_checkpoint.dataflow.sinks.postgres_table import PostgresTableSink

__all__ = [
    "FORMAT",
    "DeltaTableSink",
    "ParquetTableSink",
    "PostgresTableSink",
    "TableDirectorySink",
    "TransactionalSink",
    "check_table_committables",
    "table_file_pattern",
]
