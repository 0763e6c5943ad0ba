"""JSON values parsed by Arrow on the executors' Python workers, where that gives what Spark's ``from_json`` gives.

Spark's ``from_json`` costs about 6 µs of CPU per small record; Arrow's JSON reader parses a batch of
10,000 in milliseconds. A batch is parsed by Arrow only when the answer cannot differ from Spark's:

- the declared schema is flat, of ``STRING``, ``INT``, ``BIGINT`` (``LONG``), ``DOUBLE`` and ``BOOLEAN``
  fields with plain names, and the source passes no ``options`` to ``from_json``;
- every value of the batch without a flaw (:func:`~.reader.value_flaw`: a tombstone, an empty value,
  bytes that are not UTF-8; those rows stay null) starts with ``{``, ends with ``}`` and holds no line
  break, so Arrow's rows are the values, in order (a value holding two objects would make one row too
  many, and the batch is refused on the count);
- Arrow accepts every value under the schema. It refuses what Spark would take differently or call
  malformed: a number for a string field or text for a number, a fraction or an overflow for an integer,
  a key given twice, an invalid escape or surrogate, a control character in a string, trailing data.

Any other batch is left to Spark's ``from_json`` (the column is null), so a malformed record is judged by
Spark exactly as before. Spark is the oracle of the tests (``test_kafka_json_values.py``): on every value
Arrow accepts, the two give the same row.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

PARSED = "__parsed"
"""The column of the values Arrow parsed (a struct of the declared fields and the corrupt-record one), null
where Spark parses."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TYPES = {"string": "string", "int": "int32", "bigint": "int64", "double": "float64", "boolean": "bool_"}
"""Spark's simple type names Arrow parses as Spark does → the ``pyarrow`` type factory."""


def arrow_schema(fields: list[tuple[str, str]], corrupt: str) -> pa.Schema | None:
    """The Arrow schema for declared ``fields`` (name, Spark simple type name) and the ``corrupt``-record field,
    or ``None`` when a field's type or name is not one Arrow parses as Spark does."""
    import pyarrow as pa

    if not fields or any(t not in _TYPES or not _NAME.fullmatch(n) for n, t in fields):
        return None
    names = [n for n, _ in fields]
    if corrupt in names or len(set(names)) != len(names):
        return None
    return pa.schema([(n, getattr(pa, _TYPES[t])()) for n, t in fields] + [(corrupt, pa.string())])


def source_schema(format: str, schema: str | None, options: dict[str, str], corrupt: str) -> pa.Schema | None:
    """:func:`arrow_schema` for a source's ``format``, DDL ``schema`` and ``from_json`` ``options``: ``None``
    unless json without options."""
    from pyspark.sql.types import StructType

    if format != "json" or options or not schema:
        return None
    declared = StructType.fromDDL(schema)
    if not isinstance(declared, StructType):
        return None
    return arrow_schema([(f.name, f.dataType.simpleString()) for f in declared.fields], corrupt)


def struct_ddl(schema: pa.Schema) -> str:
    """The Spark DDL type of :data:`PARSED` for ``schema`` (from :func:`arrow_schema`)."""
    import pyarrow as pa

    spark = {getattr(pa, factory)(): name.upper() for name, factory in _TYPES.items()}
    return f"STRUCT<{', '.join(f'{f.name}: {spark[f.type]}' for f in schema)}>"


def parse(values: pa.Array, schema: pa.Schema, flaws: pa.Array) -> pa.Array:
    """The struct column :data:`PARSED` for binary ``values``: Arrow's rows for the values without a flaw
    (:func:`~.reader.value_flaw`; a flawed row stays null, for Spark), or all null when Arrow cannot give
    Spark's answer for every one of them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = pa.struct(list(schema))
    whole = pc.is_null(flaws)
    if whole.false_count == 0:
        return _parse_all(values, schema)
    positions = pc.subtract(pc.cumulative_sum(pc.cast(whole, pa.int64())), 1)
    parsed = _parse_all(values.filter(whole), schema)
    if parsed.null_count == len(parsed):
        return pa.nulls(len(values), kind)
    return parsed.take(pc.if_else(whole, positions, pa.scalar(None, pa.int64())))


def _parse_all(values: pa.Array, schema: pa.Schema) -> pa.Array:
    """:func:`parse` of flawless values: every row Arrow's, or all null."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    n, kind = len(values), pa.struct(list(schema))
    if not n or not pc.all(pc.and_(pc.starts_with(values, "{"), pc.ends_with(values, "}"))).as_py():
        return pa.nulls(n, kind)
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), values), b"\n")[0].as_buffer()
    text = joined.to_pybytes()
    if text.count(b"\n") != n - 1 or b"\r" in text:
        return pa.nulls(n, kind)
    declared = pa.schema(list(schema)[:-1])
    try:
        table = pj.read_json(
            pa.py_buffer(text),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(text) + 1),
            parse_options=pj.ParseOptions(explicit_schema=declared, unexpected_field_behavior="ignore"),
        )
    except pa.ArrowInvalid:
        return pa.nulls(n, kind)
    if table.num_rows != n or any(_negative_zero(table.column(f.name)) for f in declared if f.type == pa.float64()):
        return pa.nulls(n, kind)
    columns = [table.column(f.name).combine_chunks() for f in declared] + [pa.nulls(n, pa.string())]
    return pa.StructArray.from_arrays(columns, fields=list(schema))


def _negative_zero(column: pa.ChunkedArray) -> bool:
    """Whether ``column`` holds a -0.0: Spark reads the integer ``-0`` as 0.0, Arrow as -0.0 (the fraction
    ``-0.0`` is -0.0 in both); such a batch is left to Spark."""
    import numpy as np
    import pyarrow.compute as pc

    zeros = column.filter(pc.equal(column, 0.0)).to_numpy()
    return bool(np.signbit(zeros).any())
