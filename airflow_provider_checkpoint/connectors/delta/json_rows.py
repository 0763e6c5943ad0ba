"""An Arrow table of a nested schema (structs, maps, lists) from JSON-like rows, without ``pa.array``.

``pa.array`` of Python objects (or of a numpy array) imports pandas the first time it runs in a process,
to check the values for pandas types: a quarter to half a second of a task that needs no pandas (a
finalize writing a Delta log checkpoint). Here the rows are read by Arrow's JSON reader instead, with maps
as lists of key/value entries (the reader reads no maps), then viewed as the schema's types.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa


def table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """``rows`` (column name → value, maps as JSON objects, absent or ``None``: null) as a table of ``schema``.

    A value of another type than its field's raises ``pa.ArrowInvalid``; a ``None`` in a required field is
    taken for a null below a null struct (the caller refuses one where it matters)."""
    import pyarrow as pa
    import pyarrow.json as pj

    lines = [
        json.dumps({name: _entries(value, schema.field(name).type) for name, value in row.items()}) for row in rows
    ]
    text = "\n".join(lines).encode()
    read = pj.read_json(
        io.BytesIO(text),
        read_options=pj.ReadOptions(block_size=len(text) + 1),  # one block, one chunk: a row never straddles two
        parse_options=pj.ParseOptions(
            explicit_schema=pa.schema([f.with_type(_as_read(f.type)).with_nullable(True) for f in schema]),
            unexpected_field_behavior="error",
        ),
    )
    return pa.Table.from_arrays([_viewed(read.column(f.name).combine_chunks(), f) for f in schema], schema=schema)


def _entries(value: Any, t: pa.DataType) -> Any:
    """``value`` with the JSON objects of ``t``'s maps as lists of key/value entries."""
    import pyarrow as pa

    if isinstance(value, dict) and pa.types.is_map(t):
        return [{"key": k, "value": v} for k, v in value.items()]
    if isinstance(value, dict) and pa.types.is_struct(t):
        return {k: _entries(v, t.field(k).type) if t.get_field_index(k) >= 0 else v for k, v in value.items()}
    return value


def _as_read(t: pa.DataType) -> pa.DataType:
    """``t`` as the JSON reader reads it: maps as lists of entries, every field nullable (the reader refuses
    a null in a required field of a struct that is null itself)."""
    import pyarrow as pa

    if pa.types.is_map(t):
        return pa.list_(pa.struct([t.key_field.with_nullable(True), t.item_field.with_nullable(True)]))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_as_read(f.type)).with_nullable(True) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_nullable(True))
    return t


def _viewed(array: pa.Array, field: pa.Field) -> pa.Array:
    """``array`` (read as :func:`_as_read` of ``field``'s type, offset 0) as that type, on the reader's
    buffers: lists of entries as maps, a required field without its validity (its nulls lie below null
    structs, which Parquet does not write)."""
    import pyarrow as pa

    t = field.type
    children: list[pa.Array] | None = None
    if pa.types.is_map(t):
        pairs = [array.values.field(0), array.values.field(1)]
        children = [pa.StructArray.from_arrays(pairs, fields=[t.key_field, t.item_field])]
    elif pa.types.is_struct(t):
        children = [_viewed(array.field(i), t.field(i)) for i in range(t.num_fields)]
    elif pa.types.is_list(t):
        children = [array.values.cast(t.value_type)]
    validity, nulls = (array.buffers()[0], array.null_count) if field.nullable else (None, 0)
    return pa.Array.from_buffers(t, len(array), [validity, *array.buffers()[1 : t.num_buffers]], nulls, 0, children)
