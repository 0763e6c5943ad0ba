"""Schema evolution of a Delta table in a checkpoint's own commit (``schema_evolution="additive"``).

The step names the input columns the table lacks (:func:`added_columns`, nullable Delta fields); the commit
appends those the table still lacks to its schema in a ``metaData`` action of the same commit file as the
rows (:func:`grown_metadata`), so readers see the column and the rows together, or neither, and read the
earlier files' rows as null in it (the Delta protocol: a column absent from a data file reads as null).
Refused: a table with column mapping (its new fields would need ids and physical names), and a column
another writer added meanwhile with another type. No type is widened: that needs Delta's ``typeWidening``
table feature, which this writer does not write.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_provider_checkpoint.core.documents import Fields
from airflow_provider_checkpoint.exceptions import SinkSchemaError

_MAPPING = "delta.columnMapping.mode"


def added_columns(table_columns: dict[str, str], input_schema: Any) -> list[dict[str, Any]]:
    """The fields (Delta JSON) of ``input_schema`` (a delta-rs schema) that ``table_columns`` lacks, nullable."""
    fields = [json.loads(f.to_json()) for f in input_schema.fields if f.name not in table_columns]
    return [{**f, "nullable": True} for f in fields]


def read_added(c: Fields) -> list[dict[str, Any]]:
    """A committable's ``add_columns``: Delta fields, each with a name, a type and ``nullable`` true."""
    from deltalake.schema import Schema

    fields = c.items("add_columns", default=[])
    for f in fields:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or f.get("nullable") is not True:
            raise c.error("add_columns", "must be nullable Delta fields, each with a name and a type", f)
    if len({f["name"] for f in fields}) != len(fields):
        raise c.error("add_columns", "name a column twice")
    try:
        Schema.from_json(json.dumps({"type": "struct", "fields": fields}))
    except (ValueError, TypeError) as e:
        raise c.error("add_columns", f"are not Delta fields: {e}") from e
    return [dict(f) for f in fields]


def grown_metadata(table: str, metadata: dict[str, Any] | None, added: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The table's ``metaData`` with the ``added`` fields it lacks appended to its schema; ``None`` if it has
    them all. Refused (:class:`SinkSchemaError`) with column mapping, or for a column the table has with
    another type."""
    if not added:
        return None
    if metadata is None or not isinstance(metadata.get("schemaString"), str):
        raise SinkSchemaError(f"Delta table {table}: no schema in its log to add columns to")
    mapping = (metadata.get("configuration") or {}).get(_MAPPING, "none")
    if mapping != "none":
        raise SinkSchemaError(
            f"Delta table {table}: {_MAPPING}={mapping}; schema_evolution does not add columns to such a table "
            "(add them with Delta first, e.g. ALTER TABLE … ADD COLUMNS in Spark)"
        )
    schema = json.loads(metadata["schemaString"])
    present = {f["name"]: f for f in schema["fields"]}
    new = []
    for field in added:
        there = present.get(field["name"])
        if there is None:
            new.append(field)
        elif there.get("type") != field["type"]:
            raise SinkSchemaError(
                f"Delta table {table}: column {field['name']} was added since the checkpoint was staged with type "
                f"{json.dumps(there.get('type'))}, the staged rows have {json.dumps(field['type'])}"
            )
    if not new:
        return None
    grown = {**schema, "fields": [*schema["fields"], *new]}
    return {**metadata, "schemaString": json.dumps(grown, separators=(",", ":"))}
