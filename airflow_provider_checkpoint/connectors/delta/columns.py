"""Delta column types of flat schemas without delta-rs: a step whose table exists and whose input has only
primitive columns checks them without importing ``deltalake`` (≈ 0.05–0.1 s of a fresh task process).

Each function answers only for the types it maps exactly as delta-rs does (``Schema.from_arrow``,
``Schema.from_json`` then ``to_json``); for anything else it returns ``None`` and the caller asks delta-rs.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

PRIMITIVE = frozenset(
    ["byte", "short", "integer", "long", "float", "double", "boolean", "string", "binary", "date", "timestamp"]
    + ["timestamp_ntz"]
)
"""Delta primitive type names delta-rs writes as they are."""
_DECIMAL = re.compile(r"^decimal\(([1-9]\d?),(\d\d?)\)$")
_FIELD_KEYS = frozenset(["name", "type", "nullable", "metadata"])


def _decimal(p: int, s: int) -> str | None:
    return f"decimal({p},{s})" if 1 <= p <= 38 and 0 <= s <= p else None


def arrow_columns(schema: pa.Schema) -> dict[str, str] | None:
    """Column name → Delta type of an Arrow schema of primitive columns, as delta-rs maps them; ``None`` if a
    column's type is another (nested, unsigned, a time zone but UTC, a unit but microseconds, …) or a name repeats."""
    import pyarrow as pa

    simple = {
        pa.int8(): "byte", pa.int16(): "short", pa.int32(): "integer", pa.int64(): "long", pa.float32(): "float",
        pa.float64(): "double", pa.bool_(): "boolean", pa.string(): "string", pa.large_string(): "string",
        pa.binary(): "binary", pa.large_binary(): "binary", pa.date32(): "date",
        pa.timestamp("us", "UTC"): "timestamp", pa.timestamp("us"): "timestamp_ntz",
    }  # fmt: skip
    columns: dict[str, str] = {}
    for field in schema:
        if pa.types.is_decimal128(field.type):
            kind = _decimal(field.type.precision, field.type.scale)
        else:
            kind = simple.get(field.type)
        if kind is None or field.name in columns:
            return None
        columns[field.name] = kind
    return columns


def json_columns(text: str) -> dict[str, str] | None:
    """Column name → Delta type of a table's ``schemaString`` whose every field is of a primitive type, as delta-rs
    reads and writes it back; ``None`` for anything else (a nested type, an unexpected key, a repeated name)."""
    try:
        schema = json.loads(text)
    except ValueError:
        return None
    if not isinstance(schema, dict) or schema.get("type") != "struct" or not isinstance(schema.get("fields"), list):
        return None
    columns: dict[str, str] = {}
    for field in schema["fields"]:
        if not isinstance(field, dict) or not set(field) <= _FIELD_KEYS or not isinstance(field.get("name"), str):
            return None
        kind, name = field.get("type"), field["name"]
        if not isinstance(kind, str) or name in columns or not isinstance(field.get("nullable", True), bool):
            return None
        if not isinstance(field.get("metadata", {}), dict):
            return None
        found = _DECIMAL.match(kind)
        kind = _decimal(int(found.group(1)), int(found.group(2))) if found else kind if kind in PRIMITIVE else None
        if kind is None:
            return None
        columns[name] = kind
    return columns


def delta_rs_columns(schema: Any) -> dict[str, str]:
    """Column name → Delta type of a delta-rs schema."""
    return {f.name: f.type.to_json().strip('"') for f in schema.fields}
