"""What a Delta sink checks its input against: the table's columns, partition columns, properties and schema,
from the ``metaData`` the log check replayed or from delta-rs."""

from __future__ import annotations

from typing import Any, NamedTuple

from airflow_provider_checkpoint.connectors.delta.columns import delta_rs_columns, json_columns
from airflow_provider_checkpoint.connectors.delta.log_checks import LogState


class TableLayout(NamedTuple):
    """What the writer checks its input against: the table's columns (name → Delta type), partition
    columns and properties."""

    columns: dict[str, str]
    partition_by: list[str]
    configuration: dict[str, str]
    schema: str
    """The table's schema (Delta's JSON, which is Spark's)."""


def logged_layout(state: LogState | None) -> TableLayout | None:
    """The layout of the table from the ``metaData`` the log check replayed; ``None`` when it did not
    replay one or it is not well-formed (delta-rs then reads the table, and refuses a damaged one)."""
    metadata = state.metadata if state is not None and state.replayed else None
    if metadata is None:
        return None
    text, partitions, config = (metadata.get(k) for k in ("schemaString", "partitionColumns", "configuration"))
    if not (isinstance(text, str) and isinstance(partitions, list) and isinstance(config, dict)):
        return None
    if not all(isinstance(p, str) for p in partitions) or not all(isinstance(v, str) for v in config.values()):
        return None
    columns = json_columns(text)  # flat columns without delta-rs
    if columns is None:
        from deltalake.schema import Schema

        try:
            columns = delta_rs_columns(Schema.from_json(text))
        except ValueError:  # delta-rs refuses the schema when it opens the table
            return None
    return TableLayout(columns, partitions, config, text)


def table_layout(table: Any) -> TableLayout:
    """The layout of a delta-rs ``DeltaTable``."""
    metadata, schema = table.metadata(), table.schema()
    return TableLayout(
        delta_rs_columns(schema), list(metadata.partition_columns), dict(metadata.configuration), schema.to_json()
    )
