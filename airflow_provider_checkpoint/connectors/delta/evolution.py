"""Schema evolution of a Delta table in a checkpoint's own commit (``schema_evolution="additive"``).

The step names the input columns the table lacks (:func:`added_columns`, nullable Delta fields); the commit
appends those the table still lacks to its schema in a ``metaData`` action of the same commit file as the
rows (:func:`grown_metadata`), so readers see the column and the rows together, or neither, and read the
earlier files' rows as null in it (the Delta protocol: a column absent from a data file reads as null).
Refused: a table with column mapping (its new fields would need ids and physical names), and a column
another writer added meanwhile with another type. No type is widened: that needs Delta's ``typeWidening``
table feature, which this writer does not write.

An input lacking a column of the table is written with it null when the column is nullable (:func:`missing`,
:mod:`~airflow_provider_checkpoint.connectors.base.missing_columns`); refused with column mapping (a data
file's physical column names differ), for a column with a default or a generation expression (Delta's writers
compute those, not null).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from airflow_provider_checkpoint.connectors.base.missing_columns import Missing, TableFile, missing_fields
from airflow_provider_checkpoint.connectors.delta import deletion_vectors
from airflow_provider_checkpoint.core.documents import Fields
from airflow_provider_checkpoint.exceptions import SinkSchemaError

if TYPE_CHECKING:
    import fsspec

    from airflow_provider_checkpoint.connectors.delta.log import DataFile

_MAPPING = "delta.columnMapping.mode"
_COMPUTED = ("CURRENT_DEFAULT", "delta.generationExpression")
"""Column metadata keys of a value Delta's writers compute for a row that does not give it."""


def added_columns(table_columns: dict[str, str], input_schema: Any) -> list[dict[str, Any]]:
    """The fields (Delta JSON) of ``input_schema`` (a delta-rs schema) that ``table_columns`` lacks, nullable."""
    fields = [json.loads(f.to_json()) for f in input_schema.fields if f.name not in table_columns]
    return [{**f, "nullable": True} for f in fields]


def read_added(c: Fields) -> list[dict[str, Any]]:
    """A committable's ``add_columns``: Delta fields, each with a name, a type and ``nullable`` true (delta-rs
    parses them, imported only when there are any)."""
    fields = c.items("add_columns", default=[])
    if not fields:
        return []
    for f in fields:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or f.get("nullable") is not True:
            raise c.error("add_columns", "must be nullable Delta fields, each with a name and a type", f)
    if len({f["name"] for f in fields}) != len(fields):
        raise c.error("add_columns", "name a column twice")
    from deltalake.schema import Schema

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


def missing(table: str, schema: str, configuration: dict[str, str], given: Iterable[str]) -> Missing:
    """The columns of the table (``schema``: Delta's JSON, which is Spark's) the input's columns ``given``
    lack, written null; refused (:class:`SinkSchemaError` naming the table and the columns) unless each is
    nullable, without a default or generation expression, in a table without column mapping."""
    from pyspark.sql.types import StructType

    stored = StructType.fromJson(json.loads(schema))
    fields = missing_fields(table, stored, given)
    mapping = configuration.get(_MAPPING, "none")
    computed = [f.name for f in fields if any(k in (f.metadata or {}) for k in _COMPUTED)]
    if fields and (mapping != "none" or computed):
        why = f"{_MAPPING}={mapping}" if mapping != "none" else f"Delta computes the value of {computed}"
        raise SinkSchemaError(
            f"{table}: the input lacks column(s) {[f.name for f in fields]} and {why}: schema_evolution writes "
            "no null for them; give them in the input"
        )
    return Missing(stored.fieldNames(), fields)


def table_file(fs: fsspec.AbstractFileSystem, root: str, file: DataFile) -> TableFile:
    """A live data file of the table at ``root``, its deletion vector read only if the file is read."""
    path, dv, what = f"{root}/{file.path}", file.deletion_vector, f"deletion vector of {file.path}"
    deleted = None if dv is None else lambda: deletion_vectors.read_positions(fs, root, dv, what)
    return TableFile(path, file.size or fs.size(path), deleted)
